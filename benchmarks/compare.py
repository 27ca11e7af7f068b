"""The speed gate: the kernel time of BASE and of the working tree, measured in one run.

``python -m benchmarks.compare BASE`` checks BASE (a commit, tag or branch) out into a temporary git worktree,
then times the rl_triton calls of both trees in alternating processes (BASE, HEAD, then HEAD, BASE, ...) on the
GPU: each process imports its own tree's ``rl_triton`` and times every configuration the same way (the
``do_bench`` median of a CUDA-graph replay of one public call, L2 flushed), plus a device-to-device copy of a
fixed size as the control: the copy's code is the same in both trees, so its ratio shows whether the machine
moved between the processes. Rows are measured in at least ``--rounds`` rounds; rows that look slower than BASE
get more rounds (up to ``--max-rounds``). Per row and tree the best round counts; the spread is the larger of the
two trees' relative ranges over their rounds. A row is a regression when HEAD / BASE > 1 + threshold + spread
(threshold 3 %); the exit status is then 1. Outputs are hashed in every process, so the table also says whether
the trees compute the same bits.

BASE may also be a directory that holds a tree (its ``rl_triton`` package is imported from there), for machines
without the repository's history: ``git archive BASE rl_triton | tar -x -C DIR``.

``--touched`` first compiles every configuration's launches in both trees for sm_90, as ``benchmarks.tune
--offline`` does (no GPU needed), and times only the configurations whose code differs (the grid, warps or SASS of
a launch); the others are listed as the same code, whose times cannot differ. Each configuration that differs is
listed with what moved in each launch (registers, SASS instructions, barriers, load trips: ``benchmarks.tune``).
With ``--device cpu`` it stops there: a CPU machine lists which configurations a change touches before any GPU
time is spent.

Compiling takes about a second a configuration and tree, a large part of a gate's time, so it runs in ``--jobs``
processes at once (default: one per CPU core, at most 16), the configurations split between them: the offline
compile of ``--touched``, and an untimed warm-up pass before the timed rounds that runs every configuration once in
each tree, which leaves the kernels in Triton's cache for the timed processes.

Examples::

    python -m benchmarks.compare main                                     # the quick suite's shapes
    python -m benchmarks.compare b6064a8 --shapes 4096x2048,8192x4096 --dtypes float32,bfloat16
    python -m benchmarks.compare HEAD~1 --functions vtrace,retrace --time-major --shapes 16384x512
    python -m benchmarks.compare main --device cpu --shapes 4x16          # plumbing only: times mean nothing
    python -m benchmarks.compare main --touched --device cpu --shapes 4096x2048,16384x512 --dtypes float32,bfloat16
    python -m benchmarks.compare --from-json a.json,b.json --grid gate.md   # saved runs as the performance page's grids
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
THRESHOLD = 0.03
CONTROL = "copy (control)"
WARM_REP_MS = 1.0  # the warm-up pass's do_bench time per row: it only compiles
CONTROL_BYTES = 1 << 28  # 256 MiB moved (half read, half written): large against the L2, short to time


@dataclasses.dataclass(frozen=True)
class Row:
    """One configuration: a benchmark spec's primary call (benchmarks/specs.py) on N x T inputs."""

    function: str
    num_envs: int
    seq_len: int
    dtype: str
    time_major: bool = False
    num_actions: int = 4

    @property
    def key(self) -> str:
        layout = " time-major" if self.time_major else ""
        actions = f" A={self.num_actions}" if self.function == "compute_retrace" and self.num_actions != 4 else ""
        return f"{self.function} {self.num_envs}x{self.seq_len} {self.dtype}{layout}{actions}"


def quick_rows(functions: list[str]) -> list[Row]:
    """The quick suite's configurations (benchmarks/suite.py, quick_configs)."""
    out = [Row(f, n, t, "float32") for f in functions for n, t in ((64, 512), (4096, 2048))]
    if "compute_gae" in functions:
        out += [
            Row("compute_gae", 4096, 2048, "bfloat16"),
            Row("compute_gae", 1, 1 << 20, "float32"),
            Row("compute_gae", 32768, 8, "float32"),
        ]
    return out


# --------------------------------------------------------------------------------------------- the worker


def _import_tree(tree: Path):
    """Imports ``rl_triton`` from ``tree`` (first on sys.path), then this repository's benchmarks package."""
    sys.path.insert(0, str(tree))
    import rl_triton

    got = Path(rl_triton.__file__).resolve().parent
    if got != (tree / "rl_triton").resolve():
        raise RuntimeError(f"compare: imported rl_triton from {got}, expected {tree / 'rl_triton'}")
    sys.path[0] = str(REPO)  # the measuring code is HEAD's; rl_triton stays the one imported above
    return rl_triton


def _digest(outputs) -> str:
    import torch

    h = hashlib.sha1()
    for o in outputs:
        h.update(o.detach().contiguous().cpu().view(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:12]


def _copy_us(dev, budget) -> float:
    """The control: an elementwise device-to-device copy of CONTROL_BYTES (timing.copy_gbps's steady copy)."""
    import torch

    from benchmarks import timing

    src = torch.empty(CONTROL_BYTES // 8 if dev.type == "cuda" else 1 << 16, device=dev).uniform_()
    dst = torch.empty_like(src)
    return timing.kernel_us(lambda: torch.mul(src, 1.0, out=dst), dev, budget, graph=True)


def worker(tree: Path, rows: list[dict], device: str, rep_ms: float) -> dict:
    """Times ``rows`` with the rl_triton of ``tree``; returns {key: {"us", "digest"} or {"error"}}."""
    _import_tree(tree)
    import torch

    from benchmarks import specs, timing

    dev = torch.device(device)
    budget = dataclasses.replace(timing.QUICK, bench_warmup_ms=rep_ms / 4, bench_rep_ms=rep_ms)
    if dev.type == "cpu":
        budget = dataclasses.replace(timing.CPU, call_reps=20, call_budget_s=0.2)
    out = {CONTROL: {"us": _copy_us(dev, budget)}}
    for raw in rows:
        row = Row(**raw)
        saved, specs.NUM_ACTIONS = specs.NUM_ACTIONS, row.num_actions
        try:
            spec = specs.SPECS[row.function]
            x = specs.Inputs(row.num_envs, row.seq_len, getattr(torch, row.dtype), dev, row.time_major)
            with torch.no_grad():
                digest = _digest(spec.primary(x))
                us = timing.kernel_us(lambda: spec.primary(x), dev, budget, graph=True)  # noqa: B023
            out[row.key] = {"us": us, "digest": digest}
            x.release()
        except Exception as exc:  # noqa: BLE001 - a row that fails in one tree is reported, not fatal
            out[row.key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            specs.NUM_ACTIONS = saved
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return out


def code_worker(tree: Path, rows: list[dict]) -> dict:
    """Offline (no GPU): per row, a digest of what its call launches with the rl_triton of ``tree`` -- each
    launch's grid, warps and sm_90 SASS, compiled as ``benchmarks.tune --offline`` does."""
    _import_tree(tree)
    import torch

    from benchmarks import specs, tune

    out = {}
    for raw in rows:
        row = Row(**raw)
        saved, specs.NUM_ACTIONS = specs.NUM_ACTIONS, row.num_actions
        try:
            x = specs.Inputs(row.num_envs, row.seq_len, getattr(torch, row.dtype), torch.device("cpu"), row.time_major)
            launches = tune.compiled_launches(row.function, x)
            h = hashlib.sha1()
            stats = []
            for _kernel, grid, _options, warps, _ck, sass, usage in launches:
                h.update(f"{list(grid)} {warps}\n{sass}".encode())
                own = tune.listing_counts(tune.split_functions(sass)[0])
                stats.append({
                    "registers": usage.get("REG"), "SASS": own["sass_instructions"], "barriers": own["barriers"],
                    "load trips": _trips(own["load_trips"]),
                })  # fmt: skip
            out[row.key] = {"code": h.hexdigest()[:12], "launches": len(launches), "stats": stats}
            x.release()
        except Exception as exc:  # noqa: BLE001 - a row that does not compile here is timed, not skipped
            out[row.key] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
        finally:
            specs.NUM_ACTIONS = saved
    return out


def _trips(loops: list[list[int]]) -> str:
    """``benchmarks.tune.load_trips`` as text: the loops that load, " | " between loops (a kernel of short rows
    has dozens of unrolled loops without a load, which would bury the one that matters)."""
    return " | ".join("+".join(map(str, trips)) for trips in loops if trips) or "-"


def touched(codes: dict, rows: list[Row]) -> tuple[list[Row], list[Row]]:
    """(rows whose code differs or could not be compared, rows of the same code in both trees) from the two
    trees' :func:`code_worker` results."""
    same = [
        r for r in rows
        if "code" in codes["base"].get(r.key, {}) and codes["base"][r.key] == codes["head"].get(r.key)
    ]  # fmt: skip
    return [r for r in rows if r not in same], same


def _changes(base: list[dict], head: list[dict]) -> str:
    """What differs between two trees' launches of a configuration, per launch (``base → head``): registers, and the
    SASS instructions, barriers and load trips of the kernel's own code (a function it calls apart, the late
    test's second pass, not counted)."""
    if len(base) != len(head):
        return f"{len(base)} → {len(head)} launches"
    parts = []
    for b, h in zip(base, head, strict=True):
        moved = [
            f"{key} {b[key]} → {h[key]}" for key in ("registers", "SASS", "barriers", "load trips") if b[key] != h[key]
        ]
        parts.append(", ".join(moved) or "same counts")
    return "; ".join(parts)


def _listing(codes: dict, differ: list[Row], same: list[Row]) -> str:
    lines = [f"{len(differ)} of {len(differ) + len(same)} configurations compile differently (--touched)"]
    lines += [f"  same code: {r.key}" for r in same]
    for r in differ:
        got = {side: codes[side].get(r.key, {"error": "no result"}) for side in ("base", "head")}
        errors = [f"{side}: {res['error']}" for side, res in got.items() if "error" in res]
        if errors:
            lines.append(f"  differs:   {r.key} (not compiled: {'; '.join(errors)})")
        else:
            lines.append(f"  differs:   {r.key} ({_changes(got['base']['stats'], got['head']['stats'])})")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------- statistics


def verdict(base: list[float], head: list[float], threshold: float = THRESHOLD) -> dict:
    """Ratio, spread and verdict of one row from its per-round times (µs) in each tree: the best round of each
    counts; the spread is the larger relative range (max - min) / min of the two trees' rounds."""
    b, h = min(base), min(head)
    spread = max((max(v) - min(v)) / min(v) for v in (base, head))
    ratio = h / b
    if ratio > 1 + threshold + spread:
        word = "slower"
    elif ratio < 1 - threshold - spread:
        word = "faster"
    else:
        word = "same"
    return {"base_us": b, "head_us": h, "ratio": ratio, "spread": spread, "verdict": word}


def suspect(base: list[float], head: list[float], threshold: float = THRESHOLD) -> bool:
    """A row worth another round: slower than the threshold before its spread is taken into account."""
    return min(head) / min(base) > 1 + threshold


def summarise(samples: dict, keys: list[str], threshold: float = THRESHOLD) -> list[dict]:
    """One table row per key from ``samples[tree][key]`` = list of per-round results ({"us"} or {"error"})."""
    table = []
    for key in [CONTROL, *keys]:
        base, head = samples["base"].get(key, []), samples["head"].get(key, [])
        errors = {tree: r["error"] for tree, rs in (("base", base), ("head", head)) for r in rs if "error" in r}
        row = {"row": key, "rounds": min(len(base), len(head))}
        if errors or not base or not head:
            row |= {"verdict": "error", "errors": errors}
        else:
            row |= verdict([r["us"] for r in base], [r["us"] for r in head], threshold)
            digests = {r.get("digest") for r in base} | {r.get("digest") for r in head}
            row["same_bits"] = None if key == CONTROL else len(digests) == 1
        table.append(row)
    return table


def failed(table: list[dict]) -> list[dict]:
    """The rows that fail the gate: slower beyond threshold and spread, or failing in HEAD."""
    return [
        r for r in table
        if r["row"] != CONTROL and (r["verdict"] == "slower" or (r["verdict"] == "error" and "head" in r["errors"]))
    ]  # fmt: skip


def markdown(table: list[dict], base_label: str, head_label: str) -> str:
    lines = [
        f"| configuration | {base_label} µs | {head_label} µs | ratio | spread | bits | rounds | verdict |",
        "| --- | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for r in table:
        if r["verdict"] == "error":
            errors = "; ".join(f"{tree}: {text}" for tree, text in r["errors"].items())
            lines.append(f"| {r['row']} | | | | | | | error: {errors} |")
            continue
        bits = {True: "same", False: "differ", None: ""}[r["same_bits"]]
        word = f"**{r['verdict']}**" if r["verdict"] == "slower" else r["verdict"]
        lines.append(
            f"| {r['row']} | {r['base_us']:.2f} | {r['head_us']:.2f} | {r['ratio']:.3f} | {r['spread']:.3f} | {bits} "
            f"| {r['rounds']} | {word} |"
        )
    return "\n".join(lines) + "\n"


GRID_NAMES = {
    "compute_gae": "GAE", "compute_vtrace": "V-trace", "compute_retrace": "Retrace",
    "compute_discounted_returns": "discounted returns", "compute_lambda_returns": "TD(λ) returns",
    "compute_eligibility_traces": "eligibility traces", "compute_episodic_prefix_sum": "prefix sums",
}  # fmt: skip


def _num(x: float) -> str:
    return f"{x:,.2f}"


def grid(table: list[dict], bold_over: float = 0.02) -> str:
    """``table`` as the performance page shows a gate: per dtype and layout, functions by shapes, each cell
    ``BASE µs → HEAD µs (ratio)``, ``± spread`` where the spread exceeds 3 %, bold where HEAD is slower than BASE by
    more than ``bold_over`` beyond the spread; rows that failed in a tree read ``error``."""
    groups: dict[str, dict[str, dict[str, str]]] = {}
    for r in table:
        if r["row"] == CONTROL:
            continue
        function, shape, *rest = r["row"].split(" ")
        n, t = (int(v) for v in shape.split("x"))
        cells = groups.setdefault(" ".join(rest), {})
        if r["verdict"] == "error":
            text = "error"
        else:
            text = f"{_num(r['base_us'])} → {_num(r['head_us'])} ({r['ratio']:.3f}"
            text += f" ± {r['spread']:.2f})" if r["spread"] > THRESHOLD else ")"
            if r["ratio"] > 1 + bold_over + r["spread"]:
                text = f"**{text}**"
        cells.setdefault(f"{n:,}×{t:,}", {})[GRID_NAMES.get(function, function)] = text
    out = []
    for label, cells in groups.items():
        shapes = list(cells)
        functions = list(dict.fromkeys(f for c in cells.values() for f in c))
        out += [f"{label}:", "", "| function | " + " | ".join(shapes) + " |", "| --- |" + " ---: |" * len(shapes)]
        out += [f"| {f} | " + " | ".join(cells[s].get(f, "") for s in shapes) + " |" for f in functions]
        out.append("")
    return "\n".join(out)


# --------------------------------------------------------------------------------------------- the driver


def tree_label(head) -> str:
    """The table's name for the measured tree: HEAD and its commit, or a directory that is not a checkout of its
    own (a copy of the sources) by its path."""
    from . import report

    commit, dirty = report.git_commit(Path(head))
    if commit is None:
        return "HEAD" if Path(head).resolve() == REPO else str(head)
    return f"HEAD ({commit[:7]}{', dirty' if dirty else ''})"


@contextlib.contextmanager
def checked_out(base: str):
    """A directory holding BASE's tree: BASE itself if it is one, else a temporary git worktree of the commit."""
    if Path(base).is_dir():
        if not (Path(base) / "rl_triton" / "__init__.py").exists():
            raise SystemExit(f"compare: {base} holds no rl_triton package")
        yield Path(base).resolve(), base
        return
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--verify", f"{base}^{{commit}}"], cwd=REPO, capture_output=True, text=True,
            check=True,
        ).stdout.strip()  # fmt: skip
    except (subprocess.CalledProcessError, FileNotFoundError):
        raise SystemExit(f"compare: {base!r} is neither a commit of this repository nor a directory") from None
    tmp = Path(tempfile.mkdtemp(prefix="rl_triton-compare-"))
    tree = tmp / "base"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=REPO, capture_output=True, check=True)
    try:
        yield tree, f"{base} ({commit[:7]})"
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=REPO, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


def _run_worker(tree: Path, rows: list[Row], device: str, rep_ms: float, code: bool = False) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec, result = Path(tmp) / "rows.json", Path(tmp) / "result.json"
        spec.write_text(json.dumps([dataclasses.asdict(r) for r in rows]))
        cmd = [sys.executable, "-m", "benchmarks.compare", "--worker", str(tree), str(spec), str(result)]
        cmd += ["--device", device, "--rep-ms", str(rep_ms)] + (["--code"] if code else [])
        env = dict(os.environ, PYTHONPATH=str(REPO))  # this repository's benchmarks; the tree's rl_triton first
        if code:
            env.pop("TRITON_INTERPRET", None)  # the interpreter has no compiled kernels
        proc = subprocess.run(cmd, cwd=tempfile.gettempdir(), env=env, capture_output=True, text=True)
        if proc.returncode != 0 or not result.exists():
            raise RuntimeError(f"compare: the worker for {tree} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        return json.loads(result.read_text())


def in_parallel(trees: dict[str, Path], rows: list[Row], jobs: int, **worker) -> dict:
    """Per tree, :func:`_run_worker`'s results for ``rows`` (``worker``: its other arguments), the rows of each
    tree split over ``jobs // len(trees)`` processes and ``jobs`` processes running at once."""
    shares = max(1, jobs // len(trees))
    parts = [part for part in (rows[i::shares] for i in range(shares)) if part]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [
            (side, pool.submit(_run_worker, tree, part, **worker)) for side, tree in trees.items() for part in parts
        ]
    results = {side: {} for side in trees}
    for side, future in futures:
        results[side].update(future.result())
    return results


def compiled_codes(trees: dict[str, Path], rows: list[Row], jobs: int) -> dict:
    """Per tree, :func:`code_worker`'s results for ``rows``, compiled in ``jobs`` processes at once (compiling
    takes about a second a configuration)."""
    return in_parallel(trees, rows, jobs, device="cpu", rep_ms=0.0, code=True)


def _progress(total: int):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc="compare", unit="process", file=sys.stderr)
    except ImportError:  # tqdm is a dev dependency
        return None


def run(base_tree: Path, head_tree: Path, rows: list[Row], *, device: str, rounds: int, max_rounds: int,
        threshold: float, rep_ms: float, progress: Path | None = None,
        jobs: int = 1) -> tuple[dict, list[dict]]:  # fmt: skip
    """Alternating processes, ``rounds`` rounds of every row, then up to ``max_rounds`` for the suspect ones.
    ``progress``: a file that holds the samples so far after every process (for runs cut short). ``jobs`` > 1:
    first a warm-up pass, untimed, that runs every row once in ``jobs`` processes at once, so that Triton's cache
    holds the kernels before the timed processes, one at a time, start."""
    samples = {"base": {}, "head": {}}
    trees = {"base": base_tree, "head": head_tree}
    if jobs > 1:
        in_parallel(trees, rows, jobs, device=device, rep_ms=WARM_REP_MS)
    todo = list(rows)
    bar = _progress(2 * max_rounds)
    for r in range(max_rounds):
        if r >= rounds:
            partial = summarise(samples, [x.key for x in rows], threshold)
            looked = {t["row"] for t in partial if t["verdict"] != "error"}
            todo = [
                x for x in rows
                if x.key in looked and suspect(*(
                    [s["us"] for s in samples[side][x.key]] for side in ("base", "head")
                ), threshold)
            ]  # fmt: skip
            if not todo:
                break
        for side in ("base", "head") if r % 2 == 0 else ("head", "base"):
            for key, res in _run_worker(trees[side], todo, device, rep_ms).items():
                samples[side].setdefault(key, []).append(res)
            if progress is not None:
                progress.write_text(json.dumps({"samples": samples}))
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return samples, summarise(samples, [x.key for x in rows], threshold)


def _rows(a) -> list[Row]:
    from . import specs, suite

    functions = specs.resolve(a.functions)
    if a.shapes is None and a.dtypes is None and not a.time_major:
        rows = quick_rows(functions)
        if a.device == "cpu":
            rows = [Row(r.function, *suite.CPU_SHAPES[0], r.dtype) for r in rows if r.dtype == "float32"]
            rows = list(dict.fromkeys(rows))
        return rows
    shapes = suite.parse_shapes(a.shapes) if a.shapes else [(64, 512), (4096, 2048)]
    dtypes = (a.dtypes or "float32").split(",")
    return [Row(f, n, t, d.strip(), a.time_major) for f in functions for d in dtypes for n, t in shapes]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("base", nargs="?", help="commit, tag or branch (or a directory holding a tree) to compare with")
    ap.add_argument("--head", default=str(REPO), help="the tree measured against BASE (default: this working tree)")
    ap.add_argument("--functions", default=None, help="e.g. gae,vtrace (default: all seven)")
    ap.add_argument("--shapes", default=None, help="NxT list, e.g. 4096x2048,64x262144 (default: the quick suite's)")
    ap.add_argument("--dtypes", default=None, help="e.g. float32,bfloat16 (default float32)")
    ap.add_argument("--time-major", action="store_true", help="inputs as x.T views of [T, N] buffers")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: plumbing only")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of every row (at least 2: a spread needs two)")
    ap.add_argument("--max-rounds", type=int, default=4, help="rounds of the rows that look slower")
    ap.add_argument("--threshold", type=float, default=THRESHOLD, help="allowed slow-down beyond the spread")
    ap.add_argument("--rep-ms", type=float, default=40.0, help="do_bench's repetition time per row (ms)")
    ap.add_argument("--json", default=None, help="also write every sample and the table to this file")
    ap.add_argument("--markdown", default=None, help="also write the table to this file")
    ap.add_argument("--grid", default=None, help="also write the table as grids of functions by shapes to this file")
    ap.add_argument("--from-json", default=None, metavar="FILES", help="no run: --grid from these --json files (a,b)")
    ap.add_argument("--touched", action="store_true", help="time only the configurations whose compiled code differs")
    ap.add_argument(
        "--jobs",
        type=int,
        default=min(os.cpu_count() or 1, 16),
        help="processes at once for compiling (--touched) and the untimed warm-up pass; 1: neither in parallel",
    )
    ap.add_argument("--worker", nargs=3, metavar=("TREE", "ROWS", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--code", action="store_true", help=argparse.SUPPRESS)  # the worker compiles, not times
    a = ap.parse_args(argv)
    if a.worker:
        tree, rows, out = a.worker
        rows = json.loads(Path(rows).read_text())
        result = code_worker(Path(tree), rows) if a.code else worker(Path(tree), rows, a.device, a.rep_ms)
        Path(out).write_text(json.dumps(result))
        return 0
    if a.from_json:
        if not a.grid:
            ap.error("--from-json writes --grid")
        tables = [json.loads(Path(f).read_text())["table"] for f in a.from_json.split(",")]
        Path(a.grid).write_text(grid([r for t in tables for r in t]))
        return 0
    if not a.base:
        ap.error("BASE is required")
    if a.rounds < 2:
        ap.error("--rounds: at least 2 (the spread of a row needs two rounds)")
    rows = _rows(a)
    head = Path(a.head).resolve()
    t0 = time.time()
    with checked_out(a.base) as (base_tree, base_label):
        same = []
        if a.touched:
            codes = compiled_codes({"base": base_tree, "head": head}, rows, a.jobs)
            rows, same = touched(codes, rows)
            print(_listing(codes, rows, same), end="")
            if not rows or a.device == "cpu":
                return 0
        samples, table = run(
            base_tree, head, rows, device=a.device, rounds=a.rounds, max_rounds=max(a.rounds, a.max_rounds),
            threshold=a.threshold, rep_ms=a.rep_ms, progress=Path(a.json) if a.json else None, jobs=a.jobs,
        )  # fmt: skip
    head_label = tree_label(head)
    text = markdown(table, base_label, head_label)
    bad = failed(table)
    control = next(r for r in table if r["row"] == CONTROL)
    notes = [f"{len(rows)} configurations, {a.device}, {time.time() - t0:.0f} s; threshold {a.threshold:.0%}"]
    if same:
        notes.append(f"{len(same)} more of the same code in both trees, not timed (--touched)")
    if control.get("verdict") not in (None, "error") and abs(control["ratio"] - 1) > a.threshold:
        notes.append(f"the control moved by {control['ratio'] - 1:+.1%}: the machine changed between processes")
    if a.device == "cpu":
        notes.append("--device cpu: the times of this run mean nothing (plumbing only)")
    summary = f"{len(bad)} row(s) slower than {base_label} beyond the threshold and spread" if bad else "no regression"
    print(text + "\n" + "; ".join(notes) + "\n" + summary)
    if a.markdown:
        Path(a.markdown).write_text(text)
    if a.grid:
        Path(a.grid).write_text(grid(table))
    if a.json:
        ratios = [r["ratio"] for r in table if "ratio" in r and r["row"] != CONTROL]
        meta = {"base": base_label, "head": head_label, "device": a.device, "threshold": a.threshold,
                "median_ratio": statistics.median(ratios) if ratios else None}  # fmt: skip
        Path(a.json).write_text(json.dumps({"meta": meta, "table": table, "samples": samples}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
