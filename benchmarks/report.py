"""Run metadata, JSON files, markdown tables and the staging file ``unreleased.md``."""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import subprocess
from pathlib import Path

SCHEMA = 1
# baseline names (benchmarks.baselines.BASELINES) -> column titles, in table order
TITLES = {
    "torchrl_vec": "TorchRL vec",
    "torchrl_loop": "TorchRL loop",
    "torchrl_module": "TorchRL module",
    "torchrl_module_vec": "TorchRL module vec",
    "eager": "eager loop",
    "verl_loop": "verl loop",
    "torch_vec": "vectorised PyTorch",
    "compile": "torch.compile",
}
REPO = Path(__file__).resolve().parents[1]
DEFAULT_OUT_DIR = REPO / "docs" / "benchmark-history"
RELEASE_TABLE = REPO / "docs" / "benchmarks.md"
UNRELEASED = "unreleased.md"

ROW_KEYS = ("function", "num_envs", "seq_len", "dtype", "family")
METRIC_KEYS = ("kernel_us", "full_call_us", "bytes", "GBps", "copy_GBps", "fraction_of_copy", "err", "correct")
META_KEYS = ("gpu", "device", "torch", "triton", "python", "commit", "date", "mode", "times_meaningful")
BASELINE_STATUSES = ("ok", "incorrect", "skipped", "failed")


def slug(label: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    return s or "unknown"


def git_commit(repo: Path = REPO) -> tuple[str | None, bool | None]:
    """(commit hash, working tree dirty) or (None, None) without git, and for a tree that is not the top of its own
    checkout (a copy of the sources unpacked inside another repository: that repository's commit is not its)."""
    try:
        top, commit = subprocess.run(
            ["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=repo, capture_output=True, text=True, timeout=10,
            check=True,
        ).stdout.splitlines()  # fmt: skip
        if Path(top).resolve() != Path(repo).resolve():
            return None, None
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=repo,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
        return commit or None, bool(status.strip())
    except Exception:
        return None, None


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
        return getattr(mod, "__version__", None)
    except Exception:
        return None


def collect_meta(*, gpu: str, device, mode: str, commit: str | None, argv: list[str]) -> dict:
    import torch

    import rl_triton

    if commit is None:
        commit, dirty = git_commit()
    else:
        dirty = None
    interpret = bool(rl_triton.INTERPRET)
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
        path = "Triton interpreter" if interpret else "Triton kernels"
    else:
        device_name = platform.processor() or platform.machine()
        path = "Triton interpreter" if interpret else "PyTorch path"
    now = _dt.datetime.now(_dt.timezone.utc)
    meta = {
        "schema": SCHEMA,
        "gpu": gpu,
        "device": device.type,
        "device_name": device_name,
        "torch": torch.__version__,
        "triton": _version("triton"),
        "python": platform.python_version(),
        "torchrl": _version("torchrl"),
        "tensordict": _version("tensordict"),
        "rl_triton": rl_triton.__version__,
        "cuda": torch.version.cuda,
        "commit": commit,
        "dirty": dirty,
        "date": now.date().isoformat(),
        "datetime": now.isoformat(timespec="seconds"),
        "mode": mode,
        "argv": argv,
        "rl_triton_path": path,
        # on the CPU the functions run the PyTorch path, timed as a user's call (not under the interpreter)
        "times_meaningful": device.type in ("cuda", "cpu") and not interpret,
        "timing": (
            "kernel: triton.testing.do_bench median of a CUDA-graph replay of the call (L2 flushed); "
            "full call: CUDA events, median after warm-up"
            if device.type == "cuda"
            else "full call: time.perf_counter median on the CPU after warm-up (the PyTorch path)"
        ),
        "cudnn_allow_tf32": torch.backends.cudnn.allow_tf32,
        "matmul_precision": torch.get_float32_matmul_precision(),
    }
    return meta


def json_name(meta: dict) -> str:
    suffix = "-quick" if meta.get("mode") == "quick" else ""
    return f"{meta['date']}-{slug(meta['gpu'])}{suffix}.json"


def write_json(results: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(results, indent=1, default=str) + "\n")
    os.replace(tmp, path)


def load_json(path) -> dict:
    data = json.loads(Path(path).read_text())
    validate(data)
    return data


def validate(data: dict) -> None:
    """Raises ValueError unless ``data`` looks like a results file of this schema."""
    if not isinstance(data, dict) or "meta" not in data or "rows" not in data:
        raise ValueError("results must be a dict with 'meta' and 'rows'")
    meta = data["meta"]
    if meta.get("schema") != SCHEMA:
        raise ValueError(f"unsupported schema {meta.get('schema')!r} (expected {SCHEMA})")
    missing = [k for k in META_KEYS if k not in meta]
    if missing:
        raise ValueError(f"meta lacks {missing}")
    for row in data["rows"]:
        lacking = [k for k in ROW_KEYS if k not in row]
        if lacking:
            raise ValueError(f"row lacks {lacking}: {row}")
        if "error" in row:
            continue
        lacking = [k for k in METRIC_KEYS if k not in row]
        if lacking:
            raise ValueError(f"row {row['function']} {row['num_envs']}x{row['seq_len']} lacks {lacking}")
        for b in row.get("baselines", []):
            if b.get("status") not in BASELINE_STATUSES or "name" not in b:
                raise ValueError(f"bad baseline entry {b}")
            if b["status"] == "ok" and not {"full_call_us", "speedup", "err"} <= b.keys():
                raise ValueError(f"baseline {b['name']} is ok but lacks timings: {b}")
    if "floors" in data:
        floors = data["floors"]
        if not isinstance(floors, dict) or len(floors.get("shape", ())) != 2:
            raise ValueError(f"bad floors entry {floors}")
        for r in floors.get("rows", []):
            if not {"name", "full_call_us"} <= r.keys():
                raise ValueError(f"bad floors row {r}")


# --------------------------------------------------------------------------------------------
# markdown


def fmt_us(us) -> str:
    if us is None:
        return "—"
    if us >= 1e6:
        return f"{us / 1e6:.2f} s"
    if us >= 1e3:
        return f"{us / 1e3:.2f} ms"
    return f"{us:.1f} µs"


def fmt_x(x) -> str:
    """A speedup: 3 significant digits below 100, none above."""
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:,.0f}×"
    if x >= 10:
        return f"{x:.1f}×"
    if x >= 1:
        return f"{x:.2f}×"
    return f"{x:.3f}×"


def fmt_num(x, digits=0) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def fmt_shape(n: int, t: int) -> str:
    return f"{n:,}×{t:,}"


def _baseline_cell(b: dict | None) -> str:
    if b is None:
        return ""
    status = b["status"]
    if status == "ok":
        extra = f", {b['variant']}" if b.get("variant") else ""
        return f"**{fmt_x(b['speedup'])}** ({fmt_us(b['full_call_us'])}{extra})"
    if status == "incorrect":
        return f"incorrect (err {b['err']:.1e})" if b.get("err") is not None else "incorrect"
    return status  # skipped / failed: reasons are listed under the table


def baseline_columns(rows) -> list[str]:
    present = {b["name"] for r in rows for b in r.get("baselines", [])}
    return [n for n in TITLES if n in present]


def table(rows: list[dict], *, with_function: bool = True) -> str:
    """Markdown table of result rows (one line per configuration) with footnotes for skipped,
    failed and incorrect baselines."""
    cols = baseline_columns(rows)
    head = (["function"] if with_function else []) + ["N×T", "dtype", "kernel", "full call", "GB/s", "of copy", "err"]
    head += [f"vs {TITLES[c]}" for c in cols]
    align = (["---"] if with_function else []) + ["---:", "---", "---:", "---:", "---:", "---:", "---:"]
    align += ["---:"] * len(cols)
    lines = ["| " + " | ".join(head) + " |", "| " + " | ".join(align) + " |"]
    notes: dict[str, list[str]] = {}
    for r in rows:
        cells = [r["function"]] if with_function else []
        group = f" (groups of {r['group_size']})" if r.get("group_size") else ""
        cells += [fmt_shape(r["num_envs"], r["seq_len"]) + group, r["dtype"]]
        if "error" in r:
            cells += ["error"] + [""] * (4 + len(cols))
            notes.setdefault(f"run error: {r['error']}", []).append(_where(r))
            lines.append("| " + " | ".join(cells) + " |")
            continue
        err = f"{r['err']:.1e}" + ("" if r.get("correct", True) else " **WRONG**")
        cells += [
            fmt_us(r["kernel_us"]),
            fmt_us(r["full_call_us"]),
            fmt_num(r["GBps"]),
            f"{r['fraction_of_copy']:.2f}",
            err,
        ]
        by_name = {b["name"]: b for b in r.get("baselines", [])}
        for c in cols:
            b = by_name.get(c)
            cells.append(_baseline_cell(b))
            if b is not None and b["status"] in ("skipped", "failed", "incorrect"):
                notes.setdefault(f"{TITLES[c]} {b['status']}: {b.get('reason', '')}", []).append(_where(r))
        lines.append("| " + " | ".join(cells) + " |")
    out = "\n".join(lines) + "\n"
    if notes:
        out += "\n" + "\n".join(f"- {k} ({_compress(v)})" for k, v in notes.items()) + "\n"
    return out


def _target_parts(t: dict) -> tuple[str, str]:
    """(measured value, verdict) of one target of a token-level row (benchmarks.llm.targets)."""
    v = t.get("value")
    if v is None:
        shown = "not measured"
    elif t["metric"] == "kernel_us":
        shown = fmt_us(v)
    elif t["metric"].startswith("speedup"):
        shown = fmt_x(v)
    else:
        shown = f"{v:.2f}"
    return shown, "n/a" if t.get("met") is None else ("met" if t["met"] else "MISSED")


def fmt_target(t: dict) -> str:
    shown, verdict = _target_parts(t)
    return f"{t['target']}: {shown} ({verdict})"


def targets_table(rows: list[dict]) -> str:
    """Markdown table of the token-level targets (reported, not asserted)."""
    lines = [
        "Token-level targets:",
        "",
        "| function | B×T | target | measured | verdict |",
        "| --- | ---: | --- | ---: | --- |",
    ]
    for r in rows:
        for t in r.get("targets") or []:
            group = f" (groups of {r['group_size']})" if r.get("group_size") else ""
            shown, verdict = _target_parts(t)
            shape = fmt_shape(r["num_envs"], r["seq_len"]) + group
            lines.append(f"| {r['function']} | {shape} | {t['target']} | {shown} | {verdict} |")
    return "\n".join(lines) + "\n"


def _where(r: dict) -> str:
    return f"{r['function'].removeprefix('compute_')} {fmt_shape(r['num_envs'], r['seq_len'])} {r['dtype']}"


def _compress(places: list[str]) -> str:
    if len(places) <= 4:
        return "; ".join(places)
    return "; ".join(places[:3]) + f"; and {len(places) - 3} more"


def floors_table(floors: dict) -> str:
    """Markdown table of the host floors (benchmarks.floors)."""
    n, t = floors["shape"]
    lines = [
        f"Host floors at {fmt_shape(n, t)} float32 (full call, the same timer as above):",
        "",
        "| call | full call |",
        "| --- | ---: |",
    ]
    lines += [f"| {r['name']} | {fmt_us(r['full_call_us'])} |" for r in floors["rows"]]
    return "\n".join(lines) + "\n"


def floors_line(floors: dict) -> str:
    """One line of the host floors, for the console."""
    n, t = floors["shape"]
    parts = ", ".join(f"{r['name']} {fmt_us(r['full_call_us'])}" for r in floors["rows"])
    return f"host floors ({n}x{t}, full call): {parts}"


def provenance(meta: dict) -> str:
    commit = meta.get("commit") or "unknown commit"
    if meta.get("dirty"):
        commit += " (uncommitted changes)"
    parts = [
        f"**{meta['gpu']}** ({meta.get('device_name', '')})",
        f"{meta['mode']} run on {meta['date']}",
        f"torch {meta['torch']}, triton {meta['triton']}, Python {meta['python']}",
        f"TorchRL {meta.get('torchrl')}, tensordict {meta.get('tensordict')}",
        f"commit {commit}",
        f"rl_triton path: {meta.get('rl_triton_path')}",
    ]
    text = "; ".join(parts) + "."
    if not meta.get("times_meaningful", False):
        text += " **Times are meaningless (smoke run: CPU or Triton interpreter).**"
    return text


LEGEND = """Columns: *kernel* = `triton.testing.do_bench` median of a CUDA-graph replay of the call (GPU time
without the host's launch time; L2 flushed); *full call* =
CUDA events around one public call, median after warm-up; *GB/s* = the function's minimum bytes (inputs
read once, outputs written once, bool flags 1 byte) / kernel time; *of copy* = GB/s / the GB/s of a
device-to-device copy moving as many bytes, measured in the same run; *err* = max |error| / rms of the
float64 reference. *vs X* = X's full-call time / the full-call time of the rl_triton call with the same
semantics (bold; X's own time in brackets); `incorrect` baselines failed the float64 check and were not
timed."""


def section(results: dict, title: str | None = None) -> str:
    meta = results["meta"]
    title = title or f"{meta['gpu']} — {meta['mode']} run, {meta['date']}"
    body = [f"## {title}", "", provenance(meta), ""]
    if meta.get("json"):
        body += [f"JSON: `{meta['json']}`", ""]
    body += [table(results["rows"])]
    if any(r.get("targets") for r in results["rows"]):
        body += [targets_table(results["rows"])]
    if "floors" in results:
        body += [floors_table(results["floors"])]
    return "\n".join(body)


_BEGIN = "<!-- begin run: {key} -->"
_END = "<!-- end run: {key} -->"
UNRELEASED_HEADER = f"""# Unreleased benchmark results

Staged by `python -m benchmarks` (one section per GPU label and mode; a new run replaces its section).
`python -m benchmarks.promote JSON` writes the release table `docs/benchmarks.md` from one of the JSON
files next to this one. See `benchmarks/README.md`.

{LEGEND}
"""


def stage(results: dict, out_dir: Path) -> Path:
    """Writes/replaces this run's section of ``out_dir/unreleased.md``."""
    meta = results["meta"]
    key = f"{slug(meta['gpu'])}-{meta['mode']}"
    begin, end = _BEGIN.format(key=key), _END.format(key=key)
    block = f"{begin}\n{section(results)}\n{end}\n"
    path = Path(out_dir) / UNRELEASED
    text = path.read_text() if path.exists() else UNRELEASED_HEADER
    if begin in text and end in text:
        pre, rest = text.split(begin, 1)
        _, post = rest.split(end, 1)
        text = pre + block.rstrip("\n") + post
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text if text.endswith("\n") else text + "\n")
    return path
