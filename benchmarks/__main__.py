"""``python -m benchmarks``: the benchmark runner (see benchmarks/run.py and benchmarks/README.md).

Exits with status 1 when a configuration raised or rl_triton failed its float64 check."""

import sys

from .run import main

results = main()
bad = [r for r in results["rows"] if "error" in r or not r.get("correct", False)]
if bad:
    print(f"{len(bad)} configuration(s) raised or were incorrect; see the JSON / table above", file=sys.stderr)
sys.exit(1 if bad else 0)
