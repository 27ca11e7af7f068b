"""The performance issue's kernel targets on a CUDA GPU (marked ``perf``; not collected without CUDA):
fraction of a device-to-device copy at the large, long and short shapes, absolute kernel times at
1x1,048,576, 32,768x8 and 4096x128, and the bfloat16 speedup at the large shapes. The targets are the
issue's; the ones that missed in the committed H200 table (benchmarks/results/targets_h200.json,
NOTES.md "Performance") are expected failures (``xfail``, not strict) whose reason carries the
number measured there, so this suite shows both what holds and what is still open. See
benchmarks/targets.py for the whole table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._helpers import FUNCTIONS

pytestmark = [pytest.mark.perf, pytest.mark.cuda]  # not collected without CUDA (tests/conftest.py)

TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "targets_h200.json"


def _known_misses() -> dict[tuple[str, int, int], str]:
    """(function, N, T) -> what the committed H200 table measured, for the float32 rows that missed
    a fraction or kernel-time target there."""
    out = {}
    for r in json.loads(TABLE.read_text())["rows"] if TABLE.exists() else []:
        if r["dtype"] != "float32" or r.get("num_actions") == 18:
            continue
        frac_miss = r["fraction_target"] is not None and r["fraction_of_copy"] < r["fraction_target"]
        time_miss = r["time_target_us"] is not None and r["kernel_us"] > r["time_target_us"]
        if frac_miss or time_miss:
            out[(r["function"], r["num_envs"], r["seq_len"])] = (
                f"{r['fraction_of_copy']:.2f} of copy (target {r['fraction_target']}), {r['kernel_us']:.1f} us"
                f" (target {r['time_target_us']})"
            )
    return out


KNOWN_MISSES = _known_misses()

CASES = [
    (fn, n, t)
    for fn in FUNCTIONS
    for n, t in [(4096, 2048), (16384, 512), (1, 1048576), (16, 1048576), (1048576, 8), (32768, 8), (4096, 128)]
]


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
