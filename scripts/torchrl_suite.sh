#!/usr/bin/env bash
# TorchRL's own objective tests with rl_triton's estimators registered in TorchRL
# (tests/modules/torchrl_suite.py): every failure other than a documented deviation fails the run.
#
#   bash scripts/torchrl_suite.sh [--full] [TORCHRL_CHECKOUT] [pytest arguments]
#
# TORCHRL_CHECKOUT (or $TORCHRL_SRC) is a checkout of TorchRL's repository at the tag of the
# installed torchrl (TorchRL publishes no source distribution with its tests). Without --full the
# files of the fast subset run (tests/modules/torchrl_suite.py: FAST_FILES); with it, every file of
# test/objectives. Without a checkout the script says so and exits 0 when RL_TRITON_TORCHRL_OPTIONAL=1
# is set, 2 otherwise.
set -euo pipefail
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
rlt_setup

full=0
src="${TORCHRL_SRC:-}"
args=()
for arg in "$@"; do
    case "$arg" in
        --full) full=1 ;;
        *)
            if [[ -z "$src" && "$arg" != -* && -d "$arg/test/objectives" ]]; then
                src="$arg"
            else
                args+=("$arg")
            fi
            ;;
    esac
done

if [[ -z "$src" || ! -d "$src/test/objectives" ]]; then
    echo "torchrl_suite: no TorchRL checkout (pass its path or set TORCHRL_SRC); TorchRL's tests not run" >&2
    if [[ "${RL_TRITON_TORCHRL_OPTIONAL:-0}" == 1 ]]; then exit 0; fi
    exit 2
fi
src="$(cd "$src" && pwd)"

installed="$("$RLT_PY" -c 'import torchrl; print(torchrl.__version__.split("+")[0])')"
if [[ -f "$src/version.txt" ]]; then
    checkout="$(tr -d '[:space:]' <"$src/version.txt")"
    if [[ "$checkout" != "$installed"* ]]; then
        echo "torchrl_suite: warning: the checkout is TorchRL $checkout, the installed torchrl $installed" >&2
    fi
fi

files=()
if [[ "$full" == 1 ]]; then
    files=(.)
else
    while IFS= read -r name; do
        [[ -f "$src/test/objectives/$name" ]] && files+=("$name")
    done < <(cd "$RLT_REPO" && "$RLT_PY" -c 'from tests.modules.torchrl_suite import FAST_FILES; print(*FAST_FILES, sep="\n")')
    if [[ ${#files[@]} == 0 ]]; then
        echo "torchrl_suite: none of the fast subset's files is in $src/test/objectives" >&2
        exit 2
    fi
fi

echo "torchrl_suite: TorchRL $installed, ${files[*]} in $src/test/objectives"
cd "$src/test/objectives"
# Our repository first on the path, for the plugin; one process, so the plugin's count of the
# estimators built covers every test. The pytest cache stays out of the checkout.
rc=0
PYTHONPATH="$RLT_REPO${PYTHONPATH:+:$PYTHONPATH}" "$RLT_PY" -m pytest "${files[@]}" -q -rxf \
    -p tests.modules.torchrl_suite -p no:cacheprovider -p no:xdist "${args[@]}" || rc=$?
if [[ "$rc" == 5 ]]; then
    echo "torchrl_suite: pytest collected no tests" >&2
    exit 1
fi
exit "$rc"
