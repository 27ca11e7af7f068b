"""Plots learning curves written by ``ppo.py --log`` / ``impala.py --log`` on one figure.

Usage::

    python examples/plot_curves.py docs/ppo_cartpole.png runs/ppo_rl_triton.csv runs/ppo_torchrl.csv

Each log becomes one series (episode returns as faint dots, their running mean as a line), labelled
with its estimator, seed, final mean return and wall time.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _common as common


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="PNG to write")
    p.add_argument("logs", type=Path, nargs="+", help=".csv or .json logs")
    p.add_argument("--title", default=None)
    args = p.parse_args(argv)
    runs = [common.load_log(path) for path in args.logs]
    algos = sorted({r.get("algorithm", "?") for r in runs})
    title = args.title or f"{' / '.join(algos)} on {runs[0].get('env', common.ENV_NAME)}"
    targets = {r.get("target_return") for r in runs}
    target = targets.pop() if len(targets) == 1 else None
    common.plot_curves([(common.run_label(r), r) for r in runs], args.out, title, target)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
