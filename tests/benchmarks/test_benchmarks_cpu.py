"""CPU smoke tests of the benchmark suite (benchmarks/): the runner on tiny shapes with
``--device cpu`` (rl_triton's kernels run in Triton's interpreter, which tests/conftest.py turns on;
times are meaningless), the JSON schema, the float64 verification of every baseline, the staging
file, and promotion and plotting of a small fixture JSON. The GPU measurements themselves are in
tests/perf (skipped without CUDA)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import rl_triton
from benchmarks import baselines, promote, report, run, specs, suite, torch_impls

FIXTURE = Path(__file__).parent / "data" / "fixture_results.json"
REPO = Path(__file__).resolve().parents[2]

# baselines that apply to each function (TorchRL ones only where TorchRL has an equivalent)
EXPECTED = {
    "compute_gae": {"torchrl_vec", "torchrl_loop", "torchrl_module", "torchrl_module_vec", "eager", "compile"},
    "compute_vtrace": {"torchrl_loop", "torchrl_module", "eager", "compile"},
    "compute_retrace": {"eager", "compile"},
    "compute_discounted_returns": {"torchrl_vec", "eager", "compile"},
    "compute_lambda_returns": {"torchrl_vec", "torchrl_loop", "eager", "compile"},
    "compute_eligibility_traces": {"eager", "compile"},
    "compute_episodic_prefix_sum": {"eager", "compile"},
}
for _names in EXPECTED.values():
    _names.add("loop_path")  # the PyTorch path with a loop over time: every function, on the CPU


def _expected(fn: str) -> set[str]:
    names = EXPECTED[fn]
    if not baselines.torchrl_available():
        names = {n for n in names if not n.startswith("torchrl")}
    return names


@pytest.fixture(scope="module", autouse=True)
def _smoke_budget():
    """The fewest timed calls the CPU timer allows (one warm-up, MIN_REPS timed): on the CPU the times mean
    nothing, these tests check what is verified, recorded and written."""
    from benchmarks import timing

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(timing, "CPU", timing.Budget(0, 0, call_warmup=1, call_reps=timing.MIN_REPS, call_budget_s=0.0))
        yield


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """One --no-update run of the seven functions at the default CPU shape (4x16)."""
    out_dir = tmp_path_factory.mktemp("no_update")
    functions = ",".join(specs.SPECS)  # the token-level rows: tests/benchmarks/test_llm_benchmarks.py
    results = run.main(["--device", "cpu", "--no-update", "--out-dir", str(out_dir), "--functions", functions])
    return results, out_dir


def test_no_update_writes_nothing(cpu_run):
    _, out_dir = cpu_run
    assert list(out_dir.iterdir()) == []


def test_json_schema(cpu_run):
    results, _ = cpu_run
    report.validate(results)
    json.loads(json.dumps(results, default=str))  # serialisable
    meta = results["meta"]
    # without a GPU tests/conftest.py turns the interpreter on, which makes the times meaningless
    assert meta["device"] == "cpu" and meta["times_meaningful"] is not rl_triton.INTERPRET
    assert meta["gpu"] == "cpu" and meta["torch"] == torch.__version__
    assert {"commit", "date", "triton", "python", "mode"} <= meta.keys()
    assert [r["function"] for r in results["rows"]] == list(specs.SPECS)
    for row in results["rows"]:
        assert "error" not in row, row.get("traceback")
        assert (row["num_envs"], row["seq_len"], row["dtype"]) == (4, 16, "float32")
        assert row["correct"] and row["err"] < 1e-5
        assert row["verified_on"] == "all"
        assert row["bytes"] > 0 and row["kernel_us"] > 0 and row["full_call_us"] > 0 and row["copy_GBps"] > 0
        assert row["GBps"] == pytest.approx(row["bytes"] / (row["kernel_us"] * 1e-6) / 1e9)


def test_host_floors_recorded(cpu_run):
    """The run records the host floors (benchmarks.floors) once, at the smoke shape on the CPU."""
    import rl_triton

    floors = cpu_run[0]["floors"]
    assert floors["shape"] == list(suite.CPU_SHAPES[0])
    names = [r["name"] for r in floors["rows"]]
    assert names[:2] == ["torch.empty_like", "torch.add"] and "rl_triton.compute_gae" in names
    assert ("Triton copy kernel[grid]" in names) == bool(rl_triton.INTERPRET)
    assert all(r["full_call_us"] > 0 for r in floors["rows"])
    assert "| torch.add |" in report.floors_table(floors)


def test_every_baseline_verified_then_timed(cpu_run):
    results, _ = cpu_run
    for row in results["rows"]:
        got = {b["name"]: b for b in row["baselines"]}
        skipped = {name for name, b in got.items() if b["status"] == "skipped"}  # TorchRL's, where it is missing
        assert all(name.startswith("torchrl") and not baselines.torchrl_available() for name in skipped), skipped
        got = {name: b for name, b in got.items() if name not in skipped}
        assert set(got) == _expected(row["function"]), row["function"]
        for name, b in got.items():
            assert b["status"] == "ok", (row["function"], name, b.get("reason"), b.get("traceback"))
            assert b["err"] <= row["tolerance"], (row["function"], name)
            assert b["full_call_us"] > 0 and b["speedup"] == pytest.approx(b["full_call_us"] / b["ours_full_call_us"])
        comp = got["compile"]
        assert comp["compiled"] is False and "NOT compiled" in comp["label"]
        assert [c["variant"] for c in comp["candidates"]] == ["assoc"]


def test_staging_and_json(tmp_path):
    args = ["--device", "cpu", "--functions", "gae", "--shapes", "2x8", "--baselines", "eager", "--out-dir"]
    res = run.main([*args, str(tmp_path), "--gpu", "Test GPU A", "--commit", "abc123"])
    jsons = sorted(tmp_path.glob("*.json"))
    assert [p.name for p in jsons] == [f"{res['meta']['date']}-test-gpu-a.json"]
    on_disk = report.load_json(jsons[0])
    assert on_disk["meta"]["commit"] == "abc123" and on_disk["rows"][0]["num_envs"] == 2
    staged = (tmp_path / "unreleased.md").read_text()
    assert staged.count("<!-- begin run: test-gpu-a-custom -->") == 1
    assert "| compute_gae | 2×8 | float32 |" in staged and "vs eager loop" in staged
    assert "Host floors at 4×16 float32" in staged
    # the same label replaces its section; another label is appended
    run.main([*args, str(tmp_path), "--gpu", "Test GPU A", "--no-floors"])
    run.main([*args, str(tmp_path), "--gpu", "Test GPU B", "--no-floors", "--json", str(tmp_path / "extra" / "b.json")])
    staged = (tmp_path / "unreleased.md").read_text()
    assert staged.count("<!-- begin run: test-gpu-a-custom -->") == 1
    assert staged.count("<!-- begin run: test-gpu-b-custom -->") == 1
    assert staged.count("# Unreleased benchmark results") == 1
    report.load_json(tmp_path / "extra" / "b.json")


def test_incorrect_baseline_is_reported_not_timed(monkeypatch):
    def wrong(r, v, term, last):
        return (torch.zeros_like(r),)

    monkeypatch.setitem(torch_impls.EAGER, "compute_gae", wrong)
    opts = baselines.Options(device=torch.device("cpu"), budget=baselines.timing.CPU, baselines=("eager",))
    row = suite.measure(suite.Config("compute_gae", 3, 12, "float32", "custom"), opts)
    (b,) = row["baselines"]
    assert b["status"] == "incorrect" and b["err"] > row["tolerance"]
    assert "full_call_us" not in b and "speedup" not in b


def test_broken_compile_variant_is_reported():
    """The closed-form cumprod scan is numerically wrong (P underflows, a = 0 at episode ends)."""
    opts = baselines.Options(
        device=torch.device("cpu"), budget=baselines.timing.CPU, baselines=("compile",), compile_variants=("cumprod",)
    )
    row = suite.measure(suite.Config("compute_discounted_returns", 2, 64, "float32", "custom"), opts)
    (b,) = row["baselines"]
    assert b["status"] in ("incorrect", "failed") and "speedup" not in b
    assert b["candidates"][0]["variant"] == "cumprod"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5), (2, 700)])  # 700 > CHUNK: the chunked scan pads
def test_torch_baselines_match_reference(shape, dtype):
    """The eager loops and every default scan variant compute the primary call's math."""
    n, t = shape
    for name, spec in specs.SPECS.items():
        x = specs.Inputs(n, t, dtype, "cpu")
        window = specs.check_window(spec, n, t)
        tol = specs.tolerance(dtype)
        args = [x[k] for k in spec.keys]
        ref = specs.reference(spec, x, window, "primary")
        for variant in ("assoc", "chunked", "doubling"):
            out = torch_impls.make_scan_fn(name, variant, "cpu")(*args)
            assert specs.error(out, ref, window)[1] < specs.tolerance(dtype), (name, variant)
        if dtype == torch.float32 or t < 100:  # the eager loops accumulate in bf16: long rows drift
            eager = torch_impls.EAGER[name](*[torch_impls.time_major(a) for a in args])
            out = [torch_impls.rows_from_time_major(o) for o in eager]
            assert specs.error(out, ref, window)[1] < tol, (name, "eager")


def test_verification_window_is_exact_for_long_rows():
    """On a block (first rows, last steps of a reverse / first steps of a forward recurrence) the
    reference equals the full call restricted to the block."""
    old = (specs.VERIFY_STEPS, specs.VERIFY_ELEMENTS)
    specs.VERIFY_STEPS, specs.VERIFY_ELEMENTS = 24, 48
    try:
        for name in ("compute_gae", "compute_vtrace", "compute_retrace", "compute_eligibility_traces"):
            spec = specs.SPECS[name]
            x = specs.Inputs(5, 100, torch.float64, "cpu")
            window = specs.check_window(spec, 5, 100)
            assert not window.full and window.rows == 2 and window.t1 - window.t0 == 24
            with torch.no_grad():
                full = spec.primary(x)
            assert specs.error(full, specs.reference(spec, x, window, "primary"), window)[1] < 1e-12
    finally:
        specs.VERIFY_STEPS, specs.VERIFY_ELEMENTS = old


def test_parsers():
    assert suite.parse_shapes("64x512, 4096×2048") == [(64, 512), (4096, 2048)]
    with pytest.raises(ValueError):
        suite.parse_shapes("64by512")
    assert specs.resolve("gae,compute_vtrace,prefix") == [
        "compute_gae",
        "compute_vtrace",
        "compute_episodic_prefix_sum",
    ]
    with pytest.raises(ValueError):
        specs.resolve("nope")
    assert baselines.resolve("eager,compile") == ("eager", "compile")
    with pytest.raises(ValueError):
        baselines.resolve("nope")


def test_grids():
    full = suite.full_configs(list(specs.SPECS))
    assert len(full) == 7 * 2 * (25 + 4 + 4)
    quick = suite.quick_configs(list(specs.SPECS))
    assert len(quick) == 7 * 2 + 3
    assert {(c.num_envs, c.seq_len, c.dtype) for c in quick if c.function == "compute_gae"} == {
        (64, 512, "float32"),
        (4096, 2048, "float32"),
        (4096, 2048, "bfloat16"),
        (1, 1 << 20, "float32"),
        (32768, 8, "float32"),
    }


def test_promote_fixture(tmp_path):
    out = promote.main([str(FIXTURE), "--out", str(tmp_path / "benchmarks.md")])
    text = out.read_text()
    assert text.startswith("# Benchmarks")
    assert "FIXTURE GPU (synthetic numbers)" in text and "fixture_results.json" in text
    assert "## compute_gae" in text and "### bfloat16" in text and "## compute_discounted_returns" in text
    assert "| 4,096×2,048 | float32 | 50.0 µs | 100.0 µs |" in text
    assert "incorrect (err 2.9e-01)" in text and "Python loop over T > 4096 steps" in text


def test_promote_refuses_meaningless_times(tmp_path):
    data = json.loads(FIXTURE.read_text())
    data["meta"]["times_meaningful"] = False
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SystemExit):
        promote.main([str(path), "--out", str(tmp_path / "b.md")])
    promote.main([str(path), "--out", str(tmp_path / "b.md"), "--force"])
    assert "meaningless" in (tmp_path / "b.md").read_text()


def test_plot_fixture(tmp_path):
    pytest.importorskip("matplotlib")
    from benchmarks import plot

    written = plot.main([str(FIXTURE), str(tmp_path)])
    assert {p.name for p in written} == {"throughput.png", "speedup_torchrl.png", "speedup_compile.png"}
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_promote_entry_point(tmp_path):
    """``python -m benchmarks.promote`` works as a command (and imports neither torch nor rl_triton)."""
    out = tmp_path / "b.md"
    code = (
        "import runpy, sys; sys.argv = ['promote', sys.argv[1], '--out', sys.argv[2]]; "
        "runpy.run_module('benchmarks.promote', run_name='__main__'); "
        "assert 'torch' not in sys.modules and 'rl_triton' not in sys.modules"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(FIXTURE), str(out)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert out.exists()


def test_performance_page_tables_are_the_committed_h200_run():
    """docs/performance.md's kernel-time and full-call tables are what ``benchmarks.targets --page`` renders from
    benchmarks/results/targets_h200.json, and the page names the commit that run measured: a new run goes into
    the JSON and the page together."""
    from benchmarks import targets

    data = json.loads((REPO / "benchmarks" / "results" / "targets_h200.json").read_text())
    page = (REPO / "docs" / "performance.md").read_text()
    for table in targets.page_tables(data["rows"]):
        assert table in page, f"docs/performance.md lacks this table of targets_h200.json:\n{table}"
    header = page.split("\n\n")[1]
    assert data["meta"]["commit"][:7] in header, "the page's header names another commit than targets_h200.json"
