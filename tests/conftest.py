"""Shared fixtures: backend paths, NaN-poisoned allocations, per-test seeding; GPU-only tests
collected only where there is a GPU.

TRITON_INTERPRET must be set before triton (or rl_triton) is imported, so it is set here first:
CI has no GPU, and the interpreter is what exercises the Triton kernels there. Set
RL_TRITON_TEST_NO_INTERPRET=1 to run the compiled kernels on a GPU machine instead.

Backend paths are generated only where they can run: ``torch`` always, ``interpret`` when Triton's
interpreter is on, ``cuda`` when torch sees a CUDA GPU. Tests marked ``cuda`` (need a CUDA GPU) or
``compiled`` (need compiled kernels on a CUDA GPU, not the interpreter) are deselected where that is
missing, so a CPU run neither runs nor lists them as skips.
"""

import os

if os.environ.get("RL_TRITON_TEST_NO_INTERPRET") != "1":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import gc  # noqa: E402
import math  # noqa: E402
import zlib  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402
import torch  # noqa: E402

import rl_triton  # noqa: E402
from tests import _interpreter  # noqa: E402

CUDA = torch.cuda.is_available()
if rl_triton.INTERPRET:
    # Triton's interpreter re-patches triton.language on every device-function call; once per launch is enough
    # (tests/_interpreter.py: about half of the interpreted kernels' time)
    _interpreter.install()
COMPILED = CUDA and not rl_triton.INTERPRET  # compiled kernels on the GPU

# pytest-xdist runs a worker per core: torch's intra-op threads would only contend with the other workers (the
# interpreted multi-block tests took a third longer with them on 2 cores). OMP_NUM_THREADS, if set, wins.
if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)


@dataclass(frozen=True)
class Path:
    """One way of running the package: which backend, on which device."""

    name: str  # "torch", "interpret" or "cuda"
    backend: str  # what rl_triton.use_backend gets
    device: torch.device

    @property
    def is_kernel(self) -> bool:
        return self.backend == "triton"


_ALL_PATHS = {
    "torch": Path("torch", "torch", torch.device("cpu")),
    "interpret": Path("interpret", "triton", torch.device("cpu")),
    "cuda": Path("cuda", "triton", torch.device("cuda")),
}
# The paths this machine runs (the default parameters of ``path``).
PATHS = tuple(name for name, on in (("torch", True), ("interpret", rl_triton.INTERPRET), ("cuda", CUDA)) if on)


@pytest.fixture(params=PATHS)
def path(request):
    """Runs the test on each backend path; yields a Path with the device to put inputs on. A test may
    narrow it with ``@pytest.mark.parametrize("path", [...], indirect=True)``; a path named there that
    this machine cannot run is skipped."""
    name = request.param
    if name == "interpret" and not rl_triton.INTERPRET:
        pytest.skip("Triton interpreter not enabled (TRITON_INTERPRET=1 was not set before import)")
    if name == "cuda" and not CUDA:
        pytest.skip("CUDA is not available")
    p = _ALL_PATHS[name]
    with rl_triton.use_backend(p.backend):
        yield p


# The kernel paths this machine has (the interpreter on CPU tensors, compiled kernels on CUDA), for tests of
# kernel-path mechanisms such as launch plans, which the PyTorch path does not have.
KERNEL_PATHS = [
    p
    for p in PATHS
    if p != "torch"
    and (rl_triton.INTERPRET if p == "interpret" else torch.cuda.is_available() and not rl_triton.INTERPRET)
]


@pytest.fixture(params=KERNEL_PATHS)
def kernel_path(request):
    """Runs the test on each kernel path of this machine (never collected where there is none)."""
    p = _ALL_PATHS[request.param]
    with rl_triton.use_backend("triton"):
        yield p


@pytest.fixture(scope="module", autouse=True)
def _gc_frozen():
    """Before each test module, moves every object alive (torch, Triton, TorchRL, Dynamo's caches, what earlier
    modules left) out of the garbage collector's reach, and makes full collections ten times rarer: the
    interpreted kernels and Dynamo's tracing allocate objects by the million, and each full collection walked all
    of those again (gc.collect took about 0.2 s a call; test_benchmarks_cpu went from 45 to 12 s). Only the cyclic
    collector is affected: objects freed by reference counting are freed as before."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*gc.get_threshold()[:2], 100)
    yield


def pytest_collection_modifyitems(config, items):
    """Deselects the ``cuda`` and ``compiled`` tests this machine cannot run (they are not skips).
    RL_TRITON_TEST_COLLECT_GPU=1 keeps them (scripts/test.sh uses it to tell a selection of GPU-only
    tests from one that matches nothing)."""
    missing = [name for name, ok in (("cuda", CUDA), ("compiled", COMPILED)) if not ok]
    if not missing or os.environ.get("RL_TRITON_TEST_COLLECT_GPU") == "1":
        return
    keep, drop = [], []
    for item in items:
        (drop if any(item.get_closest_marker(m) for m in missing) else keep).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


@pytest.fixture(autouse=True)
def _poison_empty(monkeypatch):
    """Fills floating tensors from torch.empty / empty_like / Tensor.new_empty with NaN, so any
    output element a kernel forgets to write makes the comparison fail."""
    orig_empty, orig_empty_like, orig_new_empty = torch.empty, torch.empty_like, torch.Tensor.new_empty

    def poison(t):
        if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and t.device.type != "meta":
            with torch.no_grad():
                t.fill_(math.nan)
        return t

    def empty(*args, **kwargs):
        return poison(orig_empty(*args, **kwargs))

    def empty_like(*args, **kwargs):
        return poison(orig_empty_like(*args, **kwargs))

    def new_empty(self, *args, **kwargs):
        return poison(orig_new_empty(self, *args, **kwargs))

    monkeypatch.setattr(torch, "empty", empty)
    monkeypatch.setattr(torch, "empty_like", empty_like)
    monkeypatch.setattr(torch.Tensor, "new_empty", new_empty)
    yield


@pytest.fixture(autouse=True)
def _seed(request):
    """Seeds torch from the test id: reproducible, yet different inputs for every case."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield
