"""compute_episodic_prefix_sum against the float64 reference, hand-computed values and edge cases."""

import pytest
import torch

import rl_triton
from tests import reference
from tests._helpers import (
    DTYPE_IDS,
    F32_TOL,
    SHAPES,
    case,
    case_inputs,
    check,
    check_case,
    env_shape,
    golden,
    pattern_mask,
    randn,
    to_flags,
)

FN = "compute_episodic_prefix_sum"
BOUNDARIES = ["ends_at", "starts_at"]


def make_case(
    shape,
    *,
    device="cpu",
    dtype=torch.float32,
    flag_dtype=torch.bool,
    p=0.15,
    dones="random",
    seed=True,
    boundary="ends_at",
):
    """dones: where the done flags sit (tests._helpers.pattern_mask's patterns, "random" with
    probability p); seed: with seed_values."""
    args = [randn(shape, dtype, device), to_flags(pattern_mask(shape, dones, p), flag_dtype, device)]
    kwargs = {"boundary": boundary}
    if seed:
        kwargs["seed_values"] = randn(env_shape(shape), dtype, device, scale=3.0)
    return args, kwargs


# The case table: every row on every backend path against the float64 reference (see test_gae.py).
# Rows have seed_values unless "noseed", and boundary="ends_at" unless "starts_at".
CASES = [
    # Shapes: T = 1 and 2, primes and odd sizes, one long row, 1-D calls; both boundaries.
    *(case(s, boundary=b) for b in BOUNDARIES for s in SHAPES),
    # Without seed_values, batched and 1-D.
    *(case(s, seed=False, boundary=b) for b in BOUNDARIES for s in ((3, 33), (33,))),
    # Where the dones sit: none, every step, t = 0, t = T-1 (random: the other rows).
    *(case((4, 16), dones=at, boundary=b) for b in BOUNDARIES for at in ("none", "all", "first", "last")),
    # Integer flag dtypes (bool is most rows', float flags the float dtype rows').
    *(case((3, 40), flag_dtype=f) for f in (torch.uint8, torch.int32, torch.int64)),
    # Float dtypes with flags of the same dtype.
    *(case(s, dtype=d, flag_dtype=d) for d in DTYPE_IDS for s in ((5, 63), (2, 300))),
    # One episode over 1000 steps: a plain cumulative sum (float32 accumulation).
    case((2, 1000), dones="none", seed=False),
    # Non-contiguous views of every input (they also equal the call on contiguous copies).
    case((5, 37), layout="stride"),
    case((5, 37), layout="transpose"),
]


@pytest.mark.parametrize("c", CASES)
def test_matches_reference(path, c):
    check_case(FN, c, *case_inputs(make_case, c, path.device))


def test_default_boundary_is_ends_at(path):
    args, kwargs = make_case((3, 30), device=path.device)
    del kwargs["boundary"]
    out = rl_triton.compute_episodic_prefix_sum(*args, **kwargs)
    torch.testing.assert_close(out, rl_triton.compute_episodic_prefix_sum(*args, **kwargs, boundary="ends_at"))
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_nonzero_flag_means_set(path, boundary):
    args, kwargs = make_case((3, 20), device=path.device, flag_dtype=torch.uint8, boundary=boundary)
    expected = rl_triton.compute_episodic_prefix_sum(*args, **kwargs)
    args[1] = args[1] * 200
    torch.testing.assert_close(rl_triton.compute_episodic_prefix_sum(*args, **kwargs), expected)
    args[1] = (args[1] > 0).float() * 0.125
    torch.testing.assert_close(rl_triton.compute_episodic_prefix_sum(*args, **kwargs), expected)


# ------------------------------------------------------------------------------------------
# Hand-computed values, inputs [1, 2, 4, 8], dones [0, 1, 0, 0].
# ends_at (reset the step after a done):   S = [1, 1+2, 4, 4+8]        = [1, 3, 4, 12]
# starts_at (reset at the flagged step):   S = [1, 2, 2+4, 6+8]        = [1, 2, 6, 14]
# seed 16, ends_at:                        S = [17, 19, 4, 12]
# seed 16, starts_at:                      S = [17, 2, 6, 14]
# seed 16, starts_at, dones [1, 0, 0, 0]:  S = [1, 3, 7, 15]   (the seed is dropped at t=0)
# seed 16, ends_at,   dones [1, 0, 0, 0]:  S = [17, 2, 6, 14]  (done_{-1} = 0 keeps it)
def _golden(fn, device):
    def f(x):
        return torch.tensor(x, dtype=torch.float32, device=device)

    x = f([[1.0, 2.0, 4.0, 8.0]] * 2)
    dones = f([[0, 1, 0, 0], [1, 0, 0, 0]]).bool()
    golden(fn(x[0], dones[0]), [1.0, 3.0, 4.0, 12.0])
    golden(fn(x[0], dones[0], boundary="starts_at"), [1.0, 2.0, 6.0, 14.0])
    seed = f([16.0, 16.0])
    golden(fn(x, dones, boundary="ends_at", seed_values=seed), [[17.0, 19.0, 4.0, 12.0], [17.0, 2.0, 6.0, 14.0]])
    golden(fn(x, dones, boundary="starts_at", seed_values=seed), [[17.0, 2.0, 6.0, 14.0], [1.0, 3.0, 7.0, 15.0]])


def test_golden_reference():
    _golden(reference.compute_episodic_prefix_sum, "cpu")


def test_golden(path):
    _golden(rl_triton.compute_episodic_prefix_sum, path.device)
