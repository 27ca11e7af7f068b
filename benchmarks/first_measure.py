"""First GPU measurement of the fused GAE kernel (issue 2): kernel time (do_bench median, L2
flushed), achieved GB/s against the bytes GAE must move, and the fraction of a device-to-device
copy measured in the same run. Also checks every function against the PyTorch path in float64.

Usage: python benchmarks/first_measure.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import platform

import torch
import triton
import triton.testing

import rl_triton as R


def copy_bandwidth(nbytes: int) -> float:
    """Bytes read + written per second by a device-to-device copy of ``nbytes``."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * src.numel() * 4 / (ms * 1e-3)


def gae_case(n: int, t: int) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)
    r = torch.randn(n, t, device="cuda", generator=g)
    v = torch.randn(n, t, device="cuda", generator=g)
    term = torch.rand(n, t, device="cuda", generator=g) < 0.01
    last = torch.randn(n, device="cuda", generator=g)

    def call():
        return R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95, last_value=last)

    out = call()
    with R.use_backend("torch"):
        ref = R.compute_gae(r.double(), v.double(), term, gamma=0.99, lambda_=0.95, last_value=last.double())
    err = float((out.double() - ref).abs().max())
    ms = triton.testing.do_bench(call, return_mode="median")
    nbytes = n * t * (4 + 4 + 1 + 4) + n * 4  # rewards, values, bool flags, advantages, last value
    gbps = nbytes / (ms * 1e-3)
    copy = copy_bandwidth(nbytes)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(20):
        call()
    times = []
    for _ in range(100):
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return {
        "fn": "compute_gae", "num_envs": n, "seq_len": t, "dtype": "float32", "max_abs_err_vs_fp64": err,
        "kernel_us": ms * 1e3, "full_call_us": times[len(times) // 2] * 1e3, "bytes": nbytes,
        "GBps": gbps / 1e9, "copy_GBps": copy / 1e9, "fraction_of_copy": gbps / copy,
    }  # fmt: skip


def sweep() -> None:
    """Times the GAE kernel over tile shapes (BN envs x BT steps per chunk, warps)."""
    from rl_triton.kernels import launch

    saved = (launch._tiles, launch._NUM_WARPS)
    for n, t in [(64, 512), (4096, 2048), (16384, 256), (16, 32768)]:
        r = torch.randn(n, t, device="cuda")
        v = torch.randn(n, t, device="cuda")
        term = torch.rand(n, t, device="cuda") < 0.01
        best = None
        for bn in (1, 2, 4, 8):
            for bt in (32, 64, 128, 256):
                for warps in (1, 2, 4, 8):
                    launch._tiles, launch._NUM_WARPS = (lambda n, t, bn=bn, bt=bt: (bn, bt)), warps
                    try:
                        ms = triton.testing.do_bench(
                            lambda r=r, v=v, term=term: R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95),
                            return_mode="median",
                        )
                    except Exception as exc:  # a tile shape the compiler rejects
                        print(f"sweep {n}x{t} BN={bn} BT={bt} warps={warps}: failed ({type(exc).__name__})")
                        continue
                    if best is None or ms < best[0]:
                        best = (ms, bn, bt, warps)
                    print(f"sweep {n}x{t} BN={bn} BT={bt} warps={warps}: {ms * 1e3:.1f} us")
        print(f"best {n}x{t}: {best[0] * 1e3:.1f} us at BN={best[1]} BT={best[2]} warps={best[3]}")
    launch._tiles, launch._NUM_WARPS = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--sweep", action="store_true", help="also time GAE over tile shapes")
    args = ap.parse_args()
    if args.sweep:
        sweep()
    rows = [gae_case(n, t) for n, t in [(64, 512), (4096, 2048), (16384, 256), (16, 32768), (1, 262144)]]
    meta = {
        "gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
        "python": platform.python_version(),
    }  # fmt: skip
    for row in rows:
        print(
            f"{row['fn']} {row['num_envs']}x{row['seq_len']}: kernel {row['kernel_us']:.1f} us, full call "
            f"{row['full_call_us']:.1f} us, {row['GBps']:.0f} GB/s = {row['fraction_of_copy']:.2f} of copy "
            f"({row['copy_GBps']:.0f} GB/s), err {row['max_abs_err_vs_fp64']:.2e}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
