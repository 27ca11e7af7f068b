"""First GPU measurement of the fused kernels (issue 2): kernel time (do_bench median, L2
flushed), achieved GB/s against the bytes GAE must move, and the fraction of a device-to-device
copy measured in the same run. Also checks every function against the PyTorch path in float64.

Usage: python benchmarks/first_measure.py [--out results.json]

Superseded for the performance issue by benchmarks/targets.py (issue shapes, CUDA-graph timing) and
benchmarks/tile_sweep.py (tile sweep; this script's old --sweep).
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


def _inputs(n: int, t: int, num_actions: int = 4) -> dict:
    g = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=g)

    probs = torch.softmax(randn(n, t, num_actions), -1)
    return {
        "r": randn(n, t), "v": randn(n, t), "nv": randn(n, t), "last": randn(n),
        "term": torch.rand(n, t, device="cuda", generator=g) < 0.01,
        "trunc": torch.rand(n, t, device="cuda", generator=g) < 0.005,
        "lpt": 0.3 * randn(n, t), "lpb": 0.3 * randn(n, t),
        "probs": probs, "mu": torch.rand(n, t, device="cuda", generator=g) * 0.9 + 0.1,
        "act": torch.randint(0, num_actions, (n, t), device="cuda", generator=g), "nq": randn(n, t, num_actions),
    }  # fmt: skip


# name -> (call(x), bytes per element read + written at float32 with bool flags, num_actions = 4)
CASES = {
    "compute_gae": (lambda x: R.compute_gae(x["r"], x["v"], x["term"], gamma=0.99, lambda_=0.95), 4 + 4 + 1 + 4),
    "compute_vtrace": (
        lambda x: R.compute_vtrace(x["lpt"], x["lpb"], x["v"], x["r"], x["term"], gamma=0.99),
        4 * 4 + 1 + 2 * 4,
    ),
    "compute_retrace": (
        lambda x: R.compute_retrace(
            x["probs"], x["mu"], x["v"], x["nq"], x["act"], x["r"], x["term"], x["trunc"], gamma=0.99, lambda_=0.95
        ),
        4 * 4 + 4 + 4 + 4 * 4 + 8 + 4 + 1 + 1 + 2 * 4,
    ),
    "compute_discounted_returns": (lambda x: R.compute_discounted_returns(x["r"], x["term"], gamma=0.99), 4 + 1 + 4),
    "compute_lambda_returns": (
        lambda x: R.compute_lambda_returns(x["r"], x["nv"], x["term"], gamma=0.99, lambda_=0.95),
        4 + 4 + 1 + 4,
    ),
    "compute_eligibility_traces": (
        lambda x: R.compute_eligibility_traces(x["r"], x["term"], gamma=0.99, lambda_=0.95),
        4 + 1 + 4,
    ),
    "compute_episodic_prefix_sum": (lambda x: R.compute_episodic_prefix_sum(x["r"], x["term"]), 4 + 1 + 4),
}


def _as_tuple(x):
    return x if isinstance(x, tuple) else (x,)


def measure(name: str, n: int, t: int) -> dict:
    call_fn, per_elem = CASES[name]
    x = _inputs(n, t)

    def call():
        return call_fn(x)

    out = _as_tuple(call())
    x64 = {k: (v.double() if v.is_floating_point() else v) for k, v in x.items()}
    with R.use_backend("torch"):
        ref = _as_tuple(call_fn(x64))
    err = max(float((o.double() - e).abs().max()) for o, e in zip(out, ref, strict=True))
    ms = triton.testing.do_bench(call, return_mode="median")
    nbytes = n * t * per_elem
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
        "fn": name, "num_envs": n, "seq_len": t, "dtype": "float32", "max_abs_err_vs_fp64": err,
        "kernel_us": ms * 1e3, "full_call_us": times[len(times) // 2] * 1e3, "bytes": nbytes,
        "GBps": gbps / 1e9, "copy_GBps": copy / 1e9, "fraction_of_copy": gbps / copy,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    shapes = [(64, 512), (4096, 2048), (16384, 256), (16, 32768), (1, 262144)]
    rows = [measure("compute_gae", n, t) for n, t in shapes]
    rows += [measure(name, n, t) for name in CASES if name != "compute_gae" for n, t in [(64, 512), (4096, 2048)]]
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
