"""compute_eligibility_traces against the float64 reference, hand-computed values and edge cases."""

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

FN = "compute_eligibility_traces"


def make_case(shape, *, device="cpu", dtype=torch.float32, flag_dtype=torch.bool, pattern="random", seed=True):
    args = [randn(shape, dtype, device), to_flags(pattern_mask(shape, pattern), flag_dtype, device)]
    kwargs = {"gamma": 0.97, "lambda_": 0.9}
    if seed:
        kwargs["seed_values"] = randn(env_shape(shape), dtype, device, scale=3.0)
    return args, kwargs


@pytest.mark.parametrize("shape", SHAPES)
def test_shapes(path, shape):
    args, kwargs = make_case(shape, device=path.device)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("seed", [True, False], ids=["seed", "noseed"])
@pytest.mark.parametrize("shape", [pytest.param((3, 33), id="N3-T33"), pytest.param((33,), id="T33-1d")])
def test_seed_values(path, shape, seed):
    args, kwargs = make_case(shape, device=path.device, seed=seed)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_flag_patterns(path, pattern):
    args, kwargs = make_case((4, 16), device=path.device, pattern=pattern)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("flag_dtype", FLAG_DTYPES)
def test_flag_dtypes(path, flag_dtype):
    args, kwargs = make_case((3, 40), device=path.device, flag_dtype=flag_dtype)
    check(FN, *args, **kwargs, **F32_TOL)


def test_nonzero_flag_means_set(path):
    args, kwargs = make_case((3, 20), device=path.device, flag_dtype=torch.uint8)
    expected = rl_triton.compute_eligibility_traces(*args, **kwargs)
    args[1] = args[1] * 9
    torch.testing.assert_close(rl_triton.compute_eligibility_traces(*args, **kwargs), expected)
    args[1] = (args[1] > 0).float() * -0.5
    torch.testing.assert_close(rl_triton.compute_eligibility_traces(*args, **kwargs), expected)


@pytest.mark.parametrize("dtype, atol, rtol", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [pytest.param((5, 63), id="N5-T63"), pytest.param((2, 300), id="N2-T300")])
def test_float_dtypes(path, shape, dtype, atol, rtol):
    args, kwargs = make_case(shape, device=path.device, dtype=dtype, flag_dtype=dtype)
    check(FN, *args, **kwargs, atol=atol, rtol=rtol)


@pytest.mark.parametrize("how", ["stride", "transpose"])
def test_non_contiguous(path, how):
    check_non_contiguous(FN, *make_case((5, 37), device=path.device), how)


@pytest.mark.parametrize("gamma, lambda_", [(0.0, 0.9), (1.0, 1.0), (0.9, 0.0)], ids=["g0", "g1-l1", "l0"])
def test_gamma_lambda_edges(path, gamma, lambda_):
    args, kwargs = make_case((3, 50), device=path.device)
    kwargs.update(gamma=gamma, lambda_=lambda_)
    check(FN, *args, **kwargs, **F32_TOL)


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
