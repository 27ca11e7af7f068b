"""compute_eligibility_traces against the float64 reference, hand-computed values and edge cases."""

import pytest
import torch

import rl_triton
from tests import reference
from tests._helpers import (
    DTYPE_IDS,
    SHAPES,
    case,
    case_inputs,
    check_case,
    env_shape,
    golden,
    pattern_mask,
    randn,
    to_flags,
)

FN = "compute_eligibility_traces"


def make_case(shape, *, device="cpu", dtype=torch.float32, flag_dtype=torch.bool, p=0.15, dones="random", seed=True):
    """dones: where the done flags sit (tests._helpers.pattern_mask's patterns, "random" with
    probability p); seed: with seed_values."""
    args = [randn(shape, dtype, device), to_flags(pattern_mask(shape, dones, p), flag_dtype, device)]
    kwargs = {"gamma": 0.97, "lambda_": 0.9}
    if seed:
        kwargs["seed_values"] = randn(env_shape(shape), dtype, device, scale=3.0)
    return args, kwargs


# The case table: every row on every backend path against the float64 reference (see test_gae.py).
# Rows have seed_values unless "noseed".
CASES = [
    # Shapes: T = 1 and 2, primes and odd sizes, one long row, 1-D calls.
    *(case(s) for s in SHAPES),
    # Without seed_values, batched and 1-D.
    *(case(s, seed=False) for s in ((3, 33), (33,))),
    # Where the dones sit: none, every step, t = 0, t = T-1 (random: the other rows).
    *(case((4, 16), dones=at) for at in ("none", "all", "first", "last")),
    # Integer flag dtypes (bool is most rows', float flags the float dtype rows').
    *(case((3, 40), flag_dtype=f) for f in (torch.uint8, torch.int32, torch.int64)),
    # Float dtypes with flags of the same dtype.
    *(case(s, dtype=d, flag_dtype=d) for d in DTYPE_IDS for s in ((5, 63), (2, 300))),
    # Non-contiguous views of every input (they also equal the call on contiguous copies).
    case((5, 37), layout="stride"),
    case((5, 37), layout="transpose"),
    # gamma and lambda at their bounds.
    case((3, 50), gamma=0.0, lambda_=0.9),
    case((3, 50), gamma=1.0, lambda_=1.0),
    case((3, 50), gamma=0.9, lambda_=0.0),
]


@pytest.mark.parametrize("c", CASES)
def test_matches_reference(path, c):
    check_case(FN, c, *case_inputs(make_case, c, path.device))


def test_nonzero_flag_means_set(path):
    args, kwargs = make_case((3, 20), device=path.device, flag_dtype=torch.uint8)
    expected = rl_triton.compute_eligibility_traces(*args, **kwargs)
    args[1] = args[1] * 9
    torch.testing.assert_close(rl_triton.compute_eligibility_traces(*args, **kwargs), expected)
    args[1] = (args[1] > 0).float() * -0.5
    torch.testing.assert_close(rl_triton.compute_eligibility_traces(*args, **kwargs), expected)


# ------------------------------------------------------------------------------------------
# Hand-computed values, gamma = lambda = 0.5 (decay .25), gradients [1, 2, 4], dones [0, 1, 0].
# seed 8:   e0 = 1 + .25*8 = 3; e1 = 2 + .25*3 = 2.75; e2 = 4 (done at t=1 cuts the trace)
# no seed:  e0 = 1;             e1 = 2 + .25*1 = 2.25; e2 = 4
GOLDEN = [[3.0, 2.75, 4.0], [1.0, 2.25, 4.0]]


def _golden(fn, device):
    def f(x):
        return torch.tensor(x, dtype=torch.float32, device=device)

    g = f([[1.0, 2.0, 4.0]] * 2)
    dones = f([[0, 1, 0]] * 2).bool()
    golden(fn(g, dones, gamma=0.5, lambda_=0.5, seed_values=f([8.0, 0.0])), GOLDEN)
    out = fn(g[1], dones[1], gamma=0.5, lambda_=0.5)
    assert out.shape == (3,)
    golden(out, GOLDEN[1])
    golden(fn(g[0], dones[0], gamma=0.5, lambda_=0.5, seed_values=f(8.0)), GOLDEN[0])


def test_golden_reference():
    _golden(reference.compute_eligibility_traces, "cpu")


def test_golden(path):
    _golden(rl_triton.compute_eligibility_traces, path.device)
