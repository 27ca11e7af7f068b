"""The tuning tool: time or compile variants of a call's launch plan.

It takes the plan :func:`rl_triton.kernels.plans.choose` picks for one benchmark call, varies fields of it, and
for each variant either times the call on the GPU (``triton.testing.do_bench`` median of a CUDA-graph replay, L2
flushed, next to a device-to-device copy of the same bytes timed in the same run) after checking its outputs
against the chosen plan's, or (``--offline``, no GPU needed) compiles its launches for sm_90 with the ptxas that
ships with Triton and reports registers, spills, programs per SM, SASS instructions, the load trips of each
innermost loop (:func:`load_trips`: how often a thread waits on memory per pass) and the block-wide barriers. A
decision the results support becomes an entry of ``kernels/plans.py`` and one line of ``docs/performance.md``.

Usage::

    python -m benchmarks.tune gae 4096x2048 --vary warps=4,8 maxnreg=0,48,64
    python -m benchmarks.tune retrace 1048576x8 --dtype bfloat16 --vary exact_t=0,1 shift=0,1 --offline
    python -m benchmarks.tune vtrace 16x1048576 --vary window=64,128,256 --json --out sweep.json

Fields take ints, 0/1 for flags, and names for ``form`` (PLAIN, GROUPS4, GROUPS8, ENV_GROUPS, DESCENDING) and
``split`` (SINGLE, TWO_PASS, LOOKBACK); ``maxnreg=0`` means no cap. A variant the kernels cannot run is reported
with the reason and skipped. ``--dump PREFIX`` (offline) writes the .sass, .ptx and .ttgir of every launch.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import itertools
import json
import os
import re
import subprocess
import tempfile

import torch

from rl_triton.kernels import plans
from rl_triton.kernels.plans import Form, Plan, Split
from rl_triton.ops import kind_of  # the plan kind of each benchmark spec's primary call

from . import specs, timing

try:
    from tqdm import tqdm
except ImportError:  # tqdm is a dev dependency: run without a bar if it is missing

    def tqdm(items, **_kw):
        return items


TARGET_ARCH = 90
# sm_90 per SM: registers, threads, resident programs, shared memory
SM_REGISTERS, SM_THREADS, SM_PROGRAMS, SM_SHARED = 65536, 2048, 32, 228 * 1024


def parse_vary(items: list[str]) -> dict[str, list]:
    """``["warps=4,8", "form=GROUPS4,PLAIN"]`` -> {field: values}, typed like the Plan's fields."""
    fields = {f.name for f in dataclasses.fields(Plan)}
    out = {}
    for item in items:
        name, _, values = item.partition("=")
        if name not in fields or not values:
            raise SystemExit(f"--vary: expected FIELD=V1,V2,... with FIELD one of {sorted(fields)}, got {item!r}")
        out[name] = [_value(name, v) for v in values.split(",")]
    return out


def _value(name: str, text: str):
    if name == "form":
        return Form[text.upper()]
    if name == "split":
        return Split[text.upper()]
    if name in ("epochs", "exact_t", "whole", "pieces", "shift", "pi_tile"):
        return bool(int(text))
    if name == "maxnreg":
        return int(text) or None
    return int(text)


def variants(base: Plan, vary: dict[str, list]) -> list[Plan]:
    """``base`` with every combination of the varied fields (the base itself first when it is among them)."""
    names = list(vary)
    found = [
        dataclasses.replace(base, **dict(zip(names, values, strict=True)))
        for values in itertools.product(*vary.values())
    ]
    return sorted(set(found), key=lambda p: (p != base, found.index(p)))


def chosen_plan(fn: str, n: int, t: int, dtype: torch.dtype, time_major: bool) -> Plan:
    return plans.choose(kind_of(fn), n, t, dtype, time_major=time_major, num_actions=specs.NUM_ACTIONS)


@contextlib.contextmanager
def recorded_launches():
    """Inside: calls on CPU tensors take the kernel path and record their launches instead of running them.
    Yields the list of (kernel, grid, args, constexprs and options, warps)."""
    from rl_triton import _config
    from rl_triton.kernels import launch

    if _config.INTERPRET or os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("tune --offline: run without TRITON_INTERPRET=1 (the interpreter has no compiled kernels)")
    rec = []

    def record(built, i, args):
        grid, constexprs, warps = built.launches[i]
        rec.append((built.kernel, grid, args, dict(constexprs), warps))

    saved = launch._launch, _config.INTERPRET
    launch._launch, _config.INTERPRET = record, True
    try:
        yield rec
    finally:
        launch._launch, _config.INTERPRET = saved


def compile_sm90(kernel, args, options: dict, warps: int):
    """Triton's CompiledKernel of ``kernel`` for sm_90, specialised on ``args`` as Triton's launcher would be."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", TARGET_ARCH, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, opts = binder(*args, **dict(options, num_warps=warps, debug=False))
    opts, signature, constexprs, attrs = kernel._pack_args(
        backend, dict(options, num_warps=warps), bound, specialization, opts
    )
    return triton_compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=opts.__dict__)


def sass_and_resources(cubin: bytes) -> tuple[str, dict]:
    """(SASS text, {REG, STACK, SHARED, ...}) of a cubin, from the cuobjdump Triton ships."""
    from triton import knobs

    cuobjdump = knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    return sass, {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", res)}


_SASS_LINE = re.compile(r"\s+/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def opcode_counts(sass: str) -> collections.Counter:
    return collections.Counter(op.split(".")[0] for _at, op, _rest in _SASS_LINE.findall(sass))


_REGISTER = re.compile(r"(?<![A-Za-z_])R(\d+)(\.64)?")


def _registers(operand: str, width: int = 1) -> set[int]:
    """The general registers an operand names: R4 one, R4.64 two, a load's destination ``width``."""
    out = set()
    for n, wide in _REGISTER.findall(operand):
        out.update(range(int(n), int(n) + max(width, 2 if wide else 1)))
    return out


def split_functions(sass: str) -> tuple[str, list[str]]:
    """``sass`` as the kernel's own code and the code of each function it calls (a ``CALL.REL`` target up to the
    next one), each a listing of its own: a function Triton does not inline (the late test's second pass,
    ``core._contained_rows``) is listed after the kernel's last instruction, and its loads and barriers run only
    where it is called, so they are reported apart."""
    lines = _SASS_LINE.finditer(sass)
    starts = sorted({int(t, 16) for t in re.findall(r"CALL\.REL[.A-Z]*\s+(0x[0-9a-f]+)", sass)})
    parts = [[] for _ in range(len(starts) + 1)]
    for m in lines:
        parts[sum(int(m.group(1), 16) >= s for s in starts)].append(m.group(0))
    return "\n".join(parts[0]), ["\n".join(p) for p in parts[1:]]


def load_trips(sass: str) -> list[list[int]]:
    """Per innermost loop of ``sass`` (a backward branch; the whole kernel where there is none): the global loads
    it issues, grouped into the trips to memory they wait on. A trip ends at the first instruction that reads a
    register a load of it writes, so 8 loads in one trip wait once for memory and [4, 2, 2] wait three times, one
    after the other. Instructions are taken in listing order: both sides of a branch inside the loop are counted."""
    ins = [(int(a, 16), op, rest) for a, op, rest in _SASS_LINE.findall(sass)]
    loops = []
    for at, op, rest in ins:
        target = re.match(r"(0x[0-9a-f]+)", rest.strip())
        if op == "BRA" and target and int(target.group(1), 16) < at:
            loops.append((int(target.group(1), 16), at))
    loops = [(lo, hi) for lo, hi in loops if not any(lo <= a and b <= hi and (a, b) != (lo, hi) for a, b in loops)]
    if not loops and ins:
        loops = [(ins[0][0], ins[-1][0])]
    out = []
    for lo, hi in loops:
        trips, in_flight, count = [], set(), 0
        for at, op, rest in ins:
            if not lo <= at <= hi:
                continue
            operands = [o.strip() for o in rest.split(",")]
            width = 4 if ".128" in op else 2 if ".64" in op else 1
            if op.startswith("ST"):  # a store reads its address and its data (``width`` registers)
                read = _registers(operands[0]) | _registers(operands[-1], width)
            else:  # other instructions write their first operand
                read = set().union(*map(_registers, operands[1:]))
            if in_flight & read:
                trips.append(count)
                in_flight, count = set(), 0
            if op.startswith("LDG"):
                in_flight |= _registers(operands[0], width)
                count += 1
        if count:
            trips.append(count)
        out.append(trips)
    return out


def programs_per_sm(registers: int, warps: int, shared: int) -> int:
    threads = 32 * warps
    by_regs = SM_REGISTERS // (max(8, -(-registers // 8) * 8) * threads)
    by_shared = SM_SHARED // shared if shared else SM_PROGRAMS
    return min(by_regs, SM_THREADS // threads, SM_PROGRAMS, by_shared)


def listing_counts(listing: str) -> dict:
    """SASS instructions, load trips and barriers of one listing (a kernel's own code, or a function it calls)."""
    ops = opcode_counts(listing)
    return {"sass_instructions": sum(ops.values()), "load_trips": load_trips(listing), "barriers": ops["BAR"]}


_SHOWN = ("BN", "BT", "FORM", "PHASE", "ONE", "NKP", "EXACT_T", "TDIV", "TM", "WHOLE", "maxnreg")


def compiled_launches(fn: str, x: specs.Inputs, plan: Plan | None = None) -> list[tuple]:
    """The launches of ``fn``'s primary call (under ``plan``, else the chosen one) compiled for sm_90: per launch
    (kernel, grid, constexprs and options, warps, Triton's CompiledKernel, SASS text, resource usage)."""
    with recorded_launches() as rec, torch.no_grad():
        specs.SPECS[fn].primary(x, plan)
    out = []
    for kernel, grid, args, options, warps in rec:
        ck = compile_sm90(kernel, args, options, warps)
        out.append((kernel, grid, options, warps, ck, *sass_and_resources(ck.asm["cubin"])))
    return out


def offline(fn: str, x: specs.Inputs, plan: Plan, dump: str | None = None) -> list[dict]:
    """One row per launch of ``fn``'s primary call under ``plan``, compiled for sm_90."""
    launches = compiled_launches(fn, x, plan)
    rows = []
    for i, (kernel, grid, options, warps, ck, sass, usage) in enumerate(launches):
        ops = opcode_counts(sass)
        instructions = sum(ops.values())
        own, apart = split_functions(sass)
        counts = listing_counts(own)
        elements = options.get("BN", 1) * options.get("BT", 1)
        shown = {k: v if isinstance(v, (int, bool, type(None))) else str(v) for k, v in options.items() if k in _SHOWN}
        rows.append({
            "launch": i, "kernel": kernel.fn.__name__, "grid": list(grid), "warps": warps, "constexprs": shown,
            "registers": usage.get("REG"), "stack_bytes": usage.get("STACK"), "shared_bytes": usage.get("SHARED"),
            "programs_per_sm": programs_per_sm(usage.get("REG", 0), warps, usage.get("SHARED", 0)),
            "sass_instructions": instructions,
            "instructions_per_element": round(instructions * 32 * warps / elements, 1),
            "load_trips": counts["load_trips"],
            "barriers": counts["barriers"],  # in the listing: both sides of a branch count
            # the functions it calls (not inlined): their instructions, loads and barriers (innermost loops)
            "apart": [listing_counts(f) for f in apart],
            "top_opcodes": dict(ops.most_common(12)),
        })  # fmt: skip
        if dump:
            stem = dump if len(launches) == 1 else f"{dump}.{i}"
            for ext, text in ((".sass", sass), (".ptx", ck.asm["ptx"]), (".ttgir", ck.asm["ttgir"])):
                with open(stem + ext, "w") as f:
                    f.write(text)
    return rows


def _rel_diff(got, ref) -> float:
    worst = 0.0
    for g, r in zip(got, ref, strict=True):
        g, r = g.double(), r.double()
        worst = max(worst, ((g - r).abs().max() / r.pow(2).mean().sqrt().clamp_min(1e-30)).item())
    return worst


def timed(fn: str, x: specs.Inputs, plan: Plan, base_out, budget: timing.Budget, copy_gbps: float) -> dict:
    """Kernel time of ``fn`` under ``plan`` on the GPU, its outputs' difference from the chosen plan's."""
    from rl_triton.kernels import launch

    spec = specs.SPECS[fn]
    out = spec.primary(x, plan)
    us = timing.kernel_us(lambda: spec.primary(x, plan), x.device, budget, graph=True)
    nbytes = spec.nbytes(x)
    regs = {}
    for (kernel, warps, constexprs), ck in launch.COMPILED.items():
        if dict(constexprs).get("BT") == plan.bt and warps == plan.warps:
            regs[kernel.fn.__name__] = (ck.n_regs, ck.n_spills)
    return {
        "kernel_us": round(us, 2), "fraction_of_copy": round(nbytes / (us * 1e3) / copy_gbps, 3),
        "rel_diff": _rel_diff(out, base_out), "bits_equal": all(map(torch.equal, out, base_out)),
        "registers_spills": regs,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("function", help="a benchmark spec name: compute_gae, gae, vtrace, ...")
    ap.add_argument("shape", help="NxT")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    ap.add_argument("--actions", type=int, default=specs.NUM_ACTIONS, help="Retrace's number of actions")
    ap.add_argument("--time-major", action="store_true", help="inputs as x.T views of [T, N] tensors")
    ap.add_argument("--vary", nargs="*", default=[], metavar="FIELD=V1,V2", help="plan fields to vary")
    ap.add_argument("--offline", action="store_true", help="compile for sm_90 instead of timing (no GPU needed)")
    ap.add_argument("--dump", default=None, help="--offline: write PREFIX.sass, .ptx and .ttgir")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--out", default=None, help="also write the rows to this JSON file")
    a = ap.parse_args(argv)
    specs.NUM_ACTIONS = a.actions
    fn = specs.resolve(a.function)[0]
    n, t = (int(v) for v in a.shape.lower().split("x"))
    dtype = getattr(torch, a.dtype)
    base = chosen_plan(fn, n, t, dtype, a.time_major)
    todo = variants(base, parse_vary(a.vary))
    device = torch.device("cpu" if a.offline else "cuda")
    x = specs.Inputs(n, t, dtype, device, a.time_major)
    from rl_triton.kernels import launch

    rows = []
    if not a.offline:
        budget = timing.QUICK
        copy = timing.copy_gbps(specs.SPECS[fn].nbytes(x), device, budget)
        base_out = specs.SPECS[fn].primary(x)
    for plan in tqdm(todo, desc=f"{fn} {n}x{t}", unit="plan"):
        fields = {k: (v.name if isinstance(v, (Form, Split)) else v) for k, v in dataclasses.asdict(plan).items()}
        row = {"function": fn, "num_envs": n, "seq_len": t, "dtype": a.dtype, "chosen": plan == base, "plan": fields}
        try:
            launch.check_plan(plan, kind_of(fn), n, t, dtype, a.time_major)
            if a.offline:
                row["launches"] = offline(fn, x, plan, a.dump)
            else:
                row.update(timed(fn, x, plan, base_out, budget, copy))
        except ValueError as e:
            row["skipped"] = str(e)
        rows.append(row)
    text = json.dumps(rows, indent=1)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    if a.json:
        print(text)
    else:
        for row in rows:
            print(_summary(row))
    return rows


def _summary(row: dict) -> str:
    p = row["plan"]
    head = f"{'*' if row['chosen'] else ' '} bn={p['bn']} bt={p['bt']} warps={p['warps']} {p['form']} {p['split']}"
    split_field = {"LOOKBACK": "window", "TWO_PASS": "chunks_per_block"}.get(p["split"])  # the split's own knob
    shown = ((split_field,) if split_field else ()) + ("maxnreg", "exact_t", "whole", "shift", "pi_tile", "late")
    head += "".join(f" {k}={p[k]}" for k in shown if p[k])
    if "skipped" in row:
        return f"{head}: skipped ({row['skipped']})"
    if "launches" in row:
        return head + "".join(
            f"\n    {r['kernel']} grid {r['grid']}: {r['registers']} regs, {r['stack_bytes']} stack, "
            f"{r['programs_per_sm']}/SM, {r['sass_instructions']} SASS, load trips "
            + "; ".join("+".join(map(str, t)) or "-" for t in r["load_trips"])
            + f", {r['barriers']} barriers"
            + "".join(
                f"; apart: {f['sass_instructions']} SASS, load trips "
                + "; ".join("+".join(map(str, t)) or "-" for t in f["load_trips"])
                + f", {f['barriers']} barriers"
                for f in r.get("apart", ())
            )
            for r in row["launches"]
        )  # fmt: skip
    return f"{head}: {row['kernel_us']} us, {row['fraction_of_copy']} of copy, rel diff {row['rel_diff']:.1e}"


if __name__ == "__main__":
    main()
