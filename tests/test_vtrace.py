"""compute_vtrace against the float64 reference, hand-computed values and edge cases."""

import math

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
    env_shape,
    equal_results,
    golden,
    pattern_mask,
    randn,
    term_trunc,
    to_flags,
)

FN = "compute_vtrace"


def make_case(
    shape, *, device="cpu", dtype=torch.float32, flag_dtype=torch.bool, variant="trunc", p=0.1, rho_bar=1.0, c_bar=1.0
):
    """Inputs for one call; variant as in test_gae ("trunc", "boot", "last_value", "trunc-noboot",
    "plain"). Log-prob differences of ~N(0, 0.7) put ratios on both sides of the clipping levels."""
    term, trunc = term_trunc(shape, p, p)
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


@pytest.mark.parametrize("shape", SHAPES)
def test_shapes(path, shape):
    args, kwargs = make_case(shape, device=path.device)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("variant", ["trunc", "boot", "last_value", "trunc-noboot", "plain"])
@pytest.mark.parametrize("shape", [pytest.param((3, 33), id="N3-T33"), pytest.param((33,), id="T33-1d")])
def test_variants(path, shape, variant):
    args, kwargs = make_case(shape, device=path.device, variant=variant)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize(
    "rho_bar, c_bar",
    [(1.0, 1.0), (2.0, 1.0), (0.5, 0.8), (math.inf, math.inf), (1.0, 0.0)],
    ids=["r1-c1", "r2-c1", "r.5-c.8", "unclipped", "c0"],
)
def test_clipping(path, rho_bar, c_bar):
    args, kwargs = make_case((3, 40), device=path.device, rho_bar=rho_bar, c_bar=c_bar)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("which", ["term", "trunc"])
@pytest.mark.parametrize("pattern", PATTERNS)
def test_flag_patterns(path, pattern, which):
    shape = (4, 16)
    mask = pattern_mask(shape, pattern)
    zeros = torch.zeros(shape, dtype=torch.bool)
    term, trunc = (mask, zeros) if which == "term" else (zeros, mask)
    args, kwargs = make_case(shape, device=path.device)
    args[4] = to_flags(term, device=path.device)
    args[5] = to_flags(trunc, device=path.device)
    kwargs["bootstrap_values"] = boundary_values(trunc, device=path.device)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("flag_dtype", FLAG_DTYPES)
def test_flag_dtypes(path, flag_dtype):
    args, kwargs = make_case((3, 40), device=path.device, flag_dtype=flag_dtype, p=0.2)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("dtype, atol, rtol", FLOAT_DTYPES)
@pytest.mark.parametrize("shape", [pytest.param((5, 63), id="N5-T63"), pytest.param((2, 300), id="N2-T300")])
def test_float_dtypes(path, shape, dtype, atol, rtol):
    args, kwargs = make_case(shape, device=path.device, dtype=dtype, flag_dtype=dtype, rho_bar=1.5)
    check(FN, *args, **kwargs, atol=atol, rtol=rtol)


@pytest.mark.parametrize("how", ["stride", "transpose"])
def test_non_contiguous(path, how):
    check_non_contiguous(FN, *make_case((5, 37), device=path.device), how)


@pytest.mark.parametrize("gamma", [0.0, 1.0], ids=["g0", "g1"])
def test_gamma_edges(path, gamma):
    args, kwargs = make_case((3, 50), device=path.device)
    kwargs["gamma"] = gamma
    check(FN, *args, **kwargs, **F32_TOL)


def test_tensor_scalars(path):
    args, kwargs = make_case((3, 20), device=path.device, rho_bar=1.5, c_bar=0.9)
    expected = rl_triton.compute_vtrace(*args, **kwargs)
    kwargs.update({k: torch.tensor(kwargs[k], dtype=torch.float64) for k in ("gamma", "rho_bar", "c_bar")})
    equal_results(rl_triton.compute_vtrace(*args, **kwargs), expected)


def test_term_and_trunc_both_set(path):
    shape = (3, 30)
    args, kwargs = make_case(shape, device=path.device)
    term, trunc = torch.rand(shape) < 0.3, torch.rand(shape) < 0.3
    args[4], args[5] = to_flags(term, device=path.device), to_flags(trunc, device=path.device)
    kwargs["bootstrap_values"] = boundary_values(trunc, device=path.device)
    check(FN, *args, **kwargs, **F32_TOL)


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
