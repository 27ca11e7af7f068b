"""Where the time of a scan kernel goes: one minimal scan (x_t = 0.99 (1 - d_t) x_{t-1} + in_t,
fp32 values, uint8 flags, 9 bytes per element) built several ways and timed against a
device-to-device copy on the same GPU. Not the library's kernels: a probe that isolates the cost of
the scan, its direction and the carry extraction from the algorithms' prologues.

Modes:
  0 elementwise (same loads and stores, no scan): the memory ceiling of this access pattern
  1 forward scan                    2 forward scan + carry extraction (two row sums)
  3 reverse=True scan, ascending loads
  4 forward scan over reversed offsets (descending loads)
  5 tl.flip around a forward scan   6 reverse=True scan + carry extraction
  7 reversed offsets + carry extraction
  9 two-level reverse scan: reverse=True within each thread's V contiguous steps (axis in
    registers), then over the per-thread aggregates (one value per thread), then applied
  10 reverse scan without a reverse scan: the chunk as [G, 4] groups of 4 contiguous steps (one
    vector load), groups numbered from the latest; the suffix inside a group unrolled in registers
    (tl.split), a forward scan over the group aggregates, the outputs joined back (tl.join):
    kernels/core.py's env-major grouped form
  8 reverse scan as a forward scan over groups of V contiguous steps taken in reverse order (loads
    stay vectorised within a group; the group is flipped in registers)

Usage: python -m benchmarks.scan_variants [--out results.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json

import torch
import triton
import triton.language as tl

from rl_triton.kernels.core import _env_group_states, linear_combine, linear_combine_next

from . import timing

MODES = {
    0: "elementwise",
    1: "fwd scan",
    2: "fwd scan + carry",
    3: "reverse=True scan",
    4: "reversed offsets",
    5: "flip + fwd scan",
    6: "reverse=True + carry",
    7: "reversed offsets + carry",
    8: "grouped flip + fwd scan",
    9: "two-level reverse scan",
    10: "groups of 4 + fwd scan",
}


@triton.jit
def two_level_reverse(b_a, b_b, BN: tl.constexpr, BT: tl.constexpr, V: tl.constexpr):
    G: tl.constexpr = BT // V
    a3 = tl.reshape(b_a, [BN, G, V])
    b3 = tl.reshape(b_b, [BN, G, V])
    A_in, B_in = tl.associative_scan((a3, b3), 2, linear_combine, reverse=True)
    first = tl.arange(0, V)[None, None, :] == 0
    gA = tl.sum(tl.where(first, A_in, 0.0), 2)
    gB = tl.sum(tl.where(first, B_in, 0.0), 2)
    _, _, nA, nB = tl.associative_scan(
        (gA, gB, tl.full(gA.shape, 1.0, gA.dtype), tl.zeros(gB.shape, gB.dtype)), 1, linear_combine_next, reverse=True
    )
    return tl.reshape(A_in, [BN, BT]), tl.reshape(A_in * nB[:, :, None] + B_in, [BN, BT])


@triton.jit
def probe_kernel(p_x, p_d, p_y, N, T, MODE: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr):
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    m_n = o_n < N
    b_carry = tl.zeros([BN], dtype=tl.float32)
    if MODE == 10:
        G4: tl.constexpr = BT // 4
        for i_c in range(0, tl.cdiv(T, BT)):
            o_t = (T - (i_c + 1) * BT) + ((G4 - 1 - tl.arange(0, G4)) * 4)[:, None] + tl.arange(0, 4)[None, :]
            m = m_n[:, None, None] & ((o_t >= 0) & (o_t < T))[None, :, :]
            off = o_n.to(tl.int64)[:, None, None] * T + o_t[None, :, :]
            b_x = tl.load(p_x + off, mask=m, other=0)
            b_d = (tl.load(p_d + off, mask=m, other=0) != 0).to(tl.float32)
            b_a = tl.where(m, 0.99 * (1 - b_d), 1.0)
            tl.store(p_y + off, _env_group_states(b_a, b_x, b_carry)[0], mask=m)
        return
    if MODE == 8:
        V: tl.constexpr = 4 if BT >= 4 else BT
        G: tl.constexpr = BT // V
        for i_c in range(0, tl.cdiv(T, BT)):
            o_t = (T - (i_c + 1) * BT) + ((G - 1 - tl.arange(0, G)) * V)[:, None] + tl.arange(0, V)[None, :]
            m = m_n[:, None, None] & ((o_t >= 0) & (o_t < T))[None, :, :]
            off = o_n.to(tl.int64)[:, None, None] * T + o_t[None, :, :]
            b_x = tl.load(p_x + off, mask=m, other=0)
            b_d = (tl.load(p_d + off, mask=m, other=0) != 0).to(tl.float32)
            b_a = tl.where(m, 0.99 * (1 - b_d), 1.0)
            b_a = tl.reshape(tl.flip(b_a, 2), [BN, BT])
            b_x = tl.reshape(tl.flip(b_x, 2), [BN, BT])
            b_A, b_B = tl.associative_scan((b_a, b_x), 1, linear_combine)
            b_y = tl.flip(tl.reshape(b_A * b_carry[:, None] + b_B, [BN, G, V]), 2)
            tl.store(p_y + off, b_y, mask=m)
        return
    for i_c in range(0, tl.cdiv(T, BT)):
        o_t = i_c * BT + tl.arange(0, BT)
        if MODE == 4 or MODE == 7:
            o_t = T - 1 - o_t
        m = m_n[:, None] & ((o_t >= 0) & (o_t < T))[None, :]
        off = o_n.to(tl.int64)[:, None] * T + o_t[None, :]
        b_x = tl.load(p_x + off, mask=m, other=0)
        b_d = (tl.load(p_d + off, mask=m, other=0) != 0).to(tl.float32)
        b_a = tl.where(m, 0.99 * (1 - b_d), 1.0)
        if MODE == 0:
            b_y = b_a * b_x
        else:
            if MODE == 9:
                b_A, b_B = two_level_reverse(b_a, b_x, BN, BT, 16 if BT >= 16 else BT)
            elif MODE == 3 or MODE == 6:
                b_A, b_B = tl.associative_scan((b_a, b_x), 1, linear_combine, reverse=True)
            elif MODE == 5:
                b_A, b_B = tl.associative_scan((tl.flip(b_a, 1), tl.flip(b_x, 1)), 1, linear_combine)
                b_A = tl.flip(b_A, 1)
                b_B = tl.flip(b_B, 1)
            else:
                b_A, b_B = tl.associative_scan((b_a, b_x), 1, linear_combine)
            b_y = b_A * b_carry[:, None] + b_B
            if MODE == 2 or MODE == 7:
                b_edge = tl.arange(0, BT)[None, :] == BT - 1
                b_carry = tl.sum(tl.where(b_edge, b_y, 0.0), 1)
            if MODE == 6:
                b_edge = tl.arange(0, BT)[None, :] == 0
                b_carry = tl.sum(tl.where(b_edge, b_y, 0.0), 1)
        tl.store(p_y + off, b_y, mask=m)


# The same kernel with T not specialised on (Triton otherwise compiles a variant for T % 16 == 0,
# which lets it prove 16-byte alignment of every row and vectorise the loads).
probe_kernel_nospec = triton.jit(do_not_specialize=["T"])(probe_kernel.fn)


# do_bench (5 ms warm-up, 25 ms of runs) of a CUDA-graph replay, as the suite times kernels.
_BUDGET = dataclasses.replace(timing.QUICK, bench_rep_ms=25)


def _time(fn) -> float:
    """do_bench median (µs) of a CUDA-graph replay of ``fn``."""
    return timing.kernel_us(fn, torch.device("cuda"), _BUDGET, graph=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--nospec", action="store_true", help="do not let Triton specialise on T % 16")
    ap.add_argument("--modes", default=",".join(map(str, MODES)), type=lambda s: [int(m) for m in s.split(",")])
    args = ap.parse_args()
    rows = []
    kern = probe_kernel_nospec if args.nospec else probe_kernel
    for n, t in [(4096, 2048), (1048576, 8), (65536, 128)]:
        x = torch.randn(n, t, device="cuda")
        d = (torch.rand(n, t, device="cuda") < 0.01).to(torch.uint8)
        y = torch.empty_like(x)
        src = torch.empty(n * t * 9 // 16, device="cuda", dtype=torch.float64)  # 9 bytes/element read + written
        dst = torch.empty_like(src)
        copy_us = _time(lambda src=src, dst=dst: dst.copy_(src))
        for mode in args.modes:
            for bn, bt in {(1, min(t, 2048)), (2, min(t, 1024)), (max(1, 1024 // t), t), (max(1, 2048 // t), t)}:
                for warps in (4, 8):
                    if bn * bt < 32 * warps:
                        continue

                    def run(bn=bn, bt=bt, warps=warps, mode=mode, x=x, d=d, y=y, n=n, t=t):
                        kern[(triton.cdiv(n, bn),)](x, d, y, n, t, MODE=mode, BN=bn, BT=bt, num_warps=warps)

                    try:
                        us = _time(run)
                    except Exception as exc:  # noqa: BLE001 - a variant the compiler rejects
                        print(f"{n}x{t} {MODES[mode]} BN={bn} BT={bt} W={warps}: failed {type(exc).__name__}")
                        continue
                    rows.append(
                        {"num_envs": n, "seq_len": t, "mode": MODES[mode], "bn": bn, "bt": bt, "warps": warps,
                         "us": us, "copy_us": copy_us, "fraction_of_copy": copy_us / us}
                    )  # fmt: skip
        for mode in (MODES[m] for m in args.modes):
            best = min((r for r in rows if r["mode"] == mode and r["num_envs"] == n), key=lambda r: r["us"])
            print(
                f"{n}x{t} {mode:26s} {best['us']:7.1f} us = {best['fraction_of_copy']:.2f} of copy "
                f"(BN={best['bn']} BT={best['bt']} W={best['warps']}; copy {copy_us:.1f} us)"
            )
        del x, d, y, src, dst
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(0), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
