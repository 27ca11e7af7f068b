"""compute_gae against the float64 reference, hand-computed values and edge cases."""

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
    golden,
    pattern_mask,
    randn,
    term_trunc,
    to_flags,
)

FN = "compute_gae"


def make_case(shape, *, device="cpu", dtype=torch.float32, flag_dtype=torch.bool, variant="trunc", p=0.1):
    """Inputs for one call. variant: "trunc" (truncations + bootstrap_values), "boot" (bootstrap
    values, no truncateds), "last_value", "trunc-noboot" (truncateds, boot = 0), "plain"."""
    term, trunc = term_trunc(shape, p, p)
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


@pytest.mark.parametrize("shape", SHAPES)
def test_shapes(path, shape):
    args, kwargs = make_case(shape, device=path.device)
    check(FN, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("variant", ["trunc", "boot", "last_value", "trunc-noboot", "plain"])
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
        randn(shape, device=d),
        to_flags(term, device=d),
        to_flags(trunc, device=d),
        gamma=0.95,
        lambda_=0.8,
        bootstrap_values=boundary_values(trunc, device=d),
        **F32_TOL,
    )


@pytest.mark.parametrize("flag_dtype", FLAG_DTYPES)
def test_flag_dtypes(path, flag_dtype):
    args, kwargs = make_case((3, 40), device=path.device, flag_dtype=flag_dtype, p=0.2)
    check(FN, *args, **kwargs, **F32_TOL)


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


@pytest.mark.parametrize("dtype, atol, rtol", FLOAT_DTYPES)
@pytest.mark.parametrize(
    "shape",
    [pytest.param((5, 63), id="N5-T63"), pytest.param((2, 300), id="N2-T300"), pytest.param((2, 1000), id="N2-T1000")],
)
def test_float_dtypes(path, shape, dtype, atol, rtol):
    """Rows of 300 and 1000 steps: the register-capped one-chunk programs of 512 and 1024 steps on the GPU
    (launch._SINGLE_CAPS) in every float dtype."""
    args, kwargs = make_case(shape, device=path.device, dtype=dtype, flag_dtype=dtype)
    check(FN, *args, **kwargs, atol=atol, rtol=rtol)


def test_last_value_dtype(path):
    args, kwargs = make_case((4, 20), device=path.device, dtype=torch.bfloat16, variant="last_value")
    check(FN, *args, **kwargs, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("how", ["stride", "transpose"])
def test_non_contiguous(path, how):
    check_non_contiguous(FN, *make_case((5, 37), device=path.device), how)


@pytest.mark.parametrize(
    "gamma, lambda_", [(0.0, 0.9), (1.0, 1.0), (0.9, 0.0), (0.5, 1.0)], ids=["g0", "g1-l1", "l0", "g.5-l1"]
)
def test_gamma_lambda_edges(path, gamma, lambda_):
    args, kwargs = make_case((3, 50), device=path.device)
    kwargs.update(gamma=gamma, lambda_=lambda_)
    check(FN, *args, **kwargs, **F32_TOL)


def test_tensor_gamma_lambda(path):
    args, kwargs = make_case((3, 20), device=path.device)
    expected = rl_triton.compute_gae(*args, **kwargs)
    kwargs.update({k: torch.tensor(kwargs[k], dtype=torch.float64) for k in ("gamma", "lambda_")})
    torch.testing.assert_close(rl_triton.compute_gae(*args, **kwargs), expected, atol=0, rtol=0)


def test_term_and_trunc_both_set(path):
    """Both flags at one step: no bootstrap (terminated), recursion cut (done)."""
    shape = (3, 30)
    d = path.device
    term = torch.rand(shape) < 0.3
    trunc = torch.rand(shape) < 0.3
    check(
        FN,
        randn(shape, device=d),
        randn(shape, device=d),
        to_flags(term, device=d),
        to_flags(trunc, device=d),
        gamma=0.9,
        lambda_=0.7,
        bootstrap_values=boundary_values(trunc, device=d),
        **F32_TOL,
    )


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
