"""Compiles the Triton launches of rl_triton.llm's token scans for sm_90 without a GPU (a plan that the validation
accepts must compile), and prints registers, spills and the widest global loads of each launch.

    .venv/bin/python -m tests.llm.offline_compile            (not under TRITON_INTERPRET=1)
"""

from __future__ import annotations

import contextlib
import re
import sys

import torch

from benchmarks.tune import compile_sm90, sass_and_resources
from rl_triton.kernels.plans import TOKEN_SPLITS
from rl_triton.llm import _kernels
from rl_triton.llm.plans import TokenPlan, choose

_NAMES = ("_token_scan_grouped_kernel", "_whiten_kernel", "_moments_kernel")


class _Recorder:
    def __init__(self, kernel, rec):
        self.kernel, self.rec = kernel, rec

    def __getitem__(self, grid):
        def launch(*args, num_warps=4, **constexprs):
            self.rec.append((self.kernel, grid, args, constexprs, num_warps))

        return launch


@contextlib.contextmanager
def recorded():
    """Inside: the llm launchers record their launches (on CPU tensors) instead of running them."""
    rec = []
    saved = {n: getattr(_kernels, n) for n in _NAMES}
    try:
        for n in _NAMES:
            setattr(_kernels, n, _Recorder(saved[n], rec))
        yield rec
    finally:
        for n, k in saved.items():
            setattr(_kernels, n, k)


def launches(b: int, t: int, dtype: torch.dtype, plan: TokenPlan, mode: int = 0):
    r = torch.randn(b, t, dtype=dtype)
    m = torch.rand(b, t) > 0.1
    with recorded() as rec:
        if mode == 0:
            x, _, parts = _kernels.gae(r, r.clone(), m, 0.99, 0.95, plan)
        else:
            x, _, parts = _kernels.reinforce_pp(r, m, 0.99, plan)
        _kernels.whiten(x, parts, True, out_dtype=dtype)
    return rec


def compile_all(b: int, t: int, dtype: torch.dtype, plan: TokenPlan, mode: int = 0, verbose: bool = True):
    rows = []
    for kernel, grid, args, constexprs, warps in launches(b, t, dtype, plan, mode):
        ck = compile_sm90(kernel, args, constexprs, warps)
        sass, usage = sass_and_resources(ck.asm["cubin"])
        loads = sorted(set(re.findall(r"LDG\.E(?:\.[A-Z0-9]+)*", sass)))
        row = dict(kernel=kernel.fn.__name__, grid=tuple(grid), phase=constexprs.get("PHASE"), warps=warps,
                   regs=usage.get("REG"), stack=usage.get("STACK"), loads=loads)  # fmt: skip
        rows.append(row)
        if verbose:
            print(f"  {row}", flush=True)
    return rows


CASES = [  # (B, T, dtype, mode): the shapes measured, short rows, float64
    (64, 32768, torch.float32, 0), (256, 4096, torch.float32, 0), (8, 131072, torch.float32, 0),
    (4096, 512, torch.float32, 0), (64, 32768, torch.float32, 1), (256, 4096, torch.float64, 0),
    (64, 32768, torch.float64, 0), (3, 5, torch.float32, 0),
]  # fmt: skip


def main(argv: list[str]) -> None:
    plans = []
    for b, t, dtype, mode in CASES:
        plans.append((b, t, dtype, mode, choose(b, t, dtype, "reinforce_pp" if mode else "gae")))
    for block in (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):  # every block, both splits, split rows
        for split in TOKEN_SPLITS:
            for mode, dtype in ((0, torch.float32), (1, torch.float32), (0, torch.float64), (1, torch.bfloat16)):
                plans.append((3, 2 * 8192 + 3, dtype, mode, TokenPlan(block=block, split=split)))
    for warps in (1, 2, 4, 8, 16, 32):  # the warps field's range, at the default block
        plans.append((3, 2 * 8192 + 3, torch.float32, 0, TokenPlan(warps=warps)))
    failed = []
    for b, t, dtype, mode, plan in plans:
        print(f"B={b} T={t} {dtype} mode={mode} {plan}", flush=True)
        try:
            compile_all(b, t, dtype, plan, mode)
        except Exception as exc:  # noqa: BLE001 (reported below)
            failed.append((b, t, dtype, mode, plan, repr(exc)[:200]))
            print(f"  FAILED: {exc!r}"[:300], flush=True)
    print(f"{len(plans) - len(failed)} of {len(plans)} compiled", *failed, sep="\n")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
