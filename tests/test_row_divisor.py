"""Rows whose length is a multiple of 4 or 8 but not of 16 (launch._row_divisor; core.row_length):
the fused kernels are told so and give the float64 reference's numbers, and the same numbers as
without it: the same bits in the interpreter; on the GPU within a few float32 ulps, since the
compiler may contract other products into FMAs once the loads are vectors (the H200: up to 2.6e-7
relative, in the traces, the prefix sums and TD(lambda))."""

import pytest
import torch

import rl_triton as R
from rl_triton.kernels import launch
from tests._helpers import F32_TOL, FUNCTIONS, check, equal_results, valid_kwargs

# (N, T): T % 16 = 4, 8 or 12 (divisors 4, 8, 4), a multi-block row (T = 8196: two passes or look-back),
# and T = 8 (EXACT_T for the reverse recurrences, the divisor for the forward ones).
SHAPES = [(5, 12), (3, 20), (2, 100), (2, 1000), (1, 8196), (6, 8)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_row_divisor_keeps_the_bits(path, monkeypatch, fn, shape):
    if not path.is_kernel:
        pytest.skip("a kernel form")
    assert launch._row_divisor(shape[1]) == {4: 4, 8: 8, 12: 4}[shape[1] % 16]
    torch.manual_seed(sum(shape))
    kwargs = valid_kwargs(fn, shape, device=path.device)
    monkeypatch.setattr(launch, "_ROW_DIVISOR", False)
    without = getattr(R, fn)(**kwargs)
    monkeypatch.setattr(launch, "_ROW_DIVISOR", True)
    got = check(fn, **kwargs, **F32_TOL)[0]
    if path.name == "cuda":  # a few ulps of the outputs' scale (a prefix sum may cross zero)
        outs = without if isinstance(without, tuple) else (without,)
        scale = max(float(o.abs().max()) for o in outs)
        equal_results(got, without, atol=2e-6 * scale, rtol=2e-6)
    else:
        equal_results(got, without)
