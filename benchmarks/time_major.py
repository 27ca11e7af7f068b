"""Time-major calls on the GPU: every per-step tensor the (N, T) view ``x.T`` of a contiguous (T, N) buffer,
as a ``[num_steps, num_envs]`` rollout buffer gives, and Retrace's per-action tensors (N, T, A) views of
(T, N, A) ones (rl_triton/_validation.py, ``TIME_MAJOR``).

For each function and shape it times, with ``triton.testing.do_bench`` medians of a CUDA-graph replay
(benchmarks/timing.py) in one process:

- ``contiguous_us``: the call on contiguous (N, T) inputs of the same values (what the layout costs);
- ``copy_path_us``: the time-major call with ``_validation.TIME_MAJOR = False``, i.e. a contiguous
  copy of every input first (what such calls cost before the kernels read time-major rows);
- for each policy variant (``--variants``: JSON list of overrides of ``launch._TM_*``; ``{}`` is the
  policy itself) the time-major call read in place, with its fraction of a device-to-device copy of the
  minimum bytes and its largest error relative to the contiguous call's outputs (float64);

and full-call times (CUDA events around one call) of the contiguous call, the copy path and the policy.

    python -m benchmarks.time_major --out benchmarks/results/time_major_h200.json
    python -m benchmarks.time_major --functions gae --shapes 4096x2048 --variants '[{}, {"_TM_BT": 256}]'
    python -m benchmarks.time_major --functions retrace --actions 18 --variants '[{}, {"_TM_RETRACE_WARPS": 4}]'
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from tqdm import tqdm

from rl_triton import _validation
from rl_triton.kernels import launch

from . import specs, timing

FUNCTIONS = "gae,vtrace,returns,lambda,traces,prefix,retrace"
SHAPES = "4096x24,16384x32,8x128,64x512,256x1024,4096x512,1024x2048,4096x2048"
KNOBS = (
    "_TM_BT", "_TM_BLOCK", "_TM_WARPS", "_TM_GROUP", "_TM_NDIV", "_TM_MIN_ENVS", "_TM_MAX_SPLIT", "_TM_RETRACE_BLOCK",
    "_TM_RETRACE_WARPS", "_TM_RETRACE_GROUP", "_TM_LOOKBACK", "_TM_WINDOW", "_TM_NDIV_LOOKBACK",
    "_TM_LOOKBACK_MIN_SPLIT",
)  # fmt: skip


def measure(fn: str, n: int, t: int, dtype: torch.dtype, variants: list[dict], budget: timing.Budget) -> dict:
    """One row: the timings above of ``fn`` at (n, t)."""
    dev = torch.device("cuda")
    spec = specs.SPECS[specs.resolve(fn)[0]]
    f = spec.primary
    xc = specs.Inputs(n, t, dtype, dev)
    xt = specs.Inputs(n, t, dtype, dev, time_major=True)
    nbytes = spec.nbytes(xc)
    gbps = timing.copy_gbps(nbytes, dev, budget)
    ref = [o.double() for o in f(xc)]
    row = {"function": spec.name, "num_envs": n, "seq_len": t, "dtype": str(dtype).removeprefix("torch.")}
    if spec.name == "compute_retrace":
        row["num_actions"] = specs.NUM_ACTIONS
    row |= {"bytes": nbytes, "copy_GBps": gbps, "contiguous_us": timing.kernel_us(lambda: f(xc), dev, budget, True)}
    row["contiguous_full_call_us"] = timing.full_call_us(lambda _: f(xc), dev, budget)
    _validation.TIME_MAJOR = False
    _validation.clear_cache()
    try:
        row["copy_path_us"] = timing.kernel_us(lambda: f(xt), dev, budget, True)
        row["copy_path_full_call_us"] = timing.full_call_us(lambda _: f(xt), dev, budget)
    finally:
        _validation.TIME_MAJOR = True
        _validation.clear_cache()
    defaults = {k: getattr(launch, k) for k in KNOBS}
    row["variants"] = {}
    try:
        for v in variants:
            for k, val in {**defaults, **v}.items():
                setattr(launch, k, val)  # launch's __setattr__ drops the cached plans
            outs = f(xt)
            if any(o.is_contiguous() for o in outs):  # copied (launch.time_major_in_place)
                row["variants"][json.dumps(v)] = {"copied": True}
                continue
            err = max(
                float((o.double() - r).abs().max() / (r.abs().max() + 1e-30)) for o, r in zip(outs, ref, strict=True)
            )
            us = timing.kernel_us(lambda: f(xt), dev, budget, True)
            frac = nbytes / (us * 1e-6) / 1e9 / gbps
            row["variants"][json.dumps(v)] = {"kernel_us": us, "fraction_of_copy": frac, "rel_err": err}
    finally:
        for k, val in defaults.items():
            setattr(launch, k, val)
    row["full_call_us"] = timing.full_call_us(lambda _: f(xt), dev, budget)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--functions", default=FUNCTIONS)
    ap.add_argument("--shapes", default=SHAPES, help="NxT list")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--variants", default="[{}]", help="JSON list of launch._TM_* overrides ({}: the policy)")
    ap.add_argument("--actions", type=int, default=specs.NUM_ACTIONS, help="Retrace's number of actions")
    ap.add_argument("--out", default=None, help="JSON path")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.time_major needs a CUDA GPU")
    variants = json.loads(a.variants)
    shapes = [tuple(int(v) for v in s.lower().split("x")) for s in a.shapes.split(",")]
    specs.NUM_ACTIONS = a.actions
    jobs = [(fn, n, t) for n, t in shapes for fn in specs.resolve(a.functions)]
    rows, t0 = [], time.time()
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "variants": variants}
    for fn, n, t in tqdm(jobs, desc="time-major", unit="call"):
        r = measure(fn, n, t, getattr(torch, a.dtype), variants, timing.QUICK)
        rows.append(r)
        own = r["variants"].get("{}", next(iter(r["variants"].values())))
        if own.get("copied"):
            own = {"kernel_us": r["copy_path_us"], "fraction_of_copy": float("nan")}
        tqdm.write(
            f"{r['function']:28s} {n}x{t}: contiguous {r['contiguous_us']:.1f} us, copy path {r['copy_path_us']:.1f}, "
            f"time-major {own['kernel_us']:.1f} ({own['fraction_of_copy']:.2f} of copy); full call "
            f"{r['contiguous_full_call_us']:.0f} / {r['copy_path_full_call_us']:.0f} / {r['full_call_us']:.0f} us"
        )
        if a.out:
            with open(a.out, "w") as f:
                json.dump({"meta": meta | {"seconds": time.time() - t0}, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
