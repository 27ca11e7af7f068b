"""compute_lambda_returns against the float64 reference, hand-computed values and edge cases."""

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
    flag_masks,
    golden,
    randn,
    to_flags,
)

FN = "compute_lambda_returns"


def make_case(
    shape, *, device="cpu", dtype=torch.float32, flag_dtype=torch.bool, variant="trunc", p=0.1, dones="random"
):
    """variant: "trunc" (truncateds + bootstrap_values), "boot" (bootstrap at the window end only),
    "trunc-noboot" (truncateds, no bootstrap: X_t = 0 at truncated steps), "plain"; dones: where the
    flags sit (tests._helpers.flag_masks)."""
    term, trunc = flag_masks(shape, dones, p)
    args = [randn(shape, dtype, device), randn(shape, dtype, device), to_flags(term, flag_dtype, device)]
    kwargs = {"gamma": 0.97, "lambda_": 0.9}
    if variant in ("trunc", "trunc-noboot"):
        args.append(to_flags(trunc, flag_dtype, device))
    if variant in ("trunc", "boot"):
        kwargs["bootstrap_values"] = boundary_values(
            trunc if variant == "trunc" else torch.zeros_like(trunc), dtype, device
        )
    return args, kwargs


# The case table: every row on every backend path against the float64 reference (see test_gae.py).
# Without a variant a row truncates with bootstrap values ("trunc").
CASES = [
    # Shapes: T = 1 and 2, primes and odd sizes, one long row, 1-D calls.
    *(case(s) for s in SHAPES),
    # The other bootstrap forms, batched and 1-D.
    *(case(s, v) for v in ("boot", "trunc-noboot", "plain") for s in ((3, 33), (33,))),
    # Where the flags sit: none; terminations or truncations (with bootstrap values, or without: X_t = 0
    # there) at every step, t = 0, t = T-1 or at random; steps both terminated and truncated.
    case((4, 16), dones="none"),
    *(case((4, 16), dones=f"{k}-{at}") for k in ("term", "trunc") for at in ("all", "first", "last", "random")),
    *(case((4, 16), "trunc-noboot", dones=f"trunc-{at}") for at in ("all", "first", "last", "random")),
    case((3, 30), dones="both", gamma=0.9, lambda_=0.6),
    # Integer flag dtypes (bool is most rows', float flags the float dtype rows').
    *(case((3, 40), flag_dtype=f, p=0.2) for f in (torch.uint8, torch.int32, torch.int64)),
    # Float dtypes with flags of the same dtype.
    *(case(s, dtype=d, flag_dtype=d) for d in DTYPE_IDS for s in ((5, 63), (2, 300))),
    # Non-contiguous views of every input (they also equal the call on contiguous copies).
    case((5, 37), layout="stride"),
    case((5, 37), layout="transpose"),
    # gamma and lambda at their bounds.
    case((3, 50), gamma=0.0, lambda_=0.9),
    case((3, 50), gamma=1.0, lambda_=1.0),
    case((3, 50), gamma=0.9, lambda_=0.0),
    case((3, 50), gamma=0.9, lambda_=1.0),
]


@pytest.mark.parametrize("c", CASES)
def test_matches_reference(path, c):
    check_case(FN, c, *case_inputs(make_case, c, path.device))


# ------------------------------------------------------------------------------------------
# Hand-computed values, gamma = lambda = 0.5, rewards [1, 2, 4], next_values [2, 4, 8].
# A: no flags, no bootstrap (boot = 0):
#    X2 = .5*8 + .5*0 = 4, G2 = 4 + .5*4 = 6
#    X1 = .5*4 + .5*G2 = 5, G1 = 2 + 2.5 = 4.5
#    X0 = .5*2 + .5*G1 = 3.25, G0 = 1 + 1.625 = 2.625
# B: bootstrap 8 at t=2:  X2 = .5*8 + .5*8 = 8, G2 = 8; X1 = 2 + 4 = 6, G1 = 5; X0 = 1 + 2.5, G0 = 2.75
# C: trunc at t=1, bootstrap [0, 2, 8]:  G2 = 8; X1 = 2 (boot), G1 = 3; X0 = 1 + 1.5, G0 = 2.25
# D: trunc at t=1, no bootstrap (X1 = boot = 0):  G2 = 6 as A; G1 = 2; X0 = 1 + 1, G0 = 2
# E: term at t=0, no bootstrap:  G0 = 1; G1, G2 as A
GOLDEN_BOOT = [[2.625, 4.5, 6.0], [2.75, 5.0, 8.0], [2.25, 3.0, 8.0]]
GOLDEN_NOBOOT = [[2.625, 4.5, 6.0], [2.0, 2.0, 6.0], [1.0, 4.5, 6.0]]


def _golden(fn, device):
    def f(x):
        return torch.tensor(x, dtype=torch.float32, device=device)

    rewards = f([[1.0, 2.0, 4.0]] * 3)
    next_values = f([[2.0, 4.0, 8.0]] * 3)
    zeros = f([[0, 0, 0]] * 3).bool()
    trunc = f([[0, 0, 0], [0, 0, 0], [0, 1, 0]]).bool()
    boot = f([[0, 0, 0], [0, 0, 8], [0, 2, 8]])
    out = fn(rewards, next_values, zeros, trunc, gamma=0.5, lambda_=0.5, bootstrap_values=boot)
    golden(out, GOLDEN_BOOT)
    term = f([[0, 0, 0], [0, 0, 0], [1, 0, 0]]).bool()
    trunc = f([[0, 0, 0], [0, 1, 0], [0, 0, 0]]).bool()
    golden(fn(rewards, next_values, term, trunc, gamma=0.5, lambda_=0.5), GOLDEN_NOBOOT)
    out = fn(rewards[0], next_values[0], zeros[0], gamma=0.5, lambda_=0.5)
    assert out.shape == (3,)
    golden(out, GOLDEN_NOBOOT[0])


def test_golden_reference():
    _golden(reference.compute_lambda_returns, "cpu")


def test_golden(path):
    _golden(rl_triton.compute_lambda_returns, path.device)
