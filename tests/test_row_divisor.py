"""Rows whose length is a multiple of 4 or 8 but not of 16 (Plan.row_div; core.row_length): the launcher tells
the fused kernels so, and they give the float64 reference's numbers, and the same numbers as under the same plan
with row_div=1: the same bits in the interpreter; on the GPU within a few float32 ulps, since the compiler may
contract other products into FMAs once the loads are vectors (the H200: up to 2.6e-7 relative, in the traces,
the prefix sums and TD(lambda))."""

from dataclasses import replace

import pytest
import torch

import rl_triton as R
from rl_triton.kernels import plans
from rl_triton.ops import kind_of  # the launcher's plan kind of each function
from tests._helpers import F32_TOL, FUNCTIONS, check, equal_results, valid_kwargs

# (N, T): T % 16 = 4, 8 or 12 (divisors 4, 8, 4), a multi-block row (T = 8196: the look-back), and T = 8
# (exact rows for the reverse recurrences, which take no divisor; the divisor for the forward ones).
SHAPES = [(5, 12), (3, 20), (2, 100), (2, 1000), (1, 8196), (6, 8)]
CASES = [
    pytest.param(fn, shape, id=f"{fn.removeprefix('compute_')}-N{shape[0]}-T{shape[1]}")
    for fn in FUNCTIONS
    for shape in SHAPES
]


@pytest.mark.parametrize("fn, shape", CASES)
def test_row_divisor_keeps_the_bits(kernel_path, fn, shape):
    n, t = shape
    plan = plans.choose(kind_of(fn), n, t, torch.float32, num_actions=4 if fn == "compute_retrace" else 0)
    assert plan.row_div == (1 if plan.exact_t else {4: 4, 8: 8, 12: 4}[t % 16])
    torch.manual_seed(sum(shape))
    kwargs = valid_kwargs(fn, shape, device=kernel_path.device)
    got = check(fn, **kwargs, **F32_TOL)[0]  # the launcher's plan, with its divisor
    if plan.row_div == 1:  # exact rows: nothing to compare with
        return
    without = getattr(R, fn)(**kwargs, plan=replace(plan, row_div=1))
    if kernel_path.name == "cuda":  # a few ulps of the outputs' scale (a prefix sum may cross zero)
        outs = without if isinstance(without, tuple) else (without,)
        scale = max(float(o.abs().max()) for o in outs)
        equal_results(got, without, atol=2e-6 * scale, rtol=2e-6)
    else:
        equal_results(got, without)
