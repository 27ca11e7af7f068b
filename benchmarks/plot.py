"""Plots of one results JSON (matplotlib, Agg backend):

    python -m benchmarks.plot JSON OUTDIR

* ``throughput.png``: GB/s (minimum bytes / kernel time) against problem size N*T, one panel per
  function, one series per dtype and shape family, with the copy bandwidth measured for the same
  bytes as a dashed ceiling.
* ``speedup_torchrl.png``: speedup over each TorchRL baseline (full-call time ratio) against N*T,
  one panel per function that has one; the dotted line is parity.
* ``speedup_compile.png``: the same over torch.compile and the eager loop.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from . import report
from .report import TITLES

MARKERS = {"grid": "o", "long": "s", "short": "^", "quick": "D", "custom": "x"}
COLORS = {"float32": "tab:blue", "bfloat16": "tab:orange", "float16": "tab:green"}
BASELINE_COLORS = {
    "torchrl_vec": "tab:blue",
    "torchrl_loop": "tab:red",
    "torchrl_module": "tab:purple",
    "torchrl_module_vec": "tab:cyan",
    "eager": "tab:brown",
    "compile": "tab:green",
}
DTYPE_STYLE = {"float32": "-", "bfloat16": "--", "float16": ":"}


def _ok_rows(results):
    return [r for r in results["rows"] if "error" not in r]


def _grid(n_panels: int):
    import matplotlib.pyplot as plt

    cols = min(n_panels, 3)
    rows = math.ceil(n_panels / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5.2 * cols, 3.9 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[n_panels:]:
        ax.set_visible(False)
    return fig, flat[:n_panels]


def _title(meta: dict, what: str) -> str:
    t = f"rl_triton {what} — {meta['gpu']}, torch {meta['torch']}, triton {meta['triton']}, {meta['date']}"
    if not meta.get("times_meaningful", False):
        t += "\n(smoke run: times are meaningless)"
    return t


def _finish_panel(ax, fn: str, ylabel: str) -> None:
    """Log-log axes over the problem size, one panel per function."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_title(fn, fontsize=10)
    ax.set_xlabel("problem size N×T (elements)")
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def throughput(results: dict, out: Path) -> Path:
    import matplotlib.pyplot as plt

    rows = _ok_rows(results)
    functions = list(dict.fromkeys(r["function"] for r in rows))
    fig, axes = _grid(max(1, len(functions)))
    for ax, fn in zip(axes, functions, strict=False):
        fn_rows = [r for r in rows if r["function"] == fn]
        for dtype in dict.fromkeys(r["dtype"] for r in fn_rows):
            for fam in dict.fromkeys(r["family"] for r in fn_rows if r["dtype"] == dtype):
                pts = sorted(
                    (r for r in fn_rows if r["dtype"] == dtype and r["family"] == fam),
                    key=lambda r: r["num_envs"] * r["seq_len"],
                )
                xs = [r["num_envs"] * r["seq_len"] for r in pts]
                ax.plot(
                    xs,
                    [r["GBps"] for r in pts],
                    marker=MARKERS.get(fam, "o"),
                    color=COLORS.get(dtype, "k"),
                    linestyle=DTYPE_STYLE.get(dtype, "-"),
                    linewidth=1,
                    label=f"{dtype} {fam}",
                )
        copy = sorted({(r["num_envs"] * r["seq_len"], r["copy_GBps"]) for r in fn_rows})
        if copy:
            ax.plot([c[0] for c in copy], [c[1] for c in copy], "k--", linewidth=1, alpha=0.6, label="copy (ceiling)")
        _finish_panel(ax, fn, "GB/s (minimum bytes / kernel time)")
    fig.suptitle(_title(results["meta"], "throughput"), fontsize=10)
    fig.tight_layout()
    path = out / "throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def speedups(results: dict, out: Path, names: tuple[str, ...], filename: str, what: str) -> Path | None:
    import matplotlib.pyplot as plt

    rows = _ok_rows(results)
    have = [
        fn
        for fn in dict.fromkeys(r["function"] for r in rows)
        if any(b["name"] in names and b["status"] == "ok" for r in rows if r["function"] == fn for b in r["baselines"])
    ]
    if not have:
        return None
    fig, axes = _grid(len(have))
    for ax, fn in zip(axes, have, strict=False):
        fn_rows = [r for r in rows if r["function"] == fn]
        for name in names:
            for dtype in dict.fromkeys(r["dtype"] for r in fn_rows):
                pts = sorted(
                    (
                        (r["num_envs"] * r["seq_len"], b["speedup"])
                        for r in fn_rows
                        if r["dtype"] == dtype
                        for b in r["baselines"]
                        if b["name"] == name and b["status"] == "ok"
                    ),
                )
                if not pts:
                    continue
                ax.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    marker="o",
                    linestyle=DTYPE_STYLE.get(dtype, "-"),
                    color=BASELINE_COLORS.get(name, "k"),
                    linewidth=1,
                    label=f"vs {TITLES[name]} ({dtype})",
                )
        ax.axhline(1.0, color="k", linestyle=":", linewidth=1)
        _finish_panel(ax, fn, "speedup (full-call time ratio)")
    fig.suptitle(_title(results["meta"], what), fontsize=10)
    fig.tight_layout()
    path = out / filename
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> list[Path]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.plot", description="Plots of a benchmark results JSON")
    ap.add_argument("json", help="results JSON written by python -m benchmarks")
    ap.add_argument("outdir", help="directory for the PNG files")
    args = ap.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    try:
        results = report.load_json(args.json)
    except ValueError as exc:
        raise SystemExit(f"{args.json}: {exc}") from None
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    written = [throughput(results, out)]
    trl = ("torchrl_vec", "torchrl_loop", "torchrl_module", "torchrl_module_vec")
    written.append(speedups(results, out, trl, "speedup_torchrl.png", "speedup over TorchRL"))
    written.append(speedups(results, out, ("compile", "eager"), "speedup_compile.png", "speedup over PyTorch"))
    written = [p for p in written if p is not None]
    for p in written:
        print(f"wrote {p}")
    return written


if __name__ == "__main__":
    main()
