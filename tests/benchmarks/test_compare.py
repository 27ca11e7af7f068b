"""The speed gate's plumbing (benchmarks/compare.py) on the CPU: the verdict of a row from its rounds, the table,
the exit status, the checkout of BASE, and one real run with alternating worker processes (``--device cpu``,
whose times mean nothing)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from benchmarks import compare

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "base, head, word",
    [
        ([10.0, 10.1], [10.0, 10.2], "same"),
        ([10.0, 10.0], [10.5, 10.5], "slower"),  # 5 % slower, no spread
        ([10.0, 10.5], [10.5, 10.6], "same"),  # 5 % slower, but the rounds spread by 5 %
        ([10.0, 10.0], [9.0, 9.1], "faster"),
        ([10.0, 10.0], [10.29, 10.3], "same"),  # within the threshold
    ],
)
def test_verdict(base, head, word):
    v = compare.verdict(base, head)
    assert v["verdict"] == word
    assert v["ratio"] == pytest.approx(min(head) / min(base))
    assert v["spread"] == pytest.approx(max((max(x) - min(x)) / min(x) for x in (base, head)))


def test_suspect_rows_get_more_rounds():
    assert compare.suspect([10.0, 10.5], [10.5, 10.6])  # 5 % before the spread: measured again
    assert not compare.suspect([10.0, 10.0], [10.2, 10.2])


def _samples(rows: dict) -> dict:
    """{"base": {key: [...]}, "head": {key: [...]}} from {key: (base µs list, head µs list)}."""
    out = {"base": {}, "head": {}}
    for key, (b, h) in rows.items():
        out["base"][key] = [{"us": x, "digest": "d"} if isinstance(x, float) else x for x in b]
        out["head"][key] = [{"us": x, "digest": "d"} if isinstance(x, float) else x for x in h]
    return out


def test_table_and_failures():
    control = compare.CONTROL
    samples = _samples({
        control: ([100.0, 100.0], [130.0, 130.0]),  # the machine moved: reported, never a failure by itself
        "fast": ([10.0, 10.0], [9.0, 9.0]),
        "slow": ([10.0, 10.0], [11.0, 11.0]),
        "gone": ([10.0, 10.0], [{"error": "ValueError: x"}, {"error": "ValueError: x"}]),
        "new": ([{"error": "TypeError: y"}], [10.0, 10.0]),
    })  # fmt: skip
    table = compare.summarise(samples, ["fast", "slow", "gone", "new"])
    verdicts = {r["row"]: r["verdict"] for r in table}
    assert verdicts == {control: "slower", "fast": "faster", "slow": "slower", "gone": "error", "new": "error"}
    assert [r["row"] for r in compare.failed(table)] == ["slow", "gone"]  # an error in BASE alone is no failure
    text = compare.markdown(table, "main", "HEAD")
    assert text.count("\n") == len(table) + 2
    assert "| slow | 10.00 | 11.00 | 1.100 | 0.000 | same | 2 | **slower** |" in text


def test_base_that_is_neither_commit_nor_directory():
    with pytest.raises(SystemExit, match="neither a commit"):
        with compare.checked_out("no-such-ref-" + "0" * 8):
            pass


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="needs the git repository")
def test_commit_checked_out_and_removed():
    with compare.checked_out("HEAD") as (tree, label):
        assert (tree / "rl_triton" / "__init__.py").exists()
        assert label.startswith("HEAD (")
    assert not tree.exists()
    listed = subprocess.run(["git", "worktree", "list"], cwd=REPO, capture_output=True, text=True).stdout
    assert str(tree) not in listed


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_commit_of_a_tree(tmp_path):
    """A checkout reports its own commit; a copy of sources unpacked inside it (not a checkout of its own) none, and
    the gate names such a head by its directory."""
    from benchmarks import report

    def git(*args):
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.txt").write_text("a\n")
    git("add", "a.txt")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert report.git_commit(tmp_path) == (head, False)
    (tmp_path / "copy").mkdir()
    assert report.git_commit(tmp_path / "copy") == (None, None)
    assert compare.tree_label(tmp_path) == f"HEAD ({head[:7]})"
    assert compare.tree_label(tmp_path / "copy") == str(tmp_path / "copy")


def test_run_on_cpu(tmp_path):
    """Both trees in alternating worker processes: BASE is a copy of this tree (a directory), so every row must
    have the same bits, two rounds, and an exit status that agrees with the verdicts."""
    base = tmp_path / "base"
    shutil.copytree(REPO / "rl_triton", base / "rl_triton", ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "cmp.json"
    argv = [str(base), "--device", "cpu", "--shapes", "4x16", "--functions", "gae,traces", "--max-rounds", "2"]
    rc = compare.main(
        [*argv, "--json", str(out), "--markdown", str(tmp_path / "cmp.md"), "--grid", str(tmp_path / "g.md")]
    )
    result = json.loads(out.read_text())
    rows = {r["row"]: r for r in result["table"]}
    assert set(rows) == {compare.CONTROL, "compute_gae 4x16 float32", "compute_eligibility_traces 4x16 float32"}
    for key, r in rows.items():
        assert r["rounds"] == 2
        assert len(result["samples"]["base"][key]) == len(result["samples"]["head"][key]) == 2
        if key != compare.CONTROL:
            assert r["same_bits"] is True
    assert rc == (1 if compare.failed(result["table"]) else 0)
    assert (tmp_path / "cmp.md").read_text().startswith("| configuration |")
    assert (tmp_path / "g.md").read_text().startswith("float32:\n\n| function | 4×16 |")


def test_touched_lists_the_configurations_whose_code_differs(tmp_path, capsys):
    """--touched compiles both trees offline: BASE is this tree with GAE's delta summed in another order, so GAE's
    configuration compiles differently and the traces' does not; with --device cpu nothing is timed. Four jobs:
    each tree's two configurations compile in two processes."""
    base = tmp_path / "base"
    shutil.copytree(REPO / "rl_triton", base / "rl_triton", ignore=shutil.ignore_patterns("__pycache__"))
    gae = base / "rl_triton" / "ops" / "gae.py"
    src = gae.read_text()
    assert "b_delta = b_r + gamma * b_vnext - b_v" in src
    gae.write_text(src.replace("b_delta = b_r + gamma * b_vnext - b_v", "b_delta = b_r - b_v + gamma * b_vnext"))
    argv = [str(base), "--touched", "--device", "cpu", "--shapes", "4x16", "--functions", "gae,traces", "--jobs", "4"]
    rc = compare.main(argv)
    out = capsys.readouterr().out
    if "not compiled" in out and "ptxas" in out:
        pytest.skip(f"no working ptxas: {out[-300:]}")
    assert rc == 0
    assert "1 of 2 configurations compile differently" in out, out
    assert "differs:   compute_gae 4x16 float32 (" in out, out  # with what moved: SASS at least, or "same counts"
    assert "same code: compute_eligibility_traces 4x16 float32\n" in out, out
    assert "| configuration |" not in out  # --device cpu: listed, not timed


def test_compiled_codes_split_the_rows_over_the_jobs(monkeypatch):
    """Each tree's rows go to jobs // 2 compiling processes (at least one), and every row's result comes back
    under its tree."""
    calls = []

    def fake_worker(tree, rows, device, rep_ms, code=False):
        assert code and device == "cpu"
        calls.append((tree, [r.key for r in rows]))
        return {r.key: {"code": f"{tree}:{r.key}"} for r in rows}

    monkeypatch.setattr(compare, "_run_worker", fake_worker)
    rows = [compare.Row("compute_gae", n, 16, "float32") for n in (1, 2, 3, 4, 5)]
    trees = {"base": Path("b"), "head": Path("h")}
    for jobs, processes in ((1, 2), (2, 2), (4, 4), (6, 6), (64, 10)):
        calls.clear()
        codes = compare.compiled_codes(trees, rows, jobs)
        assert len(calls) == processes
        for side, tree in trees.items():
            assert codes[side] == {r.key: {"code": f"{tree}:{r.key}"} for r in rows}
            shares = [keys for t, keys in calls if t == tree]
            assert sorted(k for keys in shares for k in keys) == sorted(r.key for r in rows)


def test_warm_up_pass_comes_first_and_is_not_timed(monkeypatch):
    """With jobs > 1, every row runs once per tree in parallel processes (do_bench's short warm-up time) before the
    timed rounds, whose processes each take every row; the warm-up's times are not among the samples."""
    calls = []

    def fake_worker(tree, rows, device, rep_ms, code=False):
        calls.append((tree, rep_ms, [r.key for r in rows]))
        us = 99.0 if rep_ms == compare.WARM_REP_MS else 1.0
        return {compare.CONTROL: {"us": us}, **{r.key: {"us": us, "digest": "d"} for r in rows}}

    monkeypatch.setattr(compare, "_run_worker", fake_worker)
    rows = [compare.Row("compute_gae", n, 16, "float32") for n in (1, 2, 3)]
    samples, table = compare.run(
        Path("b"), Path("h"), rows, device="cpu", rounds=2, max_rounds=2, threshold=0.03, rep_ms=40.0, jobs=4
    )
    warm, timed = calls[:4], calls[4:]
    assert all(rep == compare.WARM_REP_MS for _t, rep, _k in warm)
    for tree in (Path("b"), Path("h")):
        assert sorted(k for t, _r, keys in warm if t == tree for k in keys) == sorted(r.key for r in rows)
    assert len(timed) == 4 and all(rep == 40.0 and len(keys) == 3 for _t, rep, keys in timed)
    assert all(s["us"] == 1.0 for side in samples.values() for runs in side.values() for s in runs)
    assert all(r["ratio"] == 1.0 for r in table)


def test_grid_lays_the_table_out_as_the_performance_page_does(tmp_path):
    """Per dtype and layout a grid of functions by shapes; the spread shown only above 3 %; bold only where HEAD is
    slower than BASE by more than 2 % beyond the spread; --from-json renders saved tables without a run."""

    def row(key, b, h, spread=0.01):
        return {"row": key, "base_us": b, "head_us": h, "ratio": h / b, "spread": spread, "verdict": "same"}

    table = [
        {"row": compare.CONTROL, "base_us": 1.0, "head_us": 1.0, "ratio": 1.0, "spread": 0.0, "verdict": "same"},
        row("compute_gae 4096x2048 float32", 32.0, 32.32),
        row("compute_vtrace 4096x2048 float32", 100.0, 104.0),  # 1.04 > 1.02 + 0.01: bold
        row("compute_vtrace 8192x4096 float32", 1000.0, 1040.0, spread=0.05),  # within its spread
        row("compute_gae 16384x512 bfloat16 time-major", 40.0, 38.0),
        {"row": "compute_retrace 64x512 float32", "verdict": "error", "errors": {"head": "E"}},
    ]
    text = compare.grid(table)
    assert text.splitlines()[:5] == [
        "float32:",
        "",
        "| function | 4,096×2,048 | 8,192×4,096 | 64×512 |",
        "| --- | ---: | ---: | ---: |",
        "| GAE | 32.00 → 32.32 (1.010) |  |  |",
    ]
    assert "| V-trace | **100.00 → 104.00 (1.040)** | 1,000.00 → 1,040.00 (1.040 ± 0.05) |  |" in text
    assert "| Retrace |  |  | error |" in text
    assert "bfloat16 time-major:\n\n| function | 16,384×512 |\n| --- | ---: |\n| GAE | 40.00 → 38.00 (0.950) |" in text
    saved = tmp_path / "a.json"
    saved.write_text(json.dumps({"table": table}))
    assert compare.main(["--from-json", str(saved), "--grid", str(tmp_path / "g.md")]) == 0
    assert (tmp_path / "g.md").read_text() == text


def test_touched_lists_what_moved_per_launch():
    """A differing configuration is listed with the counts that moved in each launch, base → head."""
    one = {"registers": 80, "SASS": 568, "barriers": 1, "load trips": "14"}
    assert compare._changes([one], [one]) == "same counts"
    late = dict(one, registers=78, SASS=784, barriers=6)
    assert compare._changes([one], [late]) == "registers 80 → 78, SASS 568 → 784, barriers 1 → 6"
    split = dict(one, **{"load trips": "8+2 | 4"})
    assert compare._changes([one, one], [one, split]) == "same counts; load trips 14 → 8+2 | 4"
    assert compare._changes([one], [one, one]) == "1 → 2 launches"
    assert compare._trips([[], [8, 2], [], [4]]) == "8+2 | 4"
    assert compare._trips([[]]) == "-"


def test_touched_times_what_could_not_be_compared():
    """A configuration that did not compile in a tree is timed (it may differ); equal code is not."""
    rows = [compare.Row(f, 4, 16, "float32") for f in ("compute_gae", "compute_vtrace", "compute_retrace")]
    base = {rows[0].key: {"code": "a"}, rows[1].key: {"error": "E"}, rows[2].key: {"code": "c"}}
    head = {rows[0].key: {"code": "a"}, rows[1].key: {"error": "E"}, rows[2].key: {"code": "d"}}
    differ, same = compare.touched({"base": base, "head": head}, rows)
    assert same == rows[:1] and differ == rows[1:]
