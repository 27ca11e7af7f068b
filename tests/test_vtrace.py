"""compute_vtrace against the float64 reference, hand-computed values and edge cases."""

import math

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
    equal_results,
    flag_masks,
    golden,
    randn,
    to_flags,
)

FN = "compute_vtrace"


def make_case(
    shape,
    *,
    device="cpu",
    dtype=torch.float32,
    flag_dtype=torch.bool,
    variant="trunc",
    p=0.1,
    rho_bar=1.0,
    c_bar=1.0,
    dones="random",
):
    """Inputs for one call; variant as in test_gae ("trunc", "boot", "last_value", "trunc-noboot",
    "plain"), dones: where the flags sit (tests._helpers.flag_masks). Log-prob differences of
    ~N(0, 0.7) put ratios on both sides of the clipping levels."""
    term, trunc = flag_masks(shape, dones, p)
    log_pi_b = randn(shape, dtype, device)
    log_pi_t = (log_pi_b.double().cpu() + torch.randn(shape, dtype=torch.float64) * 0.7).to(dtype).to(device)
    args = [
        log_pi_t,
        log_pi_b,
        randn(shape, dtype, device),  # values
        randn(shape, dtype, device),  # rewards
        to_flags(term, flag_dtype, device),
    ]
    kwargs = {"gamma": 0.97, "rho_bar": rho_bar, "c_bar": c_bar}
    if variant in ("trunc", "trunc-noboot"):
        args.append(to_flags(trunc, flag_dtype, device))
    if variant in ("trunc", "boot"):
        kwargs["bootstrap_values"] = boundary_values(
            trunc if variant == "trunc" else torch.zeros_like(trunc), dtype, device
        )
    if variant == "last_value":
        kwargs["last_value"] = randn(env_shape(shape), dtype, device)
    return args, kwargs


# The case table: every row on every backend path against the float64 reference (see test_gae.py).
# Without a variant a row truncates with bootstrap values ("trunc"); rho_bar = c_bar = 1 unless given.
CASES = [
    # Shapes: T = 1 and 2, primes and odd sizes, one long row, 1-D calls.
    *(case(s) for s in SHAPES),
    # The other bootstrap forms, batched and 1-D.
    *(case(s, v) for v in ("boot", "last_value", "trunc-noboot", "plain") for s in ((3, 33), (33,))),
    # Clipping levels: rho_bar above 1, both below 1, unclipped, traces cut (c_bar = 0).
    case((3, 40), rho_bar=2.0, c_bar=1.0),
    case((3, 40), rho_bar=0.5, c_bar=0.8),
    case((3, 40), rho_bar=math.inf, c_bar=math.inf),
    case((3, 40), rho_bar=1.0, c_bar=0.0),
    # Where the flags sit: none; terminations or truncations at every step, t = 0, t = T-1 or at random;
    # steps both terminated and truncated.
    case((4, 16), dones="none"),
    *(case((4, 16), dones=f"{k}-{at}") for k in ("term", "trunc") for at in ("all", "first", "last", "random")),
    case((3, 30), dones="both"),
    # Integer flag dtypes (bool is most rows', float flags the float dtype rows').
    *(case((3, 40), flag_dtype=f, p=0.2) for f in (torch.uint8, torch.int32, torch.int64)),
    # Float dtypes with flags of the same dtype.
    *(case(s, dtype=d, flag_dtype=d, rho_bar=1.5) for d in DTYPE_IDS for s in ((5, 63), (2, 300))),
    # Non-contiguous views of every input (they also equal the call on contiguous copies).
    case((5, 37), layout="stride"),
    case((5, 37), layout="transpose"),
    # gamma at its bounds.
    case((3, 50), gamma=0.0),
    case((3, 50), gamma=1.0),
]


@pytest.mark.parametrize("c", CASES)
def test_matches_reference(path, c):
    check_case(FN, c, *case_inputs(make_case, c, path.device))


def test_tensor_scalars(path):
    args, kwargs = make_case((3, 20), device=path.device, rho_bar=1.5, c_bar=0.9)
    expected = rl_triton.compute_vtrace(*args, **kwargs)
    kwargs.update({k: torch.tensor(kwargs[k], dtype=torch.float64) for k in ("gamma", "rho_bar", "c_bar")})
    equal_results(rl_triton.compute_vtrace(*args, **kwargs), expected)


# ------------------------------------------------------------------------------------------
# Hand-computed values, gamma = 0.5, rho_bar = c_bar = 1, T = 3.
# rewards [1, 2, 3], values [0.5, 1, 2]; log_pi_behavior = 0, log_pi_target = log [0.5, 2, 1]
# so ratio = [0.5, 2, 1] and rho = c = [0.5, 1, 1].
#
# A: no flags, bootstrap 4 at t=2.  v_next = [1, 2, 4]
#    delta2 = 1*(3 + 2 - 2) = 3      D2 = 3                        vs2 = 5
#    delta1 = 1*(2 + 1 - 1) = 2      D1 = 2 + .5*1*3 = 3.5         vs1 = 4.5
#    delta0 = .5*(1 + .5 - .5) = .5  D0 = .5 + .5*.5*3.5 = 1.375   vs0 = 1.875
#    adv0 = .5*(1 + .5*vs1 - .5) = 1.375; adv1 = 2 + .5*vs2 - 1 = 3.5; adv2 = 3 + .5*4 - 2 = 3
# B: trunc at t=1 with bootstrap 6 there.  v_next = [1, 6, 4]
#    D2 = 3, vs2 = 5; delta1 = 2 + 3 - 1 = 4, D1 = 4 (cut), vs1 = 5; D0 = .5 + .25*4 = 1.5, vs0 = 2
#    adv0 = .5*(1 + .5*vs1 - .5) = 1.5; adv1 = 2 + .5*6 - 1 = 4 (true continuation); adv2 = 3
GOLDEN_VS = [[1.875, 4.5, 5.0], [2.0, 5.0, 5.0]]
GOLDEN_ADV = [[1.375, 3.5, 3.0], [1.5, 4.0, 3.0]]


def _golden(fn, device):
    def f(x):
        return torch.tensor(x, dtype=torch.float32, device=device)

    log_pi_t = f([[math.log(0.5), math.log(2.0), 0.0]] * 2)
    log_pi_b = f([[0.0, 0.0, 0.0]] * 2)
    values = f([[0.5, 1.0, 2.0]] * 2)
    rewards = f([[1.0, 2.0, 3.0]] * 2)
    term = f([[0, 0, 0]] * 2).bool()
    trunc = f([[0, 0, 0], [0, 1, 0]]).bool()
    boot = f([[0, 0, 4], [0, 6, 4]])
    out = fn(log_pi_t, log_pi_b, values, rewards, term, trunc, gamma=0.5, bootstrap_values=boot)
    golden(out, (GOLDEN_VS, GOLDEN_ADV))
    # Env A as a 1-D call with last_value.
    out = fn(log_pi_t[0], log_pi_b[0], values[0], rewards[0], term[0], gamma=0.5, last_value=f(4.0))
    assert out[0].shape == (3,) and out[1].shape == (3,)
    golden(out, (GOLDEN_VS[0], GOLDEN_ADV[0]))


def test_golden_reference():
    _golden(reference.compute_vtrace, "cpu")


def test_golden(path):
    _golden(rl_triton.compute_vtrace, path.device)
