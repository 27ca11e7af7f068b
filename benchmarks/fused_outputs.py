"""The estimators' second output from the same launch, against the two launches it replaced (NOTES.md,
"Performance", item R), on CUDA, float32:

* kernels: GPU time of everything one call launches (CUDA-graph replay, ``do_bench`` median) and the
  full call (CUDA events) of ``gae_with_next_values(targets=True)`` against the advantages followed by
  ``.add(values)``, and of ``returns_with_advantages`` against ``compute_lambda_returns`` /
  ``compute_discounted_returns`` followed by ``.sub(values)``; each pair checked bit for bit first.
* modules: full calls of ``GAE``, ``TD1Estimator`` and ``TDLambdaEstimator`` on ``[N, T, 1]``
  TensorDicts, the fused path against the two launches (the functional entry points swapped for
  wrappers that do the second op separately), in alternating rounds in one process, because the host
  time of a call drifts between runs.

Usage: python -m benchmarks.fused_outputs [--out results.json] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

import rl_triton as R
from benchmarks import timing
from rl_triton import functional as F

KERNEL_SHAPES = [(64, 512), (1024, 1024), (4096, 2048), (16384, 512), (8192, 4096), (16, 1 << 20), (1, 1 << 20)]
MODULE_SHAPES = [(64, 512), (1024, 1024), (4096, 2048)]


def _pairs(r, v, nv, term, done) -> dict:
    """Per estimator: (fused call, the two launches), both returning the second output last."""
    kw = dict(gamma=0.99, lambda_=0.95)
    return {
        "gae": (
            lambda: F.gae_with_next_values(r, v, nv, term, done, targets=True, **kw)[1],
            lambda: F.gae_with_next_values(r, v, nv, term, done, **kw).add(v),
        ),
        "td_lambda": (
            lambda: F.returns_with_advantages(r, v, term, done, next_values=nv, bootstrap_values=nv, **kw)[1],
            lambda: R.compute_lambda_returns(r, nv, term, done, bootstrap_values=nv, **kw).sub(v),
        ),
        "td1": (
            lambda: F.returns_with_advantages(r, v, term, done, gamma=0.99, lambda_=1.0, bootstrap_values=nv)[1],
            lambda: R.compute_discounted_returns(r, term, done, gamma=0.99, bootstrap_values=nv).sub(v),
        ),
    }


def kernel_rows(device: torch.device) -> list[dict]:
    rows = []
    for n, t in KERNEL_SHAPES:
        g = torch.Generator(device=device).manual_seed(0)
        r, v, nv = (torch.randn(n, t, device=device, generator=g) for _ in range(3))
        done = torch.rand(n, t, device=device, generator=g) < 0.02
        term = done & (torch.rand(n, t, device=device, generator=g) < 0.5)
        for name, (fused, separate) in _pairs(r, v, nv, term, done).items():
            if not torch.equal(fused(), separate()):
                raise AssertionError(f"{name} {n}x{t}: the fused output differs from the separate op")
            row = dict(
                fn=name, num_envs=n, seq_len=t,
                fused_us=timing.kernel_us(fused, device, timing.QUICK, graph=True),
                separate_us=timing.kernel_us(separate, device, timing.QUICK, graph=True),
                full_fused_us=timing.full_call_us(lambda _, f=fused: f(), device, timing.QUICK),
                full_separate_us=timing.full_call_us(lambda _, f=separate: f(), device, timing.QUICK),
            )  # fmt: skip
            rows.append(row)
            print(f"{name:9s} {n}x{t}: GPU {row['fused_us']:.1f} vs {row['separate_us']:.1f} us, full call "
                  f"{row['full_fused_us']:.1f} vs {row['full_separate_us']:.1f} us", flush=True)  # fmt: skip
    return rows


def _two_launches():
    """Stand-ins for the fused entry points that do the second op separately (the previous modules)."""
    gae, returns = F.gae_with_next_values, F.returns_with_advantages

    def gae_then_add(r, v, *args, targets=False, **kwargs):
        adv = gae(r, v, *args, **kwargs)
        return (adv, adv + v) if targets else adv

    def returns_then_sub(r, v, term, trunc, *, gamma, lambda_, next_values=None, bootstrap_values=None):
        if next_values is None:
            ret = R.compute_discounted_returns(r, term, trunc, gamma=gamma, bootstrap_values=bootstrap_values)
        else:
            ret = R.compute_lambda_returns(
                r, next_values, term, trunc, gamma=gamma, lambda_=lambda_, bootstrap_values=bootstrap_values
            )
        return ret, ret - v

    return (gae, returns), (gae_then_add, returns_then_sub)


def module_rows(rounds: int) -> list[dict]:
    from benchmarks.modules_vs_torchrl import full_call_us, rollout
    from rl_triton.modules import GAE, TD1Estimator, TDLambdaEstimator

    modules = {
        "GAE": GAE(gamma=0.99, lmbda=0.95, value_network=None),
        "TD1Estimator": TD1Estimator(gamma=0.99, value_network=None),
        "TDLambdaEstimator": TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=None),
    }
    fused, separate = _two_launches()
    rows = []
    try:
        for n, t in MODULE_SHAPES:
            td = rollout(n, t, "cuda")
            for name, module in modules.items():
                times: dict[str, list[float]] = {"fused": [], "separate": []}
                for _ in range(rounds):
                    for which, fns in (("fused", fused), ("separate", separate)):
                        F.gae_with_next_values, F.returns_with_advantages = fns
                        times[which].append(full_call_us(module, td, reps=300))
                F.gae_with_next_values, F.returns_with_advantages = fused
                row = dict(module=name, num_envs=n, seq_len=t, rounds_us=times)
                for which in times:
                    row[f"{which}_min_us"] = min(times[which])
                    row[f"{which}_median_us"] = statistics.median(times[which])
                rows.append(row)
                fused_txt = f"{row['fused_min_us']:.1f} (median {row['fused_median_us']:.1f})"
                separate_txt = f"{row['separate_min_us']:.1f} ({row['separate_median_us']:.1f})"
                print(f"{name:17s} {n}x{t}: fused {fused_txt} us, two launches {separate_txt} us", flush=True)
    finally:
        F.gae_with_next_values, F.returns_with_advantages = fused
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    device = torch.device("cuda")
    result = {
        "meta": {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__},
        "kernels": kernel_rows(device),
        "modules": module_rows(args.rounds),
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
