"""Performance targets on a CUDA GPU (marked ``perf``; not collected without CUDA, so
CI -- CPU only -- never runs it).

* ``test_speedup``: one configuration per function, 4096 envs x 2048 steps, float32: rl_triton's
  call must be at least ``TARGETS`` times faster (full-call time, after both were checked against
  the float64 reference) than torch.compile of the best vectorised scan and than TorchRL's
  functional (the vectorised one where TorchRL has it). The targets are deliberately modest; tighten
  them after measuring.
* ``test_full_sweep`` (also ``slow``, opt-in: ``RL_TRITON_SLOW=1`` or ``-m slow``): the whole
  benchmark sweep (``python -m benchmarks --no-update``); every configuration must run and be
  correct. It takes a long time (the grid is 7 functions x 2 dtypes x 33 shapes).

Run on a GPU machine with ``bash scripts/test.sh -m perf tests/perf`` (scripts/test.sh sets
``RL_TRITON_TEST_NO_INTERPRET=1`` there; under ``TRITON_INTERPRET=1`` -- which tests/conftest.py
sets otherwise -- the kernels would run in Triton's interpreter, so these tests skip).
"""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = [pytest.mark.perf, pytest.mark.cuda]  # not collected without CUDA (tests/conftest.py)

SHAPE = (4096, 2048)
# function -> [(baseline, minimum speedup of rl_triton's full call over the baseline's)]
TARGETS = {
    "compute_gae": [("compile", 2.0), ("torchrl_vec", 5.0)],
    "compute_vtrace": [("compile", 1.0), ("torchrl_loop", 5.0)],
    "compute_retrace": [("compile", 1.0)],
    "compute_discounted_returns": [("compile", 1.0), ("torchrl_vec", 5.0)],
    "compute_lambda_returns": [("compile", 1.0), ("torchrl_vec", 5.0)],
    "compute_eligibility_traces": [("compile", 1.0)],
    "compute_episodic_prefix_sum": [("compile", 1.0)],
}


def _slow_selected(config) -> bool:
    if os.environ.get("RL_TRITON_SLOW") == "1":
        return True
    markexpr = config.getoption("markexpr", default="") or ""
    return "slow" in markexpr and "not slow" not in markexpr


@pytest.mark.parametrize("function", list(TARGETS))
def test_speedup(function):
    from benchmarks import baselines, suite, timing

    names = tuple(name for name, _ in TARGETS[function])
    if any(n.startswith("torchrl") for n in names) and not baselines.torchrl_available():
        pytest.skip("perf: TorchRL is not installed")
    # full (not --quick) compile variants, so torch.compile gets its strongest scan; short timing budget
    opts = baselines.Options(device=torch.device("cuda"), quick=False, budget=timing.QUICK, baselines=names)
    row = suite.measure(suite.Config(function, *SHAPE, "float32", "perf"), opts)
    assert row["correct"], f"rl_triton is wrong: err {row['err']:.2e}"
    got = {b["name"]: b for b in row["baselines"]}
    report = ", ".join(
        f"{n}: {got[n]['speedup']:.2f}x" if got[n]["status"] == "ok" else f"{n}: {got[n]['status']}" for n in got
    )
    for name, target in TARGETS[function]:
        b = got[name]
        assert b["status"] == "ok", f"{name} did not run correctly: {b.get('reason')} ({report})"
        assert b["speedup"] >= target, (
            f"{function} {SHAPE[0]}x{SHAPE[1]}: {b['speedup']:.2f}x over {b['label']} "
            f"({b['full_call_us']:.1f} us vs ours {b['ours_full_call_us']:.1f} us); target {target}x ({report})"
        )


@pytest.mark.slow
def test_full_sweep(request, tmp_path):
    if not _slow_selected(request.config):
        pytest.skip("slow: set RL_TRITON_SLOW=1 or pass -m slow to run the full benchmark sweep")
    from benchmarks import report, run

    results = run.main(["--no-update", "--json", str(tmp_path / "sweep.json")])
    report.validate(results)
    errors = [r for r in results["rows"] if "error" in r]
    assert not errors, [(r["function"], r["num_envs"], r["seq_len"], r["dtype"], r["error"]) for r in errors]
    wrong = [r for r in results["rows"] if not r["correct"]]
    assert not wrong, [(r["function"], r["num_envs"], r["seq_len"], r["dtype"], r["err"]) for r in wrong]
