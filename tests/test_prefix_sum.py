"""compute_episodic_prefix_sum against the float64 reference, hand-computed values and edge cases."""

import pytest
import torch

import rl_triton
from tests import reference
from tests._helpers import (
    F32_TOL,
    FLAG_DTYPES,
    FLOAT_DTYPES,
    PATTERNS,
    SHAPES,
    check,
    check_non_contiguous,
    env_shape,
    golden,
    pattern_mask,
    randn,
    to_flags,
)

FN = "compute_episodic_prefix_sum"
BOUNDARIES = ["ends_at", "starts_at"]


def make_case(
    shape, *, device="cpu", dtype=torch.float32, flag_dtype=torch.bool, pattern="random", seed=True, boundary="ends_at"
):
    args = [randn(shape, dtype, device), to_flags(pattern_mask(shape, pattern), flag_dtype, device)]
    kwargs = {"boundary": boundary}
    if seed:
        kwargs["seed_values"] = randn(env_shape(shape), dtype, device, scale=3.0)
    return args, kwargs


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_shapes(path, shape, boundary):
    args, kwargs = make_case(shape, device=path.device, boundary=boundary)
    check(FN, *args, **kwargs, **F32_TOL)


def test_default_boundary_is_ends_at(path):
    args, kwargs = make_case((3, 30), device=path.device)
    del kwargs["boundary"]
    out = rl_triton.compute_episodic_prefix_sum(*args, **kwargs)
    torch.testing.assert_close(out, rl_triton.compute_episodic_prefix_sum(*args, **kwargs, boundary="ends_at"))
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("seed", [True, False], ids=["seed", "noseed"])
@pytest.mark.parametrize("shape", [pytest.param((3, 33), id="N3-T33"), pytest.param((33,), id="T33-1d")])
def test_seed_values(path, shape, seed, boundary):
    args, kwargs = make_case(shape, device=path.device, seed=seed, boundary=boundary)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("boundary", BOUNDARIES)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_flag_patterns(path, pattern, boundary):
    args, kwargs = make_case((4, 16), device=path.device, pattern=pattern, boundary=boundary)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("flag_dtype", FLAG_DTYPES)
def test_flag_dtypes(path, flag_dtype):
    args, kwargs = make_case((3, 40), device=path.device, flag_dtype=flag_dtype)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_nonzero_flag_means_set(path, boundary):
    args, kwargs = make_case((3, 20), device=path.device, flag_dtype=torch.uint8, boundary=boundary)
    expected = rl_triton.compute_episodic_prefix_sum(*args, **kwargs)
    args[1] = args[1] * 200
    torch.testing.assert_close(rl_triton.compute_episodic_prefix_sum(*args, **kwargs), expected)
    args[1] = (args[1] > 0).float() * 0.125
    torch.testing.assert_close(rl_triton.compute_episodic_prefix_sum(*args, **kwargs), expected)


@pytest.mark.parametrize("dtype, atol, rtol", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [pytest.param((5, 63), id="N5-T63"), pytest.param((2, 300), id="N2-T300")])
def test_float_dtypes(path, shape, dtype, atol, rtol):
    args, kwargs = make_case(shape, device=path.device, dtype=dtype, flag_dtype=dtype)
    check(FN, *args, **kwargs, atol=atol, rtol=rtol)


def test_long_no_done(path):
    """One episode over ~1000 steps: a plain cumulative sum (float32 accumulation)."""
    args, kwargs = make_case((2, 1000), device=path.device, pattern="none", seed=False)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("how", ["stride", "transpose"])
def test_non_contiguous(path, how):
    check_non_contiguous(FN, *make_case((5, 37), device=path.device), how)


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
