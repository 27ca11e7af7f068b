"""Kernel times of several source trees compared on CUDA in one run: for each tree and each round, a
fresh process measures each case with ``benchmarks.targets.measure`` (do_bench median of a CUDA-graph
replay of one public call, and its fraction of a copy of the same bytes timed in the same process),
then lists the register count and spills of every compiled look-back kernel (``launch._COMPILED``,
PHASE 3-5). Rounds alternate the order of the trees. Item Z of NOTES.md ("Performance") was measured
by a one-off script of which this is the kept form (same cases and method; the JSON files
``benchmarks/results/lookback_epochs*_h200.json`` are laid out differently).

Usage (the trees hold ``rl_triton/`` and ``benchmarks/``, e.g. from ``git archive REV rl_triton
benchmarks | tar -x -C DIR``; float32, Retrace with 4 actions):

    python -m benchmarks.kernels_ab DIR [DIR ...] [--cases compute_gae:1x1048576,...] [--rounds 2] [--out J]
"""

from __future__ import annotations

import argparse
import json

from .modules_ab import alternate, run_child

CASES = [
    ("compute_discounted_returns", 1, 16777216), ("compute_lambda_returns", 1, 1048576),
    ("compute_gae", 1, 1048576), ("compute_vtrace", 1, 1048576), ("compute_discounted_returns", 1, 1048576),
    ("compute_retrace", 1, 1048576), ("compute_gae", 1, 16777216), ("compute_vtrace", 16, 1048576),
    ("compute_lambda_returns", 64, 262144), ("compute_eligibility_traces", 1, 16777216),
]  # fmt: skip

_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from benchmarks import targets
from rl_triton.kernels import launch

cases = []
for fn, n, t in json.loads(sys.argv[2]):
    r = targets.measure(fn, n, t)
    cases.append({"function": fn, "num_envs": n, "seq_len": t, "kernel_us": r["kernel_us"],
                  "fraction_of_copy": r["fraction_of_copy"]})
compiled = []
for (kernel, warps, constexprs), ck in launch._COMPILED.items():
    constexprs = dict(constexprs)
    if constexprs.get("PHASE", 0) >= 3:
        ck._init_handles()
        compiled.append({"kernel": kernel.fn.__name__, "warps": warps, "BT": constexprs.get("BT"),
                         "PHASE": constexprs["PHASE"], "maxnreg": constexprs.get("maxnreg"),
                         "registers": ck.n_regs, "spills": ck.n_spills})
print(json.dumps({"cases": cases, "compiled": compiled}))
"""


def parse_cases(text: str) -> list[tuple[str, int, int]]:
    """``fn:NxT,fn:NxT`` -> [(fn, N, T), ...]."""
    out = []
    for item in text.split(","):
        fn, shape = item.strip().split(":")
        n, t = shape.lower().split("x")
        out.append((fn, int(n), int(t)))
    return out


def report(cases: list[tuple[str, int, int]], rounds: dict[str, list[dict]]) -> list[str]:
    """One line per case: each tree's kernel µs (fraction of copy) in every round, trees apart by ``|``."""
    lines = []
    for i, (fn, n, t) in enumerate(cases):
        cells = [
            " / ".join(f"{r['cases'][i]['kernel_us']:.1f} ({r['cases'][i]['fraction_of_copy']:.3f})" for r in runs)
            for runs in rounds.values()
        ]
        lines.append(f"{fn.removeprefix('compute_'):22s} {n}x{t}: " + "  |  ".join(cells))
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--cases", default=None, help="fn:NxT list (default: the look-back cases of item Z)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cases = parse_cases(args.cases) if args.cases else CASES
    rounds = alternate(args.trees, args.rounds, lambda tree: run_child(_CHILD, tree, cases))
    print("trees: " + "  |  ".join(args.trees))
    print("\n".join(report(cases, rounds)))
    for tree, runs in rounds.items():
        print(tree)
        for k in runs[0]["compiled"]:
            print(f"  {k['kernel']} PHASE {k['PHASE']} BT {k['BT']} warps {k['warps']} maxnreg {k['maxnreg']}: "
                  f"{k['registers']} registers, {k['spills']} spilled")  # fmt: skip
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"cases": cases, "rounds": rounds}, f, indent=1)


if __name__ == "__main__":
    main()
