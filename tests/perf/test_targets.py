"""The performance issue's kernel targets on a CUDA GPU (marked ``perf``; skipped without CUDA):
fraction of a device-to-device copy at the large, long and short shapes, absolute kernel times at
1x1,048,576, 32,768x8 and 4096x128, and the bfloat16 speedup at the large shapes. The targets are the
issue's; the ones measured short of them on the H200 are expected failures (``xfail``, not strict)
whose reason carries the number measured there (NOTES.md, "Performance"), so this suite shows
both what holds and what is still open. See benchmarks/targets.py for the whole table."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.perf,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="perf: needs a CUDA GPU"),
]

# (function, N, T) -> fraction of copy measured on the H200 when it misses the target (NOTES.md).
KNOWN_MISSES: dict[tuple[str, int, int], str] = {}

CASES = [
    (fn, n, t)
    for fn in (
        "compute_gae",
        "compute_vtrace",
        "compute_retrace",
        "compute_discounted_returns",
        "compute_lambda_returns",
        "compute_eligibility_traces",
        "compute_episodic_prefix_sum",
    )
    for n, t in [(4096, 2048), (16384, 512), (1, 1048576), (16, 1048576), (1048576, 8), (32768, 8), (4096, 128)]
]


@pytest.fixture(autouse=True)
def _compiled_kernels():
    import rl_triton

    if rl_triton.INTERPRET:
        pytest.skip("perf: needs compiled kernels (RL_TRITON_TEST_NO_INTERPRET=1)")


def _case(fn, n, t):
    miss = KNOWN_MISSES.get((fn, n, t))
    reason = f"measured short of the target on the H200: {miss}"
    marks = [pytest.mark.xfail(reason=reason, strict=False)] if miss else []
    return pytest.param(fn, n, t, marks=marks, id=f"{fn.removeprefix('compute_')}-{n}x{t}")


@pytest.mark.parametrize("fn, n, t", [_case(*c) for c in CASES])
def test_kernel_target(fn, n, t):
    from benchmarks import targets

    row = targets.measure(fn, n, t)
    if row["fraction_target"] is not None:
        assert row["fraction_of_copy"] >= row["fraction_target"], row
    if row["time_target_us"] is not None:
        assert row["kernel_us"] <= row["time_target_us"], row
