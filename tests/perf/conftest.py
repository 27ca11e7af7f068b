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


@pytest.fixture(autouse=True)
def _poison_empty():
    """Overrides tests/conftest.py's NaN poisoning of torch.empty for the perf tests: the fill it adds
    to every output allocation ran inside the timed region (the CUDA graph of one public call), one
    more write of every output, and made the perf suite report lower fractions of copy than
    ``python -m benchmarks.targets`` for the same kernels (traces 1x1,048,576: 0.41 vs 0.59)."""
    yield
