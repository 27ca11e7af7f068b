"""The benchmark runner: ``python -m benchmarks`` (see benchmarks/README.md).

Checks rl_triton and every baseline against the float64 reference, times them over the
configurations, records the host floors (``benchmarks.floors``: the full-call time of the cheapest
eager calls on the same machine), prints a markdown table, and (unless ``--no-update``) writes the run's JSON to
``OUT_DIR/<date>-<gpu-slug>[-quick].json`` and stages its table in ``OUT_DIR/unreleased.md``.
Both files are rewritten after every configuration, so an interrupted run keeps what it measured.
"""

from __future__ import annotations

import argparse
import sys
import time
import traceback
from pathlib import Path

import torch

from . import baselines as B
from . import floors, llm, report, specs, suite, timing, torch_impls
from .torch_impls import C_BAR


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="rl_triton benchmark suite: kernel time, full-call time, GB/s, fraction of copy bandwidth "
        "and speedups over TorchRL, an eager PyTorch loop and torch.compile.",
    )
    ap.add_argument("--quick", action="store_true", help="a small set of configurations (about a minute on an H200)")
    ap.add_argument("--gpu", default=None, help="label of the machine (default: torch.cuda.get_device_name(0))")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the PyTorch path; 4x16 unless --shapes)")
    ap.add_argument("--no-update", action="store_true", help="print only: write no JSON and leave unreleased.md alone")
    ap.add_argument("--out-dir", default=str(report.DEFAULT_OUT_DIR), help="where the JSON and unreleased.md go")
    ap.add_argument("--json", default=None, help="also write the results JSON to this path (even with --no-update)")
    ap.add_argument(
        "--functions",
        default=None,
        help="comma-separated subset, e.g. gae,vtrace or compute_gae; llm (or llm_gae,llm_rpp,llm_grpo,llm_rloo) "
        "for the token-level estimators",
    )
    ap.add_argument("--dtypes", default=None, help="comma-separated subset of float32,bfloat16,float16")
    ap.add_argument("--shapes", default=None, help="override the configurations: NxT list, e.g. 64x512,4096x2048")
    ap.add_argument("--baselines", default=None, help=f"comma-separated subset of {','.join(B.BASELINES)}")
    ap.add_argument(
        "--compile-variants",
        default=None,
        help="scans tried for torch.compile: subset of assoc,chunked,doubling,cumprod (default: see README)",
    )
    ap.add_argument("--groups", default=None, help="group sizes of the token-level GRPO / RLOO rows (default 8,64)")
    ap.add_argument("--no-floors", action="store_true", help="skip the host floors (benchmarks/floors.py)")
    ap.add_argument("--compile-on-cpu", action="store_true", help="with --device cpu: really torch.compile (slow)")
    ap.add_argument("--commit", default=None, help="commit to record (default: git rev-parse HEAD, if git works)")
    return ap


def _configs(args, functions, device) -> list[suite.Config]:
    if args.dtypes:
        dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        bad = [d for d in dtypes if d not in suite.DTYPES]
        if bad:
            raise SystemExit(f"unknown dtype(s) {bad}; known: {', '.join(suite.DTYPES)}")
    else:
        dtypes = None
    if args.shapes:
        return suite.custom_configs(functions, suite.parse_shapes(args.shapes), dtypes or ["float32"])
    if device.type == "cpu":
        return suite.custom_configs(functions, suite.CPU_SHAPES, dtypes or ["float32"])
    if args.quick:
        cfgs = suite.quick_configs(functions)
        return [c for c in cfgs if dtypes is None or c.dtype in dtypes]
    return suite.full_configs(functions, dtypes or ["float32", "bfloat16"])


def _llm_configs(args, functions, device) -> list[llm.Config]:
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()] if args.dtypes else None
    groups = [int(g) for g in args.groups.split(",") if g.strip()] if args.groups else None
    shapes = suite.parse_shapes(args.shapes) if args.shapes else None
    return llm.configs(
        functions, quick=args.quick, device_type=device.type, shapes=shapes, dtypes=dtypes, groups=groups
    )


def summary(row: dict) -> str:
    group = f" groups of {row['group_size']}" if row.get("group_size") else ""
    head = f"{row['function']} {row['num_envs']}x{row['seq_len']}{group} {row['dtype']}"
    if "error" in row:
        return f"{head}: ERROR {row['error']}"
    text = (
        f"{head}: kernel {report.fmt_us(row['kernel_us'])}, call {report.fmt_us(row['full_call_us'])}, "
        f"{row['GBps']:.0f} GB/s = {row['fraction_of_copy']:.2f} of copy, err {row['err']:.1e}"
        + ("" if row["correct"] else " (WRONG)")
    )
    parts = []
    for b in row.get("baselines", []):
        if b["status"] == "ok":
            v = f" {b['variant']}" if b.get("variant") else ""
            parts.append(f"{b['name']}{v} {report.fmt_x(b['speedup'])}")
        elif b["status"] == "incorrect":
            parts.append(f"{b['name']} incorrect ({b.get('err', float('nan')):.1e})")
        elif b["status"] == "failed":
            parts.append(f"{b['name']} failed ({b.get('reason', '')[:80]})")
        else:
            parts.append(f"{b['name']} skipped")
    text += (" | " + ", ".join(parts)) if parts else ""
    if row.get("targets"):
        text += " | targets: " + "; ".join(report.fmt_target(t) for t in row["targets"])
    return text


def _progress(items):
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is a dev dependency; run without a bar if it is missing
        return items, print
    tty = sys.stderr.isatty()  # in a log, redraw rarely: every redraw is another line of text
    interval = 0.1 if tty else 30
    bar = tqdm(items, desc="benchmarks", unit="config", dynamic_ncols=tty, mininterval=interval, file=sys.stderr)
    return bar, tqdm.write


def main(argv: list[str] | None = None) -> dict:
    args = _parser().parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("CUDA is not available: run on a GPU machine, or pass --device cpu for a smoke run")
    if device.type not in ("cuda", "cpu"):
        raise SystemExit(f"--device must be cuda or cpu, got {args.device!r}")
    try:
        functions, llm_functions = llm.split_functions(args.functions)
        chosen = llm.resolve_baselines(args.baselines)
        variants = tuple(v.strip() for v in args.compile_variants.split(",")) if args.compile_variants else None
        if variants and any(v not in torch_impls.SCANS for v in variants):
            raise ValueError(f"unknown compile variant in {variants}; known: {', '.join(torch_impls.SCANS)}")
        configs = _configs(args, functions, device) + _llm_configs(args, llm_functions, device)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None

    gpu = args.gpu or (torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu")
    mode = "quick" if args.quick else ("custom" if args.shapes or device.type == "cpu" else "full")
    budget = timing.CPU if device.type == "cpu" else (timing.QUICK if args.quick else timing.FULL)
    opts = B.Options(
        device=device,
        quick=args.quick,
        budget=budget,
        baselines=chosen,
        compile_variants=variants,
        compile_on_cpu=args.compile_on_cpu,
    )
    meta = report.collect_meta(gpu=gpu, device=device, mode=mode, commit=args.commit, argv=list(argv or sys.argv[1:]))
    meta |= {
        "hyperparameters": {"gamma": specs.GAMMA, "lambda": specs.LAMBDA, "rho_bar": specs.RHO_BAR, "c_bar": C_BAR},
        "data": {"p_term": specs.P_TERM, "p_trunc": specs.P_TRUNC, "num_actions": specs.NUM_ACTIONS},
        "tolerance": {str(k).removeprefix("torch."): v for k, v in specs.TOLERANCE.items()},
        "budget": vars(budget) if hasattr(budget, "__dict__") else str(budget),
    }
    if llm_functions:
        meta["llm"] = llm.meta()
    results = {"meta": meta, "rows": []}
    out_dir = Path(args.out_dir)
    json_path = None if args.no_update else out_dir / report.json_name(meta)
    if json_path is not None:
        meta["json"] = json_path.name
    extra_json = Path(args.json) if args.json else None

    print(report.provenance(meta), flush=True)
    if not meta["times_meaningful"]:
        print("NOTE: times are meaningless in this run (CPU device or Triton interpreter)", flush=True)
    print(f"{len(configs)} configurations", flush=True)

    start = time.perf_counter()
    if not args.no_floors:
        shape = floors.SHAPE if device.type == "cuda" else suite.CPU_SHAPES[0]
        results["floors"] = floors.measure(device, budget, shape)
        print(report.floors_line(results["floors"]), flush=True)
        _save(results, json_path, extra_json, out_dir)
    bar, write = _progress(configs)
    for cfg in bar:
        if hasattr(bar, "set_postfix_str"):
            bar.set_postfix_str(cfg.describe(), refresh=False)
        try:
            row = llm.measure(cfg, opts) if isinstance(cfg, llm.Config) else suite.measure(cfg, opts)
        except Exception as exc:  # one broken configuration must not lose the others
            row = {
                "function": cfg.function,
                "num_envs": cfg.num_envs,
                "seq_len": cfg.seq_len,
                "dtype": cfg.dtype,
                "family": cfg.family,
                **({"group_size": cfg.group_size} if getattr(cfg, "group_size", None) else {}),
                "error": f"{type(exc).__name__}: {exc}"[:500],
                "traceback": traceback.format_exc(limit=6),
            }
        results["rows"].append(row)
        write(summary(row))
        meta["elapsed_s"] = time.perf_counter() - start
        _save(results, json_path, extra_json, out_dir)
    meta["elapsed_s"] = time.perf_counter() - start
    _save(results, json_path, extra_json, out_dir)
    print()
    print(report.table(results["rows"]))
    if "floors" in results:
        print(report.floors_table(results["floors"]))
    if any(r.get("targets") for r in results["rows"]):
        print(report.targets_table(results["rows"]))
    print(f"done in {meta['elapsed_s']:.0f} s", end="")
    print(f"; wrote {json_path} and {out_dir / report.UNRELEASED}" if json_path else " (--no-update: nothing written)")
    return results


def _save(results: dict, json_path: Path | None, extra_json: Path | None, out_dir: Path) -> None:
    if json_path is not None:
        report.write_json(results, json_path)
        report.stage(results, out_dir)
    if extra_json is not None:
        report.write_json(results, extra_json)


if __name__ == "__main__":
    main()
