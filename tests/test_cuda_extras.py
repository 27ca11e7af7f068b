"""GPU-only checks of the performance issue's correctness conditions: CUDA-graph capture, no
recompilation within a size class, the launch fast path (cached plans and compiled kernels) with new
data, new hyper-parameters, misaligned inputs and launch hooks, and inputs above 2^31 elements (int64
indexing; opt-in, slow). Marked ``compiled``: not collected without a CUDA GPU or under the interpreter."""

import os

import pytest
import torch

import rl_triton as R
from rl_triton.kernels import launch
from rl_triton.ops.gae import gae_kernel
from tests import reference
from tests._helpers import equal_results
from tests.test_multiblock import CALLS, _inputs

cuda = pytest.mark.compiled  # needs a CUDA GPU, compiled kernels (tests/conftest.py deselects it otherwise)


@cuda
@pytest.mark.parametrize("fn", list(CALLS))
@pytest.mark.parametrize("shape", [(64, 512), (2, 70000)], ids=["N64-T512", "N2-T70000-multiblock"])
def test_cuda_graph_capture(fn, shape):
    x = {k: v.float() if v.is_floating_point() else v for k, v in _inputs(*shape, "cuda").items()}
    eager = CALLS[fn](x)  # also compiles the kernels outside the capture
    graph, captured = captured_call(fn, x)
    graph.replay()
    torch.cuda.synchronize()
    equal_results(eager, captured)  # bit for bit


def captured_call(fn, x):
    """CALLS[fn] on ``x`` captured in a CUDA graph (after a warm-up on a side stream): (graph, outputs)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        CALLS[fn](x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = CALLS[fn](x)
    return graph, out if isinstance(out, tuple) else (out,)


def _misaligned(x: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``x`` whose data starts one element past a 16-byte boundary."""
    buf = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    out = buf[1:].view(x.shape)
    out.copy_(x)
    assert out.is_contiguous() and out.data_ptr() % 16 != 0
    return out


@cuda
@pytest.mark.parametrize("fn", list(CALLS))
@pytest.mark.parametrize(
    "shape", [(64, 512), (16, 1500), (8, 3000), (2, 70000)], ids=["N64-T512", "N16-T1500", "N8-T3000", "N2-T70000"]
)
def test_launch_fast_path(fn, shape):
    """Repeated calls of one signature reuse its plan and compiled kernel (rows of one chunk of 512,
    2048 and 4096 steps, loop-free, and multi-block rows): each call must still see its own data (fresh
    inputs), match the PyTorch path, and a misaligned copy of the inputs (its own signature, compiled
    without the alignment assumption) and calls under an active launch hook (Triton's normal path)
    must agree."""
    torch.manual_seed(0)

    def inputs(seed):
        x = _inputs(*shape, "cuda")
        g = torch.Generator(device="cuda").manual_seed(seed)
        x["r"] = torch.randn(x["r"].shape, generator=g, device="cuda", dtype=torch.float64)
        return {k: v.float() if v.is_floating_point() else v for k, v in x.items()}

    def reference(x):
        with R.use_backend("torch"):
            return CALLS[fn]({k: v.double().cpu() if v.is_floating_point() else v.cpu() for k, v in x.items()})

    def check(out, x):
        expected = reference(x)
        for a, b in zip(*(o if isinstance(o, tuple) else (o,) for o in (out, expected)), strict=True):
            torch.testing.assert_close(a.double().cpu(), b, atol=2e-4, rtol=2e-4)

    first, second = inputs(1), inputs(2)
    check(CALLS[fn](first), first)
    check(CALLS[fn](second), second)  # the cached plan, new data
    again = CALLS[fn](first)
    equal_results(again, CALLS[fn](first))  # bitwise repeatable through the fast path
    misaligned = {k: _misaligned(v) if v.dim() == 2 and v.dtype == torch.float32 else v for k, v in first.items()}
    equal_results(CALLS[fn](misaligned), again, atol=1e-6, rtol=1e-6)
    seen = []
    knobs = launch._KNOBS
    if knobs is not None and hasattr(knobs.runtime.launch_enter_hook, "add"):
        hook = lambda metadata: seen.append(metadata)  # noqa: E731
        knobs.runtime.launch_enter_hook.add(hook)
        try:
            equal_results(CALLS[fn](first), again)
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
        assert seen, "an active launch hook must see the launch (Triton's normal path)"


@cuda
def test_fast_path_follows_the_hyper_parameters():
    """gamma and lambda are plain float arguments of the cached launch, never baked into a plan."""
    x = {k: v.float() if v.is_floating_point() else v for k, v in _inputs(64, 512, "cuda").items()}
    for gamma, lam in [(0.99, 0.95), (0.5, 0.1), (0.0, 1.0), (1.0, 0.0)]:
        out = R.compute_gae(x["r"], x["v"], x["term"], gamma=gamma, lambda_=lam)
        with R.use_backend("torch"):
            expected = R.compute_gae(x["r"].cpu(), x["v"].cpu(), x["term"].cpu(), gamma=gamma, lambda_=lam)
        torch.testing.assert_close(out.cpu(), expected, atol=1e-5, rtol=1e-5)


def _cache_size(kernel) -> int:
    return sum(len(caches[0]) for caches in kernel.device_caches.values())


@cuda
def test_no_recompilation_within_a_size_class():
    def call(n, t, gamma, lam):
        r = torch.randn(n, t, device="cuda")
        return R.compute_gae(r, r, torch.zeros(n, t, dtype=torch.bool, device="cuda"), gamma=gamma, lambda_=lam)

    # A size class: the power-of-two bucket of T (capped at the chunk size), whether T % 16 == 0
    # (Triton's default integer specialisation, kept for T so that rows are 16-byte aligned) and, when
    # not, whether T is a multiple of 8 or 4 (launch._row_divisor); rows of exactly 4 or 8 steps, and rows
    # of exactly one chunk of 1024 or more steps in programs of one env, are classes of their own (EXACT_T).
    for first, rest in [
        ((64, 601), [(63, 701), (17, 1001), (100, 1023)]),
        ((64, 600), [(63, 696), (17, 1000), (100, 520)]),
        ((64, 604), [(63, 700), (17, 1004), (100, 524)]),
        ((64, 608), [(63, 704), (17, 1008), (100, 1008)]),
        ((64, 1024), [(63, 1024), (17, 1024), (100, 1024)]),
    ]:
        call(*first, 0.99, 0.95)
        before = _cache_size(gae_kernel)
        for (n, t), (gamma, lam) in zip(rest, [(0.9, 0.8), (0.5, 1.0), (0.999, 0.0)], strict=True):
            call(n, t, gamma, lam)
        assert _cache_size(gae_kernel) == before, (first, rest)


big = pytest.mark.skipif(
    os.environ.get("RL_TRITON_SLOW") != "1", reason="slow: set RL_TRITON_SLOW=1 (needs ~30 GB of GPU memory)"
)


@pytest.fixture
def free_gpu_memory():
    yield
    torch.cuda.empty_cache()


@cuda
@pytest.mark.slow
@big
def test_more_than_2_31_elements(free_gpu_memory):
    """Many envs, N * T > 2^31: random first and last rows (the last lies past 2^31) against the float64
    reference of those rows; the rows between are zeros."""
    n, t = 2**15 + 3, 2**16 + 1
    r = torch.zeros(n, t, device="cuda")
    v = torch.zeros(n, t, device="cuda")
    term = torch.zeros(n, t, dtype=torch.bool, device="cuda")
    g = torch.Generator().manual_seed(0)
    for row in (0, n - 1):
        r[row], v[row] = torch.randn(2, t, generator=g).cuda()
        term[row] = (torch.rand(t, generator=g) < 0.001).cuda()
    adv = R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95)
    for row in (0, n - 1):
        want = reference.compute_gae(r[row].double().cpu(), v[row].double().cpu(), term[row].cpu(), gamma=0.99,
                                     lambda_=0.95)  # fmt: skip
        torch.testing.assert_close(adv[row].double().cpu(), want, atol=1e-4, rtol=1e-4)
    assert not adv[1:-1].any()


@cuda
@pytest.mark.slow
@big
def test_one_row_longer_than_2_31_steps(free_gpu_memory):
    """One row of 2^31 + 2^16 steps (the look-back across ~10^6 time blocks, int64 offsets): discounted
    returns of random rewards in the first and last 2^16 steps (episodes of their own) against the
    float64 reference, and of rewards 1 in between, whose returns are a geometric sum."""
    h, gamma = 2**16, 0.999
    t = 2**31 + h
    r = torch.ones(1, t, device="cuda")
    term = torch.zeros(1, t, dtype=torch.bool, device="cuda")
    term[0, h - 1] = term[0, t - h - 1] = True
    g = torch.Generator().manual_seed(1)
    r[0, :h], r[0, t - h :] = torch.randn(2, h, generator=g).cuda()
    out = R.compute_discounted_returns(r, term, gamma=gamma)
    for seg in (slice(0, h), slice(t - h, t)):
        want = reference.compute_discounted_returns(r[0, seg].double().cpu(), term[0, seg].cpu(), gamma=gamma)
        # float32 rounding over ~1000-step horizons: returns up to ~60, errors up to ~5e-4 (a sequential
        # float32 loop on the CPU is as far off); an indexing error would be off by the values themselves
        torch.testing.assert_close(out[0, seg].double().cpu(), want, atol=2e-3, rtol=1e-4)
    steps = torch.cat([torch.randint(h, t - h, (4096,), generator=g), torch.arange(t - 2 * h, t - h)])
    k = (t - h - steps).double()  # steps to the end of the middle episode, the terminal step included
    want = (1 - gamma**k) / (1 - gamma)
    torch.testing.assert_close(out[0, steps.cuda()].double().cpu(), want, atol=0, rtol=1e-4)


@cuda
@pytest.mark.slow
@big
def test_forward_row_longer_than_2_31_steps(free_gpu_memory):
    """Episodic prefix sums of ones on one row of 2^31 + 2^16 steps, an episode ending every 2^20
    steps: every output is exact in float32, so the whole row is compared."""
    period = 2**20
    t = 2**31 + 2**16
    x = torch.ones(1, t, device="cuda")
    dones = torch.zeros(1, t, dtype=torch.bool, device="cuda")
    dones[0, period - 1 :: period] = True
    out = R.compute_episodic_prefix_sum(x, dones)[0]
    del x, dones
    full = (t // period) * period
    assert (out[:full].view(-1, period) == torch.arange(1, period + 1, device="cuda").float()).all()
    assert torch.equal(out[full:], torch.arange(1, t - full + 1, device="cuda").float())
