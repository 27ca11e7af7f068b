"""Tile and split sweep of the fused kernels on a GPU: kernel time (do_bench median of a CUDA-graph
replay, L2 flushed), fraction of a device-to-device copy timed in the same run, registers and
spills of every compiled variant. The launcher's policy constants (``kernels/launch.py``) are
overridden per configuration; the results pick the defaults.

Usage: python -m benchmarks.tile_sweep [--quick] [--functions gae,vtrace] [--out results.json]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import platform
import time

import torch
import triton

try:
    from tqdm import tqdm
except ImportError:  # tqdm is a dev dependency; run without a bar if it is missing

    def tqdm(items, **_kw):
        return items

    tqdm.write = print

from rl_triton.kernels import launch

from . import specs, timing

# Shapes of the performance issue: large, short horizons, long sequences (+ the common 64x512).
LARGE = [(4096, 2048), (16384, 512), (8192, 4096)]
SHORT = [(1048576, 8), (262144, 32), (65536, 128), (32768, 8), (4096, 128)]
LONG = [(1, 16777216), (16, 1048576), (64, 262144), (1, 1048576)]
COMMON = [(64, 512)]

# Policy knobs (launch.py module constants) and the values tried.
TILE_GRID = {"_BLOCK": (1024, 2048, 4096), "_WARPS": (4, 8), "_MAX_BT": (1024, 2048)}
SPLIT_GRID = {"_TARGET_PROGRAMS": (528, 1056, 2112), "_MAX_BT": (1024, 2048), "_WARPS": (4, 8)}
# "_WARPS" sets the launcher's warps for every row length; "GROUPED" overrides the launcher's choice
# of tile form for the reverse recurrences (launch._group; Retrace: launch._grouped): "on"
# group-major, "env" env-major, "off" plain.
_WARP_KNOBS = ("_WARPS_LONG", "_WARPS_SHORT")
_GROUPED_FORMS = {
    "on": {"_group": launch._group_major, "_grouped": lambda tiles: True},
    "env": {"_group": lambda tiles, dtype: -4, "_grouped": lambda tiles: False},
    "off": {"_group": lambda tiles, dtype: 0, "_grouped": lambda tiles: False},
}


# Retrace's env-major kernel variants (launch.RetraceForm fields: launch._RETRACE_EXACT_T, ...), which
# _form reports where the launcher would pass them (rows' "variants").
_RETRACE_VARIANTS = ("exact_t", "shift", "pi_tile")
# Those of GAE, V-trace and the returns (launch.ScanForm fields: launch._EXACT_T).
_SCAN_VARIANTS = ("exact_t",)


def _retrace_env(flags: str, block: int | None = None, warps: int | None = None) -> dict:
    """A configuration of Retrace's env-major knobs: letters E (launch._RETRACE_EXACT_T), S (SHIFT),
    P (PI_TILE), at ``block`` steps per program and ``warps`` (None: the launcher's)."""
    letters = {"E": "_RETRACE_EXACT_T", "S": "_RETRACE_SHIFT", "P": "_RETRACE_PI_TILE"}
    knobs = {knob: letter in flags for letter, knob in letters.items()}
    return knobs | {"_RETRACE_ENV_MAJOR_BLOCK": block, "_RETRACE_ENV_MAJOR_WARPS": warps}


# Named lists of configurations for --configs. retrace_env: Retrace's env-major variants, the first
# being the form before them (tile_sweep_retrace_short_h200.json, which also has row-segment action
# tiles, a variant since removed); retrace_confirm: that form, the default, two partial variants and
# the default again (under a knob that changes nothing but the configuration's key: a second timing).
CONFIG_PRESETS = {
    "retrace_env": [
        _retrace_env(flags, block, warps)
        for flags, block, warps in [
            ("", None, None),
            ("", 1024, 4),
            ("E", 1024, 8),
            ("EP", 1024, 8),
            ("ES", 1024, 8),
            ("ESP", 1024, 8),
            ("E", 1024, 4),
            ("EP", 1024, 4),
            ("ES", 1024, 4),
            ("ESP", 1024, 4),
            ("E", 2048, 8),
            ("ES", 2048, 8),
            ("ESP", 2048, 8),
            ("ESP", 2048, 4),
            ("ESP", 4096, 8),
            ("ESP", 512, 2),
            ("E", 512, 4),
            ("ESP", 512, 4),
        ]
    ],  # fmt: skip
    "retrace_confirm": [
        _retrace_env(""),
        {},
        _retrace_env("EP"),
        _retrace_env("ES"),
        {"_RETRACE_PIECES_MIN_AP": launch._RETRACE_PIECES_MIN_AP},
    ],  # fmt: skip
    # GAE, V-trace and the returns on env-major rows (launch.scan_form): the form before EXACT_T, then
    # EXACT_T in the default programs and in programs of (steps, warps) = (1024, 8: 4 steps per thread,
    # the groups of a row on two warps), (1024, 4: a whole 8-step row per thread), (2048, 8), (512, 2),
    # (2048, 4: two rows per thread); then the first two again (_RETRACE_PIECES_MIN_AP changes nothing
    # for these kernels but the configuration's key: a second timing of each). tile_sweep_exact_t_h200
    # .json ran this list with a variant since dropped (values_{t+1} shifted in registers: launch.py).
    "exact_t": [
        {"_EXACT_T": False},
        {},
        *(
            {"_EXACT_T_BLOCK": block, "_EXACT_T_WARPS": warps}
            for block, warps in [(None, 8), (None, 4), (2048, 8), (512, 2), (2048, 4)]
        ),
        {"_EXACT_T": False, "_RETRACE_PIECES_MIN_AP": launch._RETRACE_PIECES_MIN_AP},
        {"_RETRACE_PIECES_MIN_AP": launch._RETRACE_PIECES_MIN_AP},
    ],
}

# Knobs whose values join _layout_key's tuple in the key that tells configurations apart (those that
# change the compiled kernel without changing the layout it reports).
_KERNEL_KNOBS = (
    "_GROUP_16BIT",
    "_ONE_CHUNK",
    "_ONE_CHUNK_BLOCKS",
    "_LOOKBACK_WINDOW",
    "_RETRACE_PIECES_MIN_AP",
    "_TICKET",
    "_MAXNREG",
    "_SINGLE_MAXNREG",
    "_EPOCH_MAX_BLOCKS",
    "_ROW_DIVISOR",
)


@contextlib.contextmanager
def policy(**knobs):
    if "_WARPS" in knobs:  # None: the launcher's own warps
        warps = knobs.pop("_WARPS")
        knobs = knobs if warps is None else knobs | dict.fromkeys(_WARP_KNOBS, warps)
    if "GROUPED" in knobs:
        knobs = {k: v for k, v in knobs.items() if k != "GROUPED"} | _GROUPED_FORMS[knobs["GROUPED"]]
    saved = {k: getattr(launch, k) for k in knobs}
    for k, v in knobs.items():
        setattr(launch, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(launch, k, v)


# The launcher's scan_tiles kind of each function as the benchmark specs call it (TD(lambda) with
# next values, discounted returns without).
_SCAN_KIND = {
    "compute_gae": "gae", "compute_vtrace": "vtrace", "compute_discounted_returns": "returns",
    "compute_lambda_returns": "returns_nv", "compute_eligibility_traces": "forward",
    "compute_episodic_prefix_sum": "forward",
}  # fmt: skip


def _form(fn: str, n: int, t: int, dtype: torch.dtype) -> tuple:
    """What the launcher would run for ``fn`` at (n, t) on ``dtype`` inputs under the current policy:
    ``(layout, GROUPED constexpr, env-major kernel variants)``, the variants being Retrace's
    (launch.retrace_layout) or EXACT_T of GAE, V-trace and the returns (launch.scan_form)."""
    if fn == "compute_retrace":
        form = launch.retrace_layout(n, t, specs.NUM_ACTIONS, dtype)
        return form.layout, form.group, tuple(name for name in _RETRACE_VARIANTS if getattr(form, name))
    if fn in ("compute_eligibility_traces", "compute_episodic_prefix_sum"):
        return launch.scan_layout(_SCAN_KIND[fn], n, t, dtype), 0, ()
    form = launch.scan_form(_SCAN_KIND[fn], n, t, dtype)
    return form.layout, form.group, tuple(name for name in _SCAN_VARIANTS if getattr(form, name))


def _layout_key(layout: launch.Layout, grouped: int) -> tuple:
    """A layout's tiles, split and tile form as the tuple that tells configurations apart."""
    lookback = layout.nk > 1 and layout.lookback
    return (
        *layout.tiles,
        layout.nk,
        layout.cpb,
        grouped,
        lookback,
        layout.window,
        layout.maxnreg,  # set by the launcher for look-back and single-pass layouts only
    )


def _effective(fn: str, n: int, t: int, dtype: torch.dtype) -> tuple:
    """:func:`_layout_key` of what the launcher would run for ``fn`` at (n, t) (:func:`_form`)."""
    layout, grouped, _kernel_variants = _form(fn, n, t, dtype)
    return _layout_key(layout, grouped)


def _grid(grid: dict) -> list[dict]:
    keys = list(grid)
    return [dict(zip(keys, vals, strict=True)) for vals in itertools.product(*(grid[k] for k in keys))]


def _outputs(spec, x) -> list[torch.Tensor]:
    with torch.no_grad():
        out = spec.primary(x)
    return [o.float() for o in (out if isinstance(out, tuple | list) else (out,))]


def _rel_diff(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    """max |got - ref| / max |ref| over every output; inf if a difference is not a number."""
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        scale = r.abs().max().item() or 1.0
        d = (g - r).abs().max().item() / scale
        worst = max(worst, d if d == d else float("inf"))
    return worst


def sweep_shape(
    fn: str, n: int, t: int, configs: list[dict], budget: timing.Budget, dtype=torch.float32, check: bool = False
) -> list:
    """Time ``fn`` at (n, t) under each policy configuration. ``check``: also compare each variant's
    outputs with those of the default policy (``rel_diff_vs_default``; rounding differs between
    split plans, so expect ~1e-6 in float32, not 0)."""
    spec = specs.SPECS[specs.resolve(fn)[0]]
    x = specs.Inputs(n, t, dtype, torch.device("cuda"))
    nbytes = spec.nbytes(x)
    copy = timing.copy_gbps(nbytes, torch.device("cuda"), budget)
    ref = _outputs(spec, x) if check else None
    rows, seen = [], {}
    for knobs in configs:
        with policy(**knobs):
            layout, grouped, variants = _form(spec.name, n, t, dtype)
            eff = (*_layout_key(layout, grouped), *(knobs.get(k) for k in _KERNEL_KNOBS), variants)
            if eff in seen:  # same tiles and split as a configuration already timed
                rows.append({**seen[eff], "knobs": knobs, "duplicate": True})
                continue
            try:
                with torch.no_grad():
                    us = timing.kernel_us(lambda: spec.primary(x), torch.device("cuda"), budget, graph=True)
            except Exception as exc:  # noqa: BLE001 - a variant the compiler or the GPU rejects
                row = {"status": f"failed: {type(exc).__name__}: {exc}"[:200]}
            else:
                row = {"status": "ok", "kernel_us": us, "fraction_of_copy": nbytes / (us * 1e-6) / 1e9 / copy}
                if check:
                    row["rel_diff_vs_default"] = _rel_diff(_outputs(spec, x), ref)
        row |= {"function": spec.name, "num_envs": n, "seq_len": t, "dtype": str(dtype).removeprefix("torch.")}
        if spec.name == "compute_retrace":
            row["num_actions"] = specs.NUM_ACTIONS
        row |= {"bn": eff[0], "bt": eff[1], "warps": eff[2], "nk": eff[3], "cpb": eff[4], "grouped": eff[5]}
        row |= {"lookback": eff[6], "window": eff[7], "maxnreg": eff[8]}
        if variants:
            row["variants"] = list(variants)
        row |= {"knobs": knobs}
        seen[eff] = row
        rows.append(row)
    x.release()
    torch.cuda.empty_cache()
    return rows


def compiled_report() -> list[dict]:
    """Registers and spills of every kernel variant compiled in this process."""
    out = []
    for (kernel, warps, constexprs), ck in launch._COMPILED.items():
        out.append(
            {
                "kernel": kernel.fn.__name__ if hasattr(kernel, "fn") else str(kernel),
                "warps": warps,
                "constexprs": {k: str(v) for k, v in constexprs},
                "n_regs": getattr(ck, "n_regs", None),
                "n_spills": getattr(ck, "n_spills", None),
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="GAE over the full grid, the others at 3 shapes")
    ap.add_argument("--functions", default="gae,vtrace,retrace,returns,lambda,traces,prefix")
    ap.add_argument("--shapes", default=None, help="NxT list for every function, e.g. 4096x2048,1048576x8")
    ap.add_argument("--grouped", action="store_true", help="also sweep the tile form of the reverse recurrences")
    ap.add_argument("--grid", default=None, help="JSON overriding tile-grid knobs, e.g. '{\"_MAX_BT\": [1024]}'")
    ap.add_argument(
        "--configs",
        default=None,
        help="JSON list of knob dicts, each one configuration, or a name in CONFIG_PRESETS; replaces --grid's product",
    )
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    ap.add_argument("--actions", type=int, default=None, help="number of actions of Retrace's inputs (default 4)")
    ap.add_argument("--check", action="store_true", help="compare each variant's outputs with the default policy's")
    ap.add_argument("--verbose", action="store_true", help="print every configuration's time")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.actions:
        specs.NUM_ACTIONS = args.actions
    dtype = getattr(torch, args.dtype)
    budget = timing.QUICK
    fns = args.functions.split(",")
    tile_grid, split_grid = dict(TILE_GRID), dict(SPLIT_GRID)
    if args.grid:  # the knobs given replace those of both grids
        tile_grid |= {k: tuple(v) for k, v in json.loads(args.grid).items()}
        split_grid |= {k: tuple(v) for k, v in json.loads(args.grid).items()}
    if args.grouped:
        tile_grid["GROUPED"] = split_grid["GROUPED"] = ("off", "env", "on")
    tile_cfgs, split_cfgs = _grid(tile_grid), _grid(split_grid)
    small_tiles = tile_cfgs
    jobs = []
    for fn in fns:
        if fn == "gae":
            jobs += [(fn, s, tile_cfgs) for s in LARGE + SHORT + COMMON]
            jobs += [(fn, s, split_cfgs) for s in LONG]
        else:
            shapes = [(4096, 2048), (1048576, 8)] if args.quick else LARGE[:2] + SHORT[:1] + SHORT[3:4]
            jobs += [(fn, s, small_tiles) for s in shapes]
            jobs += [(fn, s, [c for c in split_cfgs if c["_WARPS"] == 4]) for s in [(1, 1048576)]]
    if "retrace" in fns:
        jobs.append(("retrace18", (4096, 2048), small_tiles))
    if args.shapes:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        jobs = [(fn, s, split_cfgs if s[0] < 256 else tile_cfgs) for fn in fns for s in shapes]
    if args.configs:
        configs = CONFIG_PRESETS[args.configs] if args.configs in CONFIG_PRESETS else json.loads(args.configs)
        jobs = [(fn, s, configs) for fn, s, _cfgs in jobs]
    rows = []
    t0 = time.time()

    def write(report=None) -> None:
        if args.out:
            meta = {
                "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
                "python": platform.python_version(), "seconds": time.time() - t0,
            }  # fmt: skip
            with open(args.out, "w") as f:
                json.dump({"meta": meta, "rows": rows, "compiled": report or compiled_report()}, f, indent=1)

    for fn, (n, t), cfgs in tqdm(jobs, desc="sweep", unit="shape"):
        if fn == "retrace18":
            specs.NUM_ACTIONS = 18
            got = sweep_shape("retrace", n, t, cfgs, budget, dtype, args.check)
            specs.NUM_ACTIONS = 4
            for r in got:
                r["num_actions"] = 18
        else:
            got = sweep_shape(fn, n, t, cfgs, budget, dtype, args.check)
        rows += got
        ok = [r for r in got if r["status"] == "ok" and not r.get("duplicate")]
        if ok:
            b = min(ok, key=lambda r: r["kernel_us"])
            tqdm.write(
                f"{fn} {n}x{t}: best {b['kernel_us']:.1f} us = {b['fraction_of_copy']:.2f} of copy at BN={b['bn']} "
                f"BT={b['bt']} W={b['warps']} NK={b['nk']} grouped={b['grouped']} lookback={b['lookback']} "
                f"({len(ok)} variants)"
            )
            if args.check:
                worst = max(r["rel_diff_vs_default"] for r in ok)
                tqdm.write(f"  largest difference from the default policy: {worst:.1e}")
        for r in got if args.verbose else ():
            tqdm.write(
                f"  {r.get('kernel_us', float('nan')):8.1f} us {r.get('fraction_of_copy', float('nan')):.3f} "
                f"diff {r.get('rel_diff_vs_default', float('nan')):.1e} BN={r['bn']} W={r['warps']} "
                f"{'+'.join(r.get('variants', [])) or '-'}{' (dup)' if r.get('duplicate') else ''} {r['status'][:60]}"
            )
        write()  # after every shape: a sweep cut short keeps what it measured
    report = compiled_report()
    spills = [r for r in report if r["n_spills"]]
    print(f"{len(report)} compiled variants, {len(spills)} with spills")
    for r in spills:
        print("SPILLS", r)
    write(report)


if __name__ == "__main__":
    main()
