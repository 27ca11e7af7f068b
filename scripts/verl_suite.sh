#!/usr/bin/env bash
# verl's own tests of its advantage estimators, run with rl_triton's functions in place of verl's
# (tests/verl_suite/plugin.py), plus tests/verl_suite/verl_checks.py (the registry as verl's trainer
# uses it, and the masked statistics against verl's own). Every failure fails the run.
#
#   bash scripts/verl_suite.sh [pytest arguments]          # CPU: the PyTorch path, then interpreted kernels
#   bash scripts/verl_suite.sh --download                  # put verl's wheel into .device-wheels/verl/
#   bash scripts/verl_suite.sh --offline [pytest args]     # no package index (the GPU machine; CI); --gpu alike
#
# Default: builds its own virtual environment .venv-verl (RL_TRITON_VERL_VENV) with the CPU build of torch,
# triton, verl==0.9.1 without its dependencies, and the few packages importing verl's core_algos and
# torch_functional needs (verl pins tensordict <= 0.10, so it cannot share .venv), and runs the test files
# that the verl release ships for these functions on the PyTorch path, then with TRITON_INTERPRET=1.
# --offline (or --gpu): RL_TRITON_PYTHON, else .venv's python if there is one, else python3, with its torch;
# verl from the wheel in .device-wheels/verl/, unpacked, not installed; only verl's core_algos,
# torch_functional and groupwise are imported, with stand-ins for the rest of verl and its heavy dependencies
# (tests/verl_suite/stubs.py); rl_triton's functions run on CUDA when there is a GPU (RL_TRITON_VERL_DEVICE),
# on the CPU otherwise (the path TRITON_INTERPRET chooses: one run).
# VERL_SRC: a checkout of verl's repository at the release's tag, for the masked-mean test of
# tests/utils/test_torch_functional.py, which the release does not ship.
set -euo pipefail
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"

VERL_VERSION=0.9.1
FILES=(test_core_algos_on_cpu.py test_reinforce_pp_multiturn_on_cpu.py)
wheels="$RLT_REPO/.device-wheels/verl"
work="$RLT_REPO/.verl-suite"

mode=cpu
args=()
for arg in "$@"; do
    case "$arg" in
        --offline | --gpu) mode=offline ;;
        --download) mode=download ;;
        *) args+=("$arg") ;;
    esac
done

if [[ "$mode" == download ]]; then
    py="$(_rlt_base_python)"
    mkdir -p "$wheels"
    "$py" -m pip download --quiet --disable-pip-version-check --no-deps -d "$wheels" "verl==$VERL_VERSION"
    ls -l "$wheels"
    exit 0
fi

export PYTHONPATH="$RLT_REPO${PYTHONPATH:+:$PYTHONPATH}"
if [[ "$mode" == offline ]]; then
    py="${RL_TRITON_PYTHON:-python3}"
    [[ -z "${RL_TRITON_PYTHON:-}" && -x "$RLT_PY" ]] && py="$RLT_PY"
    wheel="$(ls "$wheels"/verl-"$VERL_VERSION"-py3-none-any.whl 2>/dev/null || true)"
    [[ -n "$wheel" ]] || rlt_die "no verl $VERL_VERSION wheel in $wheels (bash scripts/verl_suite.sh --download)"
    rm -rf "$work" && mkdir -p "$work/src"
    "$py" -m zipfile -e "$wheel" "$work/src"
    export PYTHONPATH="$PYTHONPATH:$work/src" RL_TRITON_VERL_STUBS=1
    if [[ -z "${RL_TRITON_VERL_DEVICE:-}" ]]; then
        RL_TRITON_VERL_DEVICE="$("$py" -c 'import torch; print("cuda" if torch.cuda.is_available() else "cpu")')"
        export RL_TRITON_VERL_DEVICE
    fi
    site="$work/src"
else
    venv="${RL_TRITON_VERL_VENV:-$RLT_REPO/.venv-verl}"
    py="$venv/bin/python"
    want="verl=$VERL_VERSION torch=2.13.0 repo=$RLT_REPO"
    if [[ ! -f "$venv/.verl-suite-setup" || "$(cat "$venv/.verl-suite-setup")" != "$want" ]]; then
        rlt_log "creating $venv (torch CPU, triton, verl $VERL_VERSION without its dependencies)"
        rm -rf -- "$venv"
        "$(_rlt_base_python)" -m venv "$venv"
        pip=("$py" -m pip install --quiet --disable-pip-version-check --progress-bar off)
        "${pip[@]}" torch==2.13.0 triton==3.6.0 "numpy<2.4" pytest
        "${pip[@]}" --no-deps "verl==$VERL_VERSION"
        # what importing verl.trainer.ppo.core_algos and verl.utils.torch_functional needs (verl/__init__ pulls ray)
        "${pip[@]}" "tensordict<=0.10" "transformers>=5.5.3,<5.11,!=5.6.0" omegaconf hydra-core ray codetiming \
            "torch==2.13.0"
        "${pip[@]}" --no-deps --no-build-isolation -e "$RLT_REPO"
        printf '%s\n' "$want" >"$venv/.verl-suite-setup"
    fi
    site="$("$py" -c 'import importlib.util as u, os; print(os.path.dirname(u.find_spec("verl").origin))')/.."
    rm -rf "$work" && mkdir -p "$work"
fi

# verl's test files, copied out of the release (its top-level package "tests" would shadow ours)
for name in "${FILES[@]}"; do
    cp "$site/tests/trainer/ppo/$name" "$work/" || rlt_die "verl's $name is not in $site/tests/trainer/ppo"
done
paths=("${FILES[@]/#/$work/}" "$RLT_REPO/tests/verl_suite/verl_checks.py")
if [[ -n "${VERL_SRC:-}" ]]; then
    cp "$VERL_SRC/tests/utils/test_torch_functional.py" "$work/"
    paths+=("$work/test_torch_functional.py::test_masked_mean")
fi
versions="$("$py" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)')"
echo "verl_suite: verl $VERL_VERSION ($mode), $versions"

run() {
    # the pytest cache stays out of the tree; no conftest (ours needs packages the GPU image may lack)
    "$py" -m pytest "${paths[@]}" -q -rxf --noconftest -p tests.verl_suite.plugin -p no:cacheprovider \
        -p no:xdist "${args[@]}"
}
cd "$work"
if [[ "$mode" == offline ]]; then
    run
else
    env -u TRITON_INTERPRET bash -c "$(declare -f run); $(declare -p py paths args); run"
    TRITON_INTERPRET=1 bash -c "$(declare -f run); $(declare -p py paths args); run"
fi
