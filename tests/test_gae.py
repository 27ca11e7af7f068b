"""compute_gae against the float64 reference, hand-computed values and edge cases."""

import pytest
import torch

import rl_triton
from tests import reference
from tests._helpers import (
    DTYPE_IDS,
    SHAPES,
    boundary_values,
    case,
    case_inputs,
    check_case,
    env_shape,
    flag_masks,
    golden,
    randn,
    to_flags,
)

FN = "compute_gae"


def make_case(
    shape, *, device="cpu", dtype=torch.float32, flag_dtype=torch.bool, variant="trunc", p=0.1, dones="random"
):
    """Inputs for one call. variant: "trunc" (truncations + bootstrap_values), "boot" (bootstrap
    values, no truncateds), "last_value", "trunc-noboot" (truncateds, boot = 0), "plain"; dones:
    where the flags sit (tests._helpers.flag_masks)."""
    term, trunc = flag_masks(shape, dones, p)
    args = [randn(shape, dtype, device), randn(shape, dtype, device), to_flags(term, flag_dtype, device)]
    kwargs = {"gamma": 0.97, "lambda_": 0.9}
    if variant in ("trunc", "trunc-noboot"):
        args.append(to_flags(trunc, flag_dtype, device))
    if variant in ("trunc", "boot"):
        kwargs["bootstrap_values"] = boundary_values(
            trunc if variant == "trunc" else torch.zeros_like(trunc), dtype, device
        )
    if variant == "last_value":
        kwargs["last_value"] = randn(env_shape(shape), dtype, device)
    return args, kwargs


# The case table: every row on every backend path against the float64 reference (values, shape,
# dtype, device, inputs unmodified, outputs fresh and fully written: tests/conftest.py fills new
# allocations with NaN). Without a variant a row truncates with bootstrap values ("trunc").
CASES = [
    # Shapes: T = 1 and 2, primes and odd sizes, one long row, 1-D calls.
    *(case(s) for s in SHAPES),
    # The other bootstrap forms, batched and 1-D.
    *(case(s, v) for v in ("boot", "last_value", "trunc-noboot", "plain") for s in ((3, 33), (33,))),
    # Where the flags sit: none; terminations or truncations at every step, t = 0, t = T-1 or at random;
    # steps both terminated and truncated (no bootstrap: terminated; recursion cut: done).
    case((4, 16), dones="none"),
    *(case((4, 16), dones=f"{k}-{at}") for k in ("term", "trunc") for at in ("all", "first", "last", "random")),
    case((3, 30), dones="both", gamma=0.9, lambda_=0.7),
    # Integer flag dtypes (bool is most rows', float flags the float dtype rows').
    *(case((3, 40), flag_dtype=f, p=0.2) for f in (torch.uint8, torch.int32, torch.int64)),
    # Float dtypes with flags of the same dtype; rows of 300 and 1000 steps are the register-capped one-chunk
    # programs of 512 and 1024 steps on the GPU (kernels/plans.py: _SINGLE_CAPS, Plan.maxnreg).
    *(case(s, dtype=d, flag_dtype=d) for d in DTYPE_IDS for s in ((5, 63), (2, 300), (2, 1000))),
    case((4, 20), "last_value", dtype=torch.bfloat16),
    # Non-contiguous views of every input (they also equal the call on contiguous copies).
    case((5, 37), layout="stride"),
    case((5, 37), layout="transpose"),
    # gamma and lambda at their bounds.
    case((3, 50), gamma=0.0, lambda_=0.9),
    case((3, 50), gamma=1.0, lambda_=1.0),
    case((3, 50), gamma=0.9, lambda_=0.0),
    case((3, 50), gamma=0.5, lambda_=1.0),
]


@pytest.mark.parametrize("c", CASES)
def test_matches_reference(path, c):
    check_case(FN, c, *case_inputs(make_case, c, path.device))


def test_nonzero_flag_means_set(path):
    shape = (3, 20)
    args, kwargs = make_case(shape, device=path.device, flag_dtype=torch.uint8, p=0.2)
    expected = rl_triton.compute_gae(*args, **kwargs)
    args[2] = args[2] * 7  # 7 is as "set" as 1
    args[3] = args[3] * 255
    torch.testing.assert_close(rl_triton.compute_gae(*args, **kwargs), expected)
    args[2] = args[2].float() * 0.5
    args[3] = args[3].float() / 255 * 0.25
    torch.testing.assert_close(rl_triton.compute_gae(*args, **kwargs), expected)


def test_tensor_gamma_lambda(path):
    args, kwargs = make_case((3, 20), device=path.device)
    expected = rl_triton.compute_gae(*args, **kwargs)
    kwargs.update({k: torch.tensor(kwargs[k], dtype=torch.float64) for k in ("gamma", "lambda_")})
    torch.testing.assert_close(rl_triton.compute_gae(*args, **kwargs), expected, atol=0, rtol=0)


# ------------------------------------------------------------------------------------------
# Hand-computed values, gamma = lambda = 0.5 (gamma * lambda = 0.25), T = 3.
# rewards [1, 2, 3], values [0.5, 1, 2], bootstrap at the window end 4.
#
# A: no flags.       v_next = [1, 2, 4]; delta = [1 + .5 - .5, 2 + 1 - 1, 3 + 2 - 2] = [1, 2, 3]
#                    A2 = 3; A1 = 2 + .25*3 = 2.75; A0 = 1 + .25*2.75 = 1.6875
# B: term at t=1.    delta1 = 2 + 0 - 1 = 1, A1 = 1 (cut); A2 = 3; A0 = 1 + .25*1 = 1.25
# C: trunc at t=0, bootstrap 8 there.  delta0 = 1 + .5*8 - .5 = 4.5, A0 = 4.5 (cut); A1 = 2.75, A2 = 3
# D: term at t=2.    delta2 = 3 - 2 = 1 (bootstrap ignored); A1 = 2 + .25 = 2.25; A0 = 1 + .25*2.25 = 1.5625
GOLDEN_ARGS = dict(
    rewards=[[1.0, 2.0, 3.0]] * 4,
    values=[[0.5, 1.0, 2.0]] * 4,
    terminateds=[[0, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 1]],
    truncateds=[[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]],
    bootstrap_values=[[0.0, 0.0, 4.0], [0.0, 0.0, 4.0], [8.0, 0.0, 4.0], [0.0, 0.0, 4.0]],
)
GOLDEN = [[1.6875, 2.75, 3.0], [1.25, 1.0, 3.0], [4.5, 2.75, 3.0], [1.5625, 2.25, 1.0]]


def _golden(fn, device):
    t = {k: torch.tensor(v, dtype=torch.float32, device=device) for k, v in GOLDEN_ARGS.items()}
    golden(
        fn(
            t["rewards"],
            t["values"],
            t["terminateds"].bool(),
            t["truncateds"].bool(),
            gamma=0.5,
            lambda_=0.5,
            bootstrap_values=t["bootstrap_values"],
        ),
        GOLDEN,
    )
    # Env A as a 1-D call with last_value.
    out = fn(
        t["rewards"][0],
        t["values"][0],
        t["terminateds"][0],
        gamma=0.5,
        lambda_=0.5,
        last_value=torch.tensor(4.0, device=device),
    )
    assert out.shape == (3,)
    golden(out, GOLDEN[0])


def test_golden_reference():
    _golden(reference.compute_gae, "cpu")


def test_golden(path):
    _golden(rl_triton.compute_gae, path.device)
