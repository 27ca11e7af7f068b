#!/usr/bin/env bash
# Set up the virtual environment (first run only) and run the demo: every rl_triton function on
# the available device, checked against a float64 PyTorch evaluation of the same formulas.
# Extra arguments go to examples/demo.py (e.g. --device cpu --num-envs 8 --seq-len 1000).
set -euo pipefail
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
rlt_setup
cd "$RLT_REPO"
exec "$RLT_PY" examples/demo.py "$@"
