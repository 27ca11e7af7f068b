"""Shared by the perf tests: they time compiled kernels, never Triton's interpreter."""

import pytest


@pytest.fixture(autouse=True)
def _compiled_kernels():
    import rl_triton

    if rl_triton.INTERPRET:
        pytest.skip(
            "perf: TRITON_INTERPRET=1 would run the kernels in Triton's interpreter; set "
            "RL_TRITON_TEST_NO_INTERPRET=1 (bash scripts/test.sh does on a GPU machine)"
        )
