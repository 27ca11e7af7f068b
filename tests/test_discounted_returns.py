"""compute_discounted_returns against the float64 reference, hand-computed values and edge cases."""

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

FN = "compute_discounted_returns"


def make_case(shape, *, device="cpu", dtype=torch.float32, flag_dtype=torch.bool, variant="trunc", p=0.1):
    """variant: "trunc" (truncateds + bootstrap_values), "boot" (bootstrap at the window end only),
    "trunc-noboot" (truncateds, boot = 0), "plain"."""
    term, trunc = term_trunc(shape, p, p)
    args = [randn(shape, dtype, device), to_flags(term, flag_dtype, device)]
    kwargs = {"gamma": 0.97}
    if variant in ("trunc", "trunc-noboot"):
        args.append(to_flags(trunc, flag_dtype, device))
    if variant in ("trunc", "boot"):
        kwargs["bootstrap_values"] = boundary_values(
            trunc if variant == "trunc" else torch.zeros_like(trunc), dtype, device, scale=5.0
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


@pytest.mark.parametrize("which", ["term", "trunc"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_flag_patterns(path, pattern, which):
    shape = (4, 16)
    mask = pattern_mask(shape, pattern)
    zeros = torch.zeros(shape, dtype=torch.bool)
    term, trunc = (mask, zeros) if which == "term" else (zeros, mask)
    d = path.device
    check(
        FN,
        randn(shape, device=d),
        to_flags(term, device=d),
        to_flags(trunc, device=d),
        gamma=0.95,
        bootstrap_values=boundary_values(trunc, device=d),
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


def test_long_undiscounted(path):
    """gamma = 1, no dones: plain suffix sums over ~1000 steps (float32 accumulation)."""
    shape = (2, 1000)
    d = path.device
    rewards = randn(shape, device=d)
    zeros = torch.zeros(shape, dtype=torch.bool, device=d)
    check(FN, rewards, zeros, gamma=1.0, **F32_TOL)


@pytest.mark.parametrize("how", ["stride", "transpose"])
def test_non_contiguous(path, how):
    check_non_contiguous(FN, *make_case((5, 37), device=path.device), how)


@pytest.mark.parametrize("gamma", [0.0, 1.0], ids=["g0", "g1"])
def test_gamma_edges(path, gamma):
    args, kwargs = make_case((3, 50), device=path.device)
    kwargs["gamma"] = gamma
    check(FN, *args, **kwargs, **F32_TOL)


def test_term_and_trunc_both_set(path):
    shape = (3, 30)
    d = path.device
    term, trunc = torch.rand(shape) < 0.3, torch.rand(shape) < 0.3
    check(
        FN,
        randn(shape, device=d),
        to_flags(term, device=d),
        to_flags(trunc, device=d),
        gamma=0.9,
        bootstrap_values=boundary_values(trunc, device=d),
        **F32_TOL,
    )


# ------------------------------------------------------------------------------------------
# Hand-computed values, gamma = 0.5, rewards [1, 2, 4].
# A: no flags, no bootstrap:     G2 = 4, G1 = 2 + .5*4 = 4, G0 = 1 + .5*4 = 3
# B: bootstrap 8 at t=2:         G2 = 4 + 4 = 8, G1 = 2 + 4 = 6, G0 = 1 + 3 = 4
# C: trunc at t=0, bootstrap 2:  G0 = 1 + .5*2 = 2 (not G1); G1 = 6, G2 = 8 as B
# D: term at t=1:                G1 = 2 (no continuation), G0 = 1 + .5*2 = 2, G2 = 8 as B
GOLDEN = [[3.0, 4.0, 4.0], [4.0, 6.0, 8.0], [2.0, 6.0, 8.0], [2.0, 2.0, 8.0]]


def _golden(fn, device):
    def f(x):
        return torch.tensor(x, dtype=torch.float32, device=device)

    rewards = f([[1.0, 2.0, 4.0]] * 4)
    term = f([[0, 0, 0], [0, 0, 0], [0, 0, 0], [0, 1, 0]]).bool()
    trunc = f([[0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]]).bool()
    boot = f([[0, 0, 0], [0, 0, 8], [2, 0, 8], [0, 0, 8]])
    golden(fn(rewards, term, trunc, gamma=0.5, bootstrap_values=boot), GOLDEN)
    out = fn(rewards[0], term[0], gamma=0.5)
    assert out.shape == (3,)
    golden(out, GOLDEN[0])


def test_golden_reference():
    _golden(reference.compute_discounted_returns, "cpu")


def test_golden(path):
    _golden(rl_triton.compute_discounted_returns, path.device)
