#!/usr/bin/env bash
# Set up the virtual environment (first run only) and run ruff: lint, then a format check.
# Pass --fix to apply lint fixes and reformat instead of only checking.
set -euo pipefail
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
rlt_setup
cd "$RLT_REPO"
if [[ "${1:-}" == --fix ]]; then
    "$RLT_PY" -m ruff check --fix .
    "$RLT_PY" -m ruff format .
else
    "$RLT_PY" -m ruff check .
    "$RLT_PY" -m ruff format --check .
fi
