"""The estimator modules of several source trees compared on CUDA in one run: for each tree and each
round, a fresh process times ``GAE``, ``TD0Estimator``, ``TD1Estimator`` and ``TDLambdaEstimator``
(no value network) on ``[N, T, 1]`` TensorDicts, and the public functions ``compute_gae``,
``compute_vtrace``, ``compute_lambda_returns`` and ``compute_discounted_returns`` on ``(N, T)``
tensors (float32, bool flags), as full calls (CUDA events around one call, median of 300) and as
host time per call in a loop of 2000. Rounds
alternate the trees, because the host time of a call drifts between processes by up to ~1.7x on the
H200's host; compare the fastest rounds.

Usage (the trees hold ``rl_triton/`` and ``benchmarks/``, e.g. from ``git archive REV rl_triton
benchmarks | tar -x -C DIR``):

    python -m benchmarks.modules_ab DIR [DIR ...] [--rounds 4] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

SHAPES = [(64, 512), (4096, 2048)]

_CHILD = r"""
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1])
from benchmarks.modules_vs_torchrl import full_call_us, rollout
from rl_triton.modules import GAE, TD0Estimator, TD1Estimator, TDLambdaEstimator

result = {}
for n, t in json.loads(sys.argv[2]):
    td = rollout(n, t, "cuda")
    modules = {
        "GAE": GAE(gamma=0.99, lmbda=0.95, value_network=None),
        "TD0Estimator": TD0Estimator(gamma=0.99, value_network=None),
        "TD1Estimator": TD1Estimator(gamma=0.99, value_network=None),
        "TDLambdaEstimator": TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=None),
    }
    for name, module in modules.items():
        full = full_call_us(module, td, reps=300)
        batch = [td.clone(False) for _ in range(2000)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for data in batch:
            module(data)
        host = (time.perf_counter() - t0) / len(batch) * 1e6
        torch.cuda.synchronize()
        result[f"{name} {n}x{t}"] = {"full_call_us": full, "host_us": host}
    import rl_triton as R

    g = torch.Generator(device="cuda").manual_seed(0)
    r, v, nv, lp = (torch.randn(n, t, device="cuda", generator=g) for _ in range(4))
    term = torch.rand(n, t, device="cuda", generator=g) < 0.01
    calls = {
        "compute_gae": lambda: R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95),
        "compute_vtrace": lambda: R.compute_vtrace(lp, lp, v, r, term, gamma=0.99),
        "compute_lambda_returns": lambda: R.compute_lambda_returns(r, nv, term, gamma=0.99, lambda_=0.95),
        "compute_discounted_returns": lambda: R.compute_discounted_returns(r, term, gamma=0.99),
    }
    for name, call in calls.items():
        full = full_call_us(lambda _data, call=call: call(), td, reps=300)  # the modules' timing; td unused
        t0 = time.perf_counter()
        for _ in range(2000):
            call()
        host = (time.perf_counter() - t0) / 2000 * 1e6
        torch.cuda.synchronize()
        result[f"{name} {n}x{t}"] = {"full_call_us": full, "host_us": host}
print(json.dumps(result))
"""


def run_child(code: str, tree: str, payload) -> dict:
    """Runs ``code`` in a fresh Python process as ``python -c code TREE JSON(payload)`` (the code puts
    TREE first on sys.path) and returns the JSON object its last line of output holds."""
    proc = subprocess.run(
        [sys.executable, "-c", code, tree, json.dumps(payload)], capture_output=True, text=True, check=False
    )
    if proc.returncode:
        raise RuntimeError(f"{tree}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def alternate(trees: list[str], rounds: int, run) -> dict[str, list]:
    """``run(tree)`` for every tree, ``rounds`` times; odd rounds take the trees in reverse order, so
    that no tree always runs first (the machine's state drifts between processes)."""
    out: dict[str, list] = {tree: [] for tree in trees}
    for i in range(rounds):
        for tree in trees if i % 2 == 0 else trees[::-1]:
            out[tree].append(run(tree))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rounds = alternate(args.trees, args.rounds, lambda tree: run_child(_CHILD, tree, SHAPES))
    for tree, runs in rounds.items():
        print(tree)
        for key in runs[0]:
            full = min(r[key]["full_call_us"] for r in runs)
            host = min(r[key]["host_us"] for r in runs)
            print(f"  {key:28s} fastest round: full call {full:7.1f} us, host {host:7.1f} us")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"shapes": SHAPES, "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
