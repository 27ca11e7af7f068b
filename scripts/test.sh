#!/usr/bin/env bash
# Set up the virtual environment (first run only) and run the test suite. Extra arguments go to
# pytest (e.g. `bash scripts/test.sh -k gae -x` or `bash scripts/test.sh tests/test_gae.py`).
# Exits with pytest's exit code; "no tests collected" (pytest exit code 5) is a failure.
#
# Unless TRITON_INTERPRET is already set: without a CUDA GPU, TRITON_INTERPRET=1 is set so that the
# Triton kernels are exercised on the CPU through the Triton interpreter, not only the PyTorch
# path; with a CUDA GPU, RL_TRITON_TEST_NO_INTERPRET=1 is set so that the tests run the compiled
# kernels (tests/conftest.py turns the interpreter on otherwise).
set -euo pipefail
# shellcheck source=scripts/_venv.sh
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
rlt_setup
cd "$RLT_REPO"

cuda="$("$RLT_PY" -c 'import torch; print(int(torch.cuda.is_available()))')"
if [[ -z "${TRITON_INTERPRET+set}" ]]; then
    if [[ "$cuda" == 1 ]]; then
        # Compiled kernels on the GPU; tests/conftest.py would otherwise default to the interpreter.
        export RL_TRITON_TEST_NO_INTERPRET="${RL_TRITON_TEST_NO_INTERPRET:-1}"
    else
        export TRITON_INTERPRET=1
    fi
fi

"$RLT_PY" - <<'PY'
import os
import platform

import numpy
import torch
import triton

print(f"python {platform.python_version()}  torch {torch.__version__}  triton {triton.__version__}  numpy {numpy.__version__}")
if torch.cuda.is_available():
    print(f"cuda {torch.version.cuda}  device {torch.cuda.get_device_name(0)}")
else:
    print("cuda: not available (CPU only)")
print(
    f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}  "
    f"RL_TRITON_TEST_NO_INTERPRET={os.environ.get('RL_TRITON_TEST_NO_INTERPRET', '')}"
)
PY

# Run tests/ unless the arguments already name test files or directories (e.g. tests/test_gae.py).
targets=(tests/)
for arg in "$@"; do
    if [[ "$arg" != -* && -e "${arg%%::*}" ]]; then
        targets=()
        break
    fi
done

# The tests run on several workers (pytest-xdist): without a CUDA GPU the interpreted kernels keep one core busy
# per test; with one, compiling the kernel variants is what takes the time, on the CPU, so up to 8 workers share
# the GPU. The perf tests time kernels and must have the GPU to themselves: on a GPU machine they run afterwards,
# in one process, when the selection is the whole suite. RL_TRITON_TEST_WORKERS overrides the worker count (0: one
# process); `-n N` or `-p no:xdist` among your arguments wins over both.
workers="${RL_TRITON_TEST_WORKERS:-}"
if [[ -z "$workers" ]]; then
    if [[ "$cuda" == 1 ]]; then
        workers="$("$RLT_PY" -c 'import os; print(min(8, os.cpu_count() or 1))')"
    else
        workers=auto
    fi
fi
for arg in "$@"; do
    case "$arg" in
        -n | -n* | --numprocesses* | no:xdist | -pno:xdist) workers="" ;;
    esac
done
parallel=()
if [[ -n "$workers" && "$workers" != 0 ]]; then
    # worksteal: a worker that runs out of tests takes some of another's (the slowest tests no longer form a tail)
    parallel=(-n "$workers" --dist worksteal)
fi
perf_after=0
if [[ "$cuda" == 1 && "${targets[*]}" == "tests/" && ${#parallel[@]} -gt 0 ]]; then
    perf_after=1
    parallel+=(--ignore=tests/perf)
fi

rc=0
"$RLT_PY" -m pytest "${targets[@]}" -q "${parallel[@]}" "$@" || rc=$?
if [[ "$perf_after" == 1 && ( "$rc" == 0 || "$rc" == 1 ) ]]; then
    prc=0
    "$RLT_PY" -m pytest tests/perf -q "$@" || prc=$?
    if [[ "$prc" != 0 && "$prc" != 5 ]]; then rc="$prc"; fi
fi
if [[ "$rc" == 5 ]]; then
    # Tests marked cuda or compiled are not collected where they cannot run (tests/conftest.py): a selection
    # of only those (e.g. tests/perf on a CPU machine) runs nothing, which is not an error.
    if RL_TRITON_TEST_COLLECT_GPU=1 "$RLT_PY" -m pytest "${targets[@]}" -q --co "$@" >/dev/null 2>&1; then
        echo "note: the selected tests need a CUDA GPU (compiled kernels); none of them runs on this machine" >&2
        exit 0
    fi
    echo "error: pytest collected no tests (exit code 5); treating that as a failure" >&2
    exit 1
fi
exit "$rc"
