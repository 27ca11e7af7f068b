"""The test harness itself: poisoned allocations, an independent reference, backend selection."""

import ast
import inspect

import pytest
import torch

import rl_triton
from tests import reference
from tests._helpers import CPU_PATHS, FUNCTIONS, KERNEL_PATHS, check, valid_kwargs


def test_empty_is_poisoned_for_floats():
    assert torch.empty(4).isnan().all()
    assert torch.empty(2, 3, dtype=torch.float16).isnan().all()
    assert torch.empty_like(torch.zeros(3, dtype=torch.bfloat16)).isnan().all()
    assert torch.zeros(2).new_empty(5).isnan().all()
    assert torch.empty(3, dtype=torch.int64).dtype == torch.int64  # integer allocations untouched
    assert torch.empty(0).shape == (0,)


def test_reference_is_independent_of_the_package():
    tree = ast.parse(inspect.getsource(reference))
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(m.startswith("rl_triton") for m in imported), imported


def test_public_api_signatures_match_reference():
    for fn in FUNCTIONS:
        assert inspect.signature(getattr(rl_triton, fn)).parameters.keys() == (
            inspect.signature(getattr(reference, fn)).parameters.keys()
        ), fn


def test_path_fixture_sets_backend(path):
    assert rl_triton.current_backend() == path.backend


def test_only_runnable_paths_are_generated():
    """The ``path`` fixture's parameters are the paths this machine runs (no skipped CUDA cases on a CPU
    machine); KERNEL_PATHS and CPU_PATHS are the kernel and the CPU-tensor ones among them."""
    from tests import conftest

    cuda = torch.cuda.is_available()
    assert conftest.PATHS == tuple(
        name for name, on in (("torch", True), ("interpret", rl_triton.INTERPRET), ("cuda", cuda)) if on
    )
    assert KERNEL_PATHS == [p for p in conftest.PATHS if p != "torch"]
    assert CPU_PATHS == [p for p in conftest.PATHS if p != "cuda"]


@pytest.mark.cuda
def test_cuda_marker_is_deselected_without_cuda():
    """Collected only where there is a GPU (tests/conftest.py deselects ``cuda`` tests elsewhere)."""
    assert torch.cuda.is_available()


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_auto_backend_on_cpu(fn):
    with rl_triton.use_backend("auto"):
        check(fn, **valid_kwargs(fn, (3, 20)), atol=2e-5, rtol=1e-4)


def test_unknown_backend():
    with pytest.raises(ValueError), rl_triton.use_backend("cuda"):
        pass
