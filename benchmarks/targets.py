"""The performance table (docs/performance.md): every function at the target shapes on a GPU, rl_triton only
(the baselines are the benchmark suite's job). Per row: kernel time (do_bench median of a CUDA-graph
replay, L2 flushed), minimum bytes, fraction of a device-to-device copy of the same bytes timed in
the same run, and full-call time (CUDA events around one public call, median after warm-up).
Also bfloat16 at the large shapes (speedup over float32) and Retrace with 18 actions.

Usage: python -m benchmarks.targets [--quick] [--out results.json] [--markdown table.md] [--page tables.md]
"""

from __future__ import annotations

import argparse
import json
import platform
import time

import torch
import triton

from . import report, specs, timing

FUNCTIONS = list(specs.SPECS)
LARGE = [(4096, 2048), (16384, 512), (8192, 4096)]
LONG = [(1, 16777216), (16, 1048576), (64, 262144), (1, 1048576)]
SHORT = [(1048576, 8), (262144, 32), (65536, 128), (32768, 8), (4096, 128)]
COMMON = [(64, 512)]

# Targets: minimum fraction of copy per family, and absolute kernel-time targets (us).
FRACTION_TARGET = {"large": 0.85, "long": 0.50, "short": 0.60}
FRACTION_TARGET_LARGE = {"compute_vtrace": 0.80, "compute_retrace": 0.70}
TIME_TARGET_US = {(1, 1048576): 15.0, (32768, 8): 5.0, (4096, 128): 5.0}
FULL_CALL_TARGET_US = {("compute_gae", 64, 512): 8.0}
BF16_SPEEDUP_TARGET = 1.7


def family(n: int, t: int) -> str:
    for name, shapes in (("large", LARGE), ("long", LONG), ("short", SHORT)):
        if (n, t) in shapes:
            return name
    return "common"


def fraction_target(fn: str, n: int, t: int) -> float | None:
    fam = family(n, t)
    if fam == "large":
        return FRACTION_TARGET_LARGE.get(fn, FRACTION_TARGET["large"])
    return FRACTION_TARGET.get(fam)


def measure(fn: str, n: int, t: int, dtype=torch.float32, num_actions: int = 4) -> dict:
    device = torch.device("cuda")
    spec = specs.SPECS[fn]
    saved, specs.NUM_ACTIONS = specs.NUM_ACTIONS, num_actions
    try:
        x = specs.Inputs(n, t, dtype, device)
        nbytes = spec.nbytes(x)
        with torch.no_grad():
            k_us = timing.kernel_us(lambda: spec.primary(x), device, timing.QUICK, graph=True)
            call_us = timing.full_call_us(lambda _: spec.primary(x), device, timing.QUICK)
        copy = timing.copy_gbps(nbytes, device, timing.QUICK)
    finally:
        specs.NUM_ACTIONS = saved
    x.release()
    torch.cuda.empty_cache()
    gbps = nbytes / (k_us * 1e-6) / 1e9
    return {
        "function": fn, "num_envs": n, "seq_len": t, "dtype": str(dtype).removeprefix("torch."),
        "num_actions": num_actions if fn == "compute_retrace" else None, "family": family(n, t),
        "kernel_us": k_us, "full_call_us": call_us, "bytes": nbytes, "GBps": gbps, "copy_GBps": copy,
        "fraction_of_copy": gbps / copy, "fraction_target": fraction_target(fn, n, t),
        "time_target_us": TIME_TARGET_US.get((n, t)), "full_call_target_us": FULL_CALL_TARGET_US.get((fn, n, t)),
    }  # fmt: skip


def jobs(quick: bool) -> list[tuple]:
    shapes = LARGE[:1] + LONG[3:] + SHORT[3:] + COMMON if quick else LARGE + LONG + SHORT + COMMON
    out = [(fn, n, t, torch.float32, 4) for fn in FUNCTIONS for n, t in shapes]
    out += [("compute_retrace", n, t, torch.float32, 18) for n, t in LARGE[: 1 if quick else 3]]
    out += [(fn, n, t, torch.bfloat16, 4) for fn in FUNCTIONS for n, t in LARGE[: 1 if quick else 3]]
    return out


def verdicts(rows: list[dict]) -> list[dict]:
    """Adds pass/miss against the targets (and the bf16 speedup) to each row."""
    fp32 = {(r["function"], r["num_envs"], r["seq_len"], r["num_actions"]): r for r in rows if r["dtype"] == "float32"}
    for r in rows:
        checks = []
        if r["dtype"] == "float32" and r["fraction_target"] is not None:
            checks.append(r["fraction_of_copy"] >= r["fraction_target"])
        if r["dtype"] == "float32" and r["time_target_us"] is not None:
            checks.append(r["kernel_us"] <= r["time_target_us"])
        if r["full_call_target_us"] is not None:
            checks.append(r["full_call_us"] <= r["full_call_target_us"])
        if r["dtype"] == "bfloat16":
            base = fp32.get((r["function"], r["num_envs"], r["seq_len"], r["num_actions"]))
            if base is not None:
                r["speedup_over_float32"] = base["kernel_us"] / r["kernel_us"]
                # what a device-to-device copy of each dtype's bytes gains, timed the same way: the
                # ceiling of the speedup for kernels that run at the copy's bandwidth
                r["copy_speedup_over_float32"] = (base["bytes"] / base["copy_GBps"]) / (r["bytes"] / r["copy_GBps"])
                checks.append(r["speedup_over_float32"] >= BF16_SPEEDUP_TARGET)
        r["meets_targets"] = all(checks) if checks else None
    return rows


def markdown(rows: list[dict]) -> str:
    head = "| function | shape | dtype | kernel µs | fraction of copy (target) | full call µs | meets |\n"
    head += "| --- | --- | --- | ---: | ---: | ---: | --- |\n"
    lines = []
    for r in rows:
        fn = r["function"].removeprefix("compute_") + (f" A={r['num_actions']}" if r["num_actions"] == 18 else "")
        tgt = f" ({r['fraction_target']:.2f})" if r["fraction_target"] is not None and r["dtype"] == "float32" else ""
        extra = f", {r['speedup_over_float32']:.2f}× fp32" if "speedup_over_float32" in r else ""
        if "copy_speedup_over_float32" in r:
            extra += f" (copy {r['copy_speedup_over_float32']:.2f}×)"
        t_tgt = f" (≤ {r['time_target_us']:g})" if r["time_target_us"] and r["dtype"] == "float32" else ""
        meets = {True: "yes", False: "**no**", None: ""}[r["meets_targets"]]
        lines.append(
            f"| {fn} | {r['num_envs']}×{r['seq_len']} | {r['dtype']} | {r['kernel_us']:.1f}{t_tgt} | "
            f"{r['fraction_of_copy']:.2f}{tgt}{extra} | {r['full_call_us']:.1f} | {meets} |"
        )
    return head + "\n".join(lines) + "\n"


PAGE_LABELS = {fn: f"`{fn}`" for fn in FUNCTIONS} | {"compute_retrace": "`compute_retrace` (4 actions)"}
PAGE_TABLES = (  # the tables of docs/performance.md: (dtype, shapes, cell)
    ("float32", LARGE + LONG[:3], "kernel"),
    ("float32", LONG[3:] + SHORT + COMMON, "kernel"),
    ("bfloat16", LARGE, "bfloat16"),
    ("float32", [COMMON[0], LARGE[0], LONG[3]], "full call"),
)


def _us(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def _cell(r: dict, kind: str) -> str:
    if kind == "kernel":
        return f"{_us(r['kernel_us'])} ({r['fraction_of_copy']:.2f})"
    if kind == "bfloat16":
        return (
            f"{_us(r['kernel_us'])} ({r['fraction_of_copy']:.2f}, {r['speedup_over_float32']:.2f}×; "
            f"copy {r['copy_speedup_over_float32']:.2f}×)"
        )
    return f"{r['full_call_us']:.1f} ({r['kernel_us']:.1f})"


def page_tables(rows: list[dict]) -> list[str]:
    """The kernel-time and full-call tables of docs/performance.md from a run's rows (after :func:`verdicts`):
    functions by shapes, Retrace with 18 actions as a row of the first table."""
    by_key = {(r["function"], r["num_envs"], r["seq_len"], r["dtype"], r["num_actions"] or 4): r for r in rows}
    tables = []
    for dtype, shapes, kind in PAGE_TABLES:
        lines = ["| function | " + " | ".join(f"{n:,}×{t:,}" for n, t in shapes) + " |"]
        lines.append("| --- |" + " ---: |" * len(shapes))
        labels = [(fn, 4, PAGE_LABELS[fn]) for fn in FUNCTIONS]
        if kind == "kernel" and shapes[0] in LARGE:
            at = FUNCTIONS.index("compute_retrace") + 1
            labels.insert(at, ("compute_retrace", 18, "`compute_retrace` (18 actions)"))
        if kind == "full call":
            labels = [(fn, a, f"`{fn}`") for fn, a, _label in labels]
        for fn, a, label in labels:
            cells = [by_key.get((fn, n, t, dtype, a)) for n, t in shapes]
            lines.append(f"| {label} | " + " | ".join(_cell(r, kind) if r else "" for r in cells) + " |")
        tables.append("\n".join(lines))
    return tables


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="one shape per family")
    ap.add_argument("--out", default=None)
    ap.add_argument("--markdown", default=None)
    ap.add_argument("--page", default=None, help="also write the tables of docs/performance.md to this file")
    args = ap.parse_args()
    t0 = time.time()
    rows = []
    for fn, n, t, dtype, a in jobs(args.quick):
        try:
            rows.append(measure(fn, n, t, dtype, a))
        except Exception as exc:  # noqa: BLE001 - report and go on (e.g. out of memory)
            print(f"{fn} {n}x{t} {dtype}: failed {type(exc).__name__}: {exc}"[:300])
            continue
        r = rows[-1]
        print(
            f"{fn} {n}x{t} {r['dtype']}{' A=18' if a == 18 else ''}: kernel {r['kernel_us']:.1f} us = "
            f"{r['fraction_of_copy']:.2f} of copy, call {r['full_call_us']:.1f} us",
            flush=True,
        )
    rows = verdicts(rows)
    meta = {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(), "commit": report.git_commit()[0], "seconds": time.time() - t0,
    }  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(rows))
    if args.page:
        with open(args.page, "w") as f:
            f.write("\n\n".join(page_tables(rows)) + "\n")


if __name__ == "__main__":
    main()
