# shellcheck shell=bash
# Shared set-up for scripts/demo.sh, scripts/test.sh and scripts/lint.sh. Source it, don't run it.
#
# rlt_setup creates (or reuses) a virtual environment and installs rl-triton into it, editable,
# with the dev tools. It picks one of three modes:
#
#   system  python3 already has a torch that sees a CUDA GPU (e.g. a prepared GPU image, possibly
#           without network access): the venv is made with --system-site-packages and reuses that
#           torch/triton; rl-triton is installed with --no-deps --no-build-isolation, so nothing is
#           downloaded.
#   cuda    nvidia-smi finds a GPU but python3 has no usable torch: a normal (CUDA) torch is
#           installed from the package index.
#   cpu     no GPU: the CPU build of torch is installed explicitly first (a bare `torch`
#           requirement would pull a multi-GB CUDA build), with the Triton release the tests are
#           run against; kernels then run through the Triton interpreter (TRITON_INTERPRET=1).
#
# Environment overrides:
#   RL_TRITON_VENV          venv location (default: <repo>/.venv)
#   RL_TRITON_PYTHON        interpreter used to create the venv (default: python3)
#   RL_TRITON_SETUP_MODE    force a mode: system | cuda | cpu
#   RL_TRITON_TORCH_SPEC    torch requirement in cpu mode (default: torch==2.13.0)
#   RL_TRITON_TRITON_SPEC   triton requirement in cpu mode (default: triton==3.6.0)
#   RL_TRITON_FORCE_SETUP=1 re-run the install step even if the venv looks up to date
#
# After rlt_setup: RLT_REPO (repo root), RLT_VENV, RLT_PY (the venv's python), RLT_MODE.

RLT_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RLT_VENV="${RL_TRITON_VENV:-$RLT_REPO/.venv}"
RLT_PY="$RLT_VENV/bin/python"
RLT_MODE=""

rlt_log() { printf '==> %s\n' "$*" >&2; }
rlt_die() { printf 'error: %s\n' "$*" >&2; exit 1; }

_rlt_base_python() {
    local py="${RL_TRITON_PYTHON:-python3}"
    command -v "$py" >/dev/null 2>&1 || rlt_die "'$py' not found; install Python >= 3.10 or set RL_TRITON_PYTHON"
    "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' \
        || rlt_die "$("$py" --version 2>&1) is too old: rl-triton needs Python >= 3.10 (set RL_TRITON_PYTHON)"
    printf '%s\n' "$py"
}

_rlt_detect_mode() {
    local py="$1"
    if [[ -n "${RL_TRITON_SETUP_MODE:-}" ]]; then
        case "$RL_TRITON_SETUP_MODE" in
            system | cuda | cpu) printf '%s\n' "$RL_TRITON_SETUP_MODE"; return ;;
            *) rlt_die "RL_TRITON_SETUP_MODE must be system, cuda or cpu (got '$RL_TRITON_SETUP_MODE')" ;;
        esac
    fi
    if "$py" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
        echo system
    elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
        echo cuda
    else
        echo cpu
    fi
}

# True when the venv exists, runs, has pip, and its system-site-packages setting fits the mode.
_rlt_venv_ok() {
    local mode="$1" want_system
    [[ -x "$RLT_PY" && -f "$RLT_VENV/pyvenv.cfg" ]] || return 1
    "$RLT_PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' >/dev/null 2>&1 || return 1
    "$RLT_PY" -m pip --version >/dev/null 2>&1 || return 1
    want_system=false
    [[ "$mode" == system ]] && want_system=true
    grep -qiE "^include-system-site-packages *= *$want_system" "$RLT_VENV/pyvenv.cfg" || return 1
}

# A fingerprint of everything that decides what gets installed; stored in the venv after a
# successful install so that a re-run can skip pip entirely.
_rlt_stamp() {
    local mode="$1" hash
    hash="$(cksum <"$RLT_REPO/pyproject.toml" | cut -d' ' -f1)"
    printf 'mode=%s pyproject=%s torch=%s triton=%s repo=%s\n' "$mode" "$hash" \
        "${RL_TRITON_TORCH_SPEC:-torch==2.13.0}" "${RL_TRITON_TRITON_SPEC:-triton==3.6.0}" "$RLT_REPO"
}

# True when the venv can import what the scripts need and rl_triton resolves to this checkout.
# Uses find_spec (no import of torch), so it costs well under a second.
_rlt_installed_ok() {
    "$RLT_PY" -I - "$RLT_REPO" "$@" <<'PY' >/dev/null 2>&1
import importlib.util
import os
import sys

repo, names = sys.argv[1], sys.argv[2:]
for name in ["torch", "triton", "numpy", *names]:
    if importlib.util.find_spec(name) is None:
        sys.exit(1)
spec = importlib.util.find_spec("rl_triton")
if spec is None or spec.origin is None:
    sys.exit(1)
if os.path.realpath(os.path.dirname(spec.origin)) != os.path.realpath(os.path.join(repo, "rl_triton")):
    sys.exit(1)
PY
}

# `python3 -m venv --system-site-packages` exposes the site-packages of the *base* interpreter.
# When python3 is itself a virtual environment (a GPU image may keep torch in one), its packages
# would be invisible; a .pth file in our venv adds its site directories (with their own .pth
# files) after ours.
_rlt_link_base_site() {
    local py="$1" site pth
    site="$("$RLT_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    pth="$site/_rl_triton_base_site.pth"
    "$py" - "$pth" <<'PY'
import site
import sys

pth = sys.argv[1]
if sys.prefix == sys.base_prefix:  # a plain interpreter: --system-site-packages already covers it
    lines = []
else:
    lines = [f"import site; site.addsitedir({d!r})" for d in site.getsitepackages()]
if lines:
    with open(pth, "w") as f:
        f.write("\n".join(lines) + "\n")
PY
}

_rlt_install() {
    local mode="$1"
    local pip=("$RLT_PY" -m pip install --quiet --disable-pip-version-check --progress-bar off)
    case "$mode" in
        system)
            rlt_log "using the system torch/triton (CUDA available); installing rl-triton without dependencies"
            local log="$RLT_VENV/pip-install.log"
            if ! "${pip[@]}" --no-deps --no-build-isolation -e "$RLT_REPO" >"$log" 2>&1; then
                # No network and no usable setuptools/wheel: point the venv at the checkout directly.
                local site
                site="$("$RLT_PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
                rlt_log "pip could not install the checkout (see $log); adding it to $site/rl_triton_checkout.pth"
                printf '%s\n' "$RLT_REPO" >"$site/rl_triton_checkout.pth"
            fi
            local missing
            missing="$("$RLT_PY" -c 'import importlib.util as u; print(" ".join(n for n in ["pytest", "hypothesis"] if u.find_spec(n) is None))')"
            [[ -z "$missing" ]] || rlt_log "warning: not installed here (no network in system mode?): $missing"
            ;;
        cuda)
            rlt_log "NVIDIA GPU found; installing torch (CUDA build) and rl-triton[dev]"
            "${pip[@]}" torch
            "${pip[@]}" -e "$RLT_REPO[dev,torchrl,examples]"
            ;;
        cpu)
            local torch_spec="${RL_TRITON_TORCH_SPEC:-torch==2.13.0}" triton_spec="${RL_TRITON_TRITON_SPEC:-triton==3.6.0}"
            rlt_log "no CUDA GPU; installing $torch_spec (CPU build), $triton_spec and rl-triton[dev]"
            "${pip[@]}" "$torch_spec" "$triton_spec"
            "${pip[@]}" -e "$RLT_REPO[dev,torchrl,examples]" "$torch_spec" "$triton_spec"
            ;;
    esac
}

_rlt_setup_locked() {
    local py mode stamp_file="$RLT_VENV/.rl-triton-setup"
    py="$(_rlt_base_python)"
    mode="$(_rlt_detect_mode "$py")"
    RLT_MODE="$mode"

    if ! _rlt_venv_ok "$mode"; then
        if [[ -e "$RLT_VENV" ]]; then
            [[ -f "$RLT_VENV/pyvenv.cfg" ]] || rlt_die "$RLT_VENV exists but is not a virtual environment; move it away"
            rlt_log "recreating $RLT_VENV (broken, or made for another mode)"
            rm -rf -- "$RLT_VENV"
        fi
        local venv_args=()
        [[ "$mode" == system ]] && venv_args+=(--system-site-packages)
        rlt_log "creating $RLT_VENV with $("$py" --version 2>&1) (mode: $mode)"
        "$py" -m venv "${venv_args[@]}" "$RLT_VENV"
    fi
    if [[ "$mode" == system ]]; then _rlt_link_base_site "$py"; fi

    local want
    want="$(_rlt_stamp "$mode")"
    if [[ "${RL_TRITON_FORCE_SETUP:-0}" != 1 && -f "$stamp_file" && "$(cat "$stamp_file")" == "$want" ]] \
        && _rlt_installed_ok; then
        rlt_log "$RLT_VENV is up to date (mode: $mode)"
        return 0
    fi
    _rlt_install "$mode"
    _rlt_installed_ok || rlt_die "set-up finished but torch/triton/numpy/rl_triton are not importable from $RLT_VENV"
    printf '%s\n' "$want" >"$stamp_file"
}

rlt_setup() {
    [[ -f "$RLT_REPO/pyproject.toml" ]] || rlt_die "no pyproject.toml in $RLT_REPO"
    mkdir -p "$(dirname "$RLT_VENV")"
    if command -v flock >/dev/null 2>&1; then
        # Serialise concurrent runs (e.g. demo.sh and test.sh started together) on one venv.
        local lock_fd
        exec {lock_fd}>"$RLT_VENV.lock"
        flock "$lock_fd"
        _rlt_setup_locked
        flock -u "$lock_fd"
        exec {lock_fd}>&-
    else
        _rlt_setup_locked
    fi
}
