"""Compile the kernels one public call launches for an H100/H200 (sm_90) on a machine without a GPU,
and report what the compiler made of them: registers, spilled bytes, programs per SM that the
registers allow, and the SASS instruction count per element.

The call runs on CPU tensors with the kernel path switched on and the launch replaced by a recorder,
so the tiles, constexprs, warps and register caps are exactly those the launcher would choose on the
GPU (launch plans do not depend on the device); each recorded launch is then compiled by Triton's
own binder and compiler for ``GPUTarget("cuda", 90, 32)`` with the ptxas that ships with Triton.
Nothing is executed and the call's outputs are never written. Uses Triton 3.6 internals (its
signature binder); without a working ``ptxas`` or with another Triton it fails with the reason.

Usage (float32, the benchmark specs' primary call and 4 actions by default)::

    python -m benchmarks.offline_sass compute_retrace 8192x4096 --dtype bfloat16
    python -m benchmarks.offline_sass gae 16384x512 --maxnreg 40 --dump /tmp/gae   # .sass/.ptx/.ttgir
    python -m benchmarks.offline_sass vtrace 4096x2048 --json

It found the register-limited programs of NOTES.md "Performance", item AA, and checks refactors of
the kernels for unchanged machine code (compare the ``--dump`` outputs of two trees). Must run without
``TRITON_INTERPRET=1`` (the interpreter replaces the compiled kernels).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import re
import subprocess
import tempfile

import torch

from . import specs

TARGET_ARCH = 90
# sm_90 limits per SM: registers, threads, resident programs; registers are allocated per warp in
# units of 256, i.e. per thread rounded up to a multiple of 8.
SM_REGISTERS = 65536
SM_THREADS = 2048
SM_PROGRAMS = 32
SM_SHARED = 228 * 1024


@contextlib.contextmanager
def recorded_launches():
    """Inside: public calls on CPU tensors take the kernel path and record their launches instead of
    running them. Yields the list of (kernel, grid, args, options, warps)."""
    from rl_triton import _config
    from rl_triton.kernels import launch

    if _config.INTERPRET or os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("offline_sass: run without TRITON_INTERPRET=1 (the interpreter has no compiled kernels)")
    rec = []

    def record(plan, i, args):
        grid, constexprs, warps = plan.launches[i]
        rec.append((plan.kernel, grid, args, dict(constexprs), warps))

    saved = launch._launch, _config.INTERPRET
    launch._launch, _config.INTERPRET = record, True
    try:
        yield rec
    finally:
        launch._launch, _config.INTERPRET = saved


def compile_sm90(kernel, args, options: dict, warps: int, maxnreg: int | None = None):
    """Triton's CompiledKernel of ``kernel`` for sm_90, specialised on ``args`` as Triton's launcher
    would be (``options``: constexprs and Triton options such as maxnreg; ``maxnreg`` overrides)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.compiler import compile as triton_compile
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", TARGET_ARCH, 32)
    backend = make_backend(target)
    kw = dict(options, num_warps=warps, debug=False)
    if maxnreg is not None:
        kw["maxnreg"] = maxnreg or None
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, opts = binder(*args, **kw)
    opts, signature, constexprs, attrs = kernel._pack_args(backend, kw, bound, specialization, opts)
    return triton_compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=opts.__dict__)


def sass_and_resources(cubin: bytes) -> tuple[str, dict]:
    """(SASS text, {REG, STACK, SHARED, LOCAL, ...}) of a cubin, from the cuobjdump Triton ships (or the one
    ``TRITON_CUOBJDUMP_PATH`` names: Triton's own lookup)."""
    from triton import knobs

    cuobjdump = knobs.nvidia.cuobjdump.path
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        sass = subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    finally:
        os.unlink(f.name)
    usage = {k: int(v) for k, v in re.findall(r"(\w+(?:\[\d+\])?):(\d+)", res)}
    return sass, usage


def opcode_counts(sass: str) -> collections.Counter:
    """Instructions of a SASS listing by opcode (without modifiers or predicates)."""
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m:
            ops[m.group(1)] += 1
    return ops


def programs_per_sm(registers: int, warps: int, shared: int) -> int:
    threads = 32 * warps
    by_regs = SM_REGISTERS // (max(8, -(-registers // 8) * 8) * threads)
    by_shared = SM_SHARED // shared if shared else SM_PROGRAMS
    return min(by_regs, SM_THREADS // threads, SM_PROGRAMS, by_shared)


_SHOWN = ("BN", "BT", "GROUPED", "PHASE", "ONE", "NKP", "EXACT_T", "TDIV", "TM", "maxnreg")


def report(fn: str, n: int, t: int, dtype: torch.dtype, form: str = "primary", maxnreg: int | None = None,
           dump: str | None = None, time_major: bool = False) -> list[dict]:  # fmt: skip
    """One row per launch of ``fn``'s ``form`` call (benchmarks.specs) at (n, t) in ``dtype`` (on
    time-major views with ``time_major``)."""
    spec = specs.SPECS[specs.resolve(fn)[0]]
    x = specs.Inputs(n, t, dtype, torch.device("cpu"), time_major)
    with recorded_launches() as rec, torch.no_grad():
        spec.call(form)(x)
    rows = []
    for i, (kernel, grid, args, options, warps) in enumerate(rec):
        ck = compile_sm90(kernel, args, options, warps, maxnreg)
        sass, usage = sass_and_resources(ck.asm["cubin"])
        ops = opcode_counts(sass)
        elements = options.get("BN", 1) * options.get("BT", 1)
        instructions = sum(ops.values())
        cap = options.get("maxnreg") if maxnreg is None else (maxnreg or None)
        rows.append(
            {
                "function": spec.name, "num_envs": n, "seq_len": t, "dtype": str(dtype).removeprefix("torch."),
                "launch": i, "kernel": kernel.fn.__name__, "grid": list(grid), "warps": warps,
                "constexprs": {k: (v if isinstance(v, (int, bool)) else str(v)) for k, v in options.items()
                               if k in _SHOWN} | {"maxnreg": cap},
                "registers": usage.get("REG"), "stack_bytes": usage.get("STACK"), "shared_bytes": usage.get("SHARED"),
                "programs_per_sm": programs_per_sm(usage.get("REG", 0), warps, usage.get("SHARED", 0)),
                "sass_instructions": instructions,
                "instructions_per_element": round(instructions * 32 * warps / elements, 1),
                "top_opcodes": dict(ops.most_common(12)),
            }
        )  # fmt: skip
        if dump:
            stem = dump if len(rec) == 1 else f"{dump}.{i}"
            for ext, text in ((".sass", sass), (".ptx", ck.asm["ptx"]), (".ttgir", ck.asm["ttgir"])):
                with open(stem + ext, "w") as f:
                    f.write(text)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("function", help="a benchmark spec name: compute_gae, gae, vtrace, ...")
    ap.add_argument("shape", help="NxT")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64"))
    ap.add_argument("--form", default="primary", help="the spec's call: primary, torchrl_form, ...")
    ap.add_argument("--actions", type=int, default=None, help="Retrace's number of actions (default 4)")
    ap.add_argument("--maxnreg", type=int, default=None, help="register cap for every launch (0: none)")
    ap.add_argument("--dump", default=None, help="write PREFIX.sass, .ptx and .ttgir")
    ap.add_argument("--time-major", action="store_true", help="inputs as x.T views of [T, N] tensors")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.actions:
        specs.NUM_ACTIONS = a.actions
    n, t = (int(v) for v in a.shape.lower().split("x"))
    rows = report(a.function, n, t, getattr(torch, a.dtype), a.form, a.maxnreg, a.dump, a.time_major)
    if a.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['function']} {n}x{t} {r['dtype']}: launch {r['launch']} {r['kernel']} grid {r['grid']} "
              f"warps {r['warps']} {r['constexprs']}")  # fmt: skip
        per_sm = r["programs_per_sm"]
        print(f"  {r['registers']} registers, {r['stack_bytes']} stack bytes (spills), {r['shared_bytes']} shared; "
              f"{per_sm} programs ({per_sm * r['warps']} warps) per SM by its resources")  # fmt: skip
        print(f"  {r['sass_instructions']} SASS instructions, {r['instructions_per_element']} per element and thread")
        print(f"  {r['top_opcodes']}")


if __name__ == "__main__":
    main()
