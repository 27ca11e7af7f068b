"""Where the host time of one compute_gae call goes (CUDA): validation, output allocation, the
Triton launch, and the whole call. Wall-clock medians over many calls, GPU work excluded by
measuring the CPU side only (the kernels are tiny and asynchronous).

Usage: python -m benchmarks.host_overhead [--profile]  (--profile: cProfile of 2000 whole calls)
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import torch

import rl_triton as R
from rl_triton import _validation
from rl_triton.kernels import fused, launch


def per_call_us(fn, n: int = 2000) -> float:
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n * 1e6)
        torch.cuda.synchronize()
    return sorted(times)[2]


def raw_gae(r: torch.Tensor, v: torch.Tensor, term: torch.Tensor, out: torch.Tensor):
    """A zero-argument call of ``gae_kernel`` through Triton's own dispatcher (``kernel[grid](...)``),
    single pass, with the arguments and constexprs the launcher passes (advantages into ``out``)."""
    n, t = r.shape
    tiles = launch._tiles(n, t)
    chunks = launch._cdiv(t, tiles.bt)

    def call():
        fused.gae_kernel[(launch._cdiv(n, tiles.bn), 1)](
            r, v, term, r, r, r, out, out, n, t, *launch.hp(0.99), *launch.hp(0.95), r, r, r, 1, chunks,
            HAS_TRUNC=False, HAS_BOOT=False, HAS_LAST=False, NEXT_ALL=False, TARGET=False, PHASE=0, ONE=chunks == 1,
            ACC=launch._acc(r.dtype), BN=tiles.bn, BT=tiles.bt, NKP=1, GROUPED=launch._group(tiles, r.dtype),
            num_warps=tiles.warps,
        )  # fmt: skip

    return call


def main() -> None:
    n, t = 64, 512
    r = torch.randn(n, t, device="cuda")
    v = torch.randn(n, t, device="cuda")
    term = torch.zeros(n, t, dtype=torch.bool, device="cuda")
    out = torch.empty_like(r)

    def prep():
        return _validation.prepare(
            "compute_gae",
            steps={"rewards": r, "values": v, "bootstrap_values": None},
            flags={"terminateds": term, "truncateds": None},
            per_env={"last_value": None},
            required=("rewards", "values", "terminateds"),
        )

    p = prep()

    raw_launch = raw_gae(r, v, term, out)

    R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95)  # builds the plan and keeps the compiled kernel
    plan = p.plans[("gae", False, False)]
    plan_args = (r, v, term, r, r, r, out, out, n, t, *launch.hp(0.99), *launch.hp(0.95))

    rows = {
        "cached plan: scratch args + C launch": per_call_us(lambda: launch._run(plan, plan_args)),
        "torch.empty_like": per_call_us(lambda: torch.empty_like(r)),
        "validation (prepare)": per_call_us(prep),
        "launch.gae (alloc + launch)": per_call_us(lambda: launch.gae(p, 0.99, 0.95)),
        "raw kernel[grid](...)": per_call_us(raw_launch),
        "compute_gae (whole call)": per_call_us(lambda: R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95)),
        "r.add(v) (a torch op, for scale)": per_call_us(lambda: r.add(v)),
    }
    for k, us in rows.items():
        print(f"{k:40s} {us:7.1f} us")
    from benchmarks import timing

    dev = torch.device("cuda")
    for name, call in _all_functions(n, t).items():
        host = per_call_us(call)
        events = timing.full_call_us(lambda _, c=call: c(), dev, timing.QUICK)
        print(f"{name:40s} host {host:7.1f} us, full call (CUDA events) {events:7.1f} us")
    if "--profile" in sys.argv:
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(2000):
            R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95)
        prof.disable()
        torch.cuda.synchronize()
        pstats.Stats(prof).sort_stats("tottime").print_stats(30)


def _all_functions(n: int, t: int) -> dict:
    """One zero-argument call per public function at N x T (float32, bool flags)."""
    from tests._helpers import FUNCTIONS, valid_kwargs

    calls = {}
    for fn in FUNCTIONS:
        f, kwargs = getattr(R, fn), valid_kwargs(fn, (n, t), device="cuda")
        calls[fn] = lambda f=f, k=kwargs: f(**k)
    return calls


if __name__ == "__main__":
    main()
