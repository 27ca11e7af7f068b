"""compute_lambda_returns against the float64 reference, hand-computed values and edge cases."""

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
    boundary_values,
    check,
    check_non_contiguous,
    golden,
    pattern_mask,
    randn,
    term_trunc,
    to_flags,
)

FN = "compute_lambda_returns"


def make_case(shape, *, device="cpu", dtype=torch.float32, flag_dtype=torch.bool, variant="trunc", p=0.1):
    """variant: "trunc" (truncateds + bootstrap_values), "boot" (bootstrap at the window end only),
    "trunc-noboot" (truncateds, no bootstrap: X_t = 0 at truncated steps), "plain"."""
    term, trunc = term_trunc(shape, p, p)
    args = [randn(shape, dtype, device), randn(shape, dtype, device), to_flags(term, flag_dtype, device)]
    kwargs = {"gamma": 0.97, "lambda_": 0.9}
    if variant in ("trunc", "trunc-noboot"):
        args.append(to_flags(trunc, flag_dtype, device))
    if variant in ("trunc", "boot"):
        kwargs["bootstrap_values"] = boundary_values(
            trunc if variant == "trunc" else torch.zeros_like(trunc), dtype, device
        )
    return args, kwargs


@pytest.mark.parametrize("shape", SHAPES)
def test_shapes(path, shape):
    args, kwargs = make_case(shape, device=path.device)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("variant", ["trunc", "boot", "trunc-noboot", "plain"])
@pytest.mark.parametrize("shape", [pytest.param((3, 33), id="N3-T33"), pytest.param((33,), id="T33-1d")])
def test_variants(path, shape, variant):
    args, kwargs = make_case(shape, device=path.device, variant=variant)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("which", ["term", "trunc", "trunc-noboot"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_flag_patterns(path, pattern, which):
    shape = (4, 16)
    mask = pattern_mask(shape, pattern)
    zeros = torch.zeros(shape, dtype=torch.bool)
    term, trunc = (mask, zeros) if which == "term" else (zeros, mask)
    d = path.device
    kwargs = {} if which == "trunc-noboot" else {"bootstrap_values": boundary_values(trunc, device=d)}
    check(
        FN,
        randn(shape, device=d),
        randn(shape, device=d),
        to_flags(term, device=d),
        to_flags(trunc, device=d),
        gamma=0.95,
        lambda_=0.8,
        **kwargs,
        **F32_TOL,
    )


@pytest.mark.parametrize("flag_dtype", FLAG_DTYPES)
def test_flag_dtypes(path, flag_dtype):
    args, kwargs = make_case((3, 40), device=path.device, flag_dtype=flag_dtype, p=0.2)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("dtype, atol, rtol", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [pytest.param((5, 63), id="N5-T63"), pytest.param((2, 300), id="N2-T300")])
def test_float_dtypes(path, shape, dtype, atol, rtol):
    args, kwargs = make_case(shape, device=path.device, dtype=dtype, flag_dtype=dtype)
    check(FN, *args, **kwargs, atol=atol, rtol=rtol)


@pytest.mark.parametrize("how", ["stride", "transpose"])
def test_non_contiguous(path, how):
    check_non_contiguous(FN, *make_case((5, 37), device=path.device), how)


@pytest.mark.parametrize(
    "gamma, lambda_", [(0.0, 0.9), (1.0, 1.0), (0.9, 0.0), (0.9, 1.0)], ids=["g0", "g1-l1", "l0", "l1"]
)
def test_gamma_lambda_edges(path, gamma, lambda_):
    args, kwargs = make_case((3, 50), device=path.device)
    kwargs.update(gamma=gamma, lambda_=lambda_)
    check(FN, *args, **kwargs, **F32_TOL)


def test_term_and_trunc_both_set(path):
    shape = (3, 30)
    d = path.device
    term, trunc = torch.rand(shape) < 0.3, torch.rand(shape) < 0.3
    check(
        FN,
        randn(shape, device=d),
        randn(shape, device=d),
        to_flags(term, device=d),
        to_flags(trunc, device=d),
        gamma=0.9,
        lambda_=0.6,
        bootstrap_values=boundary_values(trunc, device=d),
        **F32_TOL,
    )


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
