#!/usr/bin/env bash
# Set up the virtual environment (first run only) and run the main job: PPO on CartPole-v1 with
# TorchRL's collector and ClipPPOLoss and rl_triton.modules.GAE (on the GPU when there is one).
# Extra arguments go to examples/ppo.py (e.g. --estimator torchrl --seed 1 --plot curve.png).
# The per-function check against the float64 reference is `python examples/demo.py`.
set -euo pipefail
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
rlt_setup
cd "$RLT_REPO"
exec "$RLT_PY" examples/ppo.py "$@"
