"""The look-back's flag buffers (kernels/core.py lookback, launch._lookback_flags): in launches of few
blocks (LOOKBACK_EPOCHS) flags tagged with a per-row epoch that the kernel advances, so one buffer per plan and
stream serves every call without being zeroed again, and flags an earlier call left read as
unpublished; larger launches (LOOKBACK) zero fresh flags. Forced look-back on small rows (10 blocks of
32 steps, windows of 4) on the interpreter and the GPU; CUDA-graph captures (their own slices of a
zeroed arena, or fresh zeros when none is left) on the GPU only."""

import pytest
import torch

import rl_triton as R
from rl_triton.kernels import core, launch
from rl_triton.kernels.plans import Form, Plan, Split
from tests._helpers import equal_results
from tests.test_cuda_extras import captured_call
from tests.test_multiblock import CALLS, FORWARD, _inputs, _matches_torch_path

FUNCTIONS = ["gae", "vtrace", "retrace", "lambda", "traces"]
H = core.EPOCH_LINE  # one row's epoch line, then its flags
cuda = pytest.mark.skipif(not torch.cuda.is_available() or R.INTERPRET, reason="needs a CUDA GPU, compiled kernels")


def _plan(fn, window=4, epochs=True):
    """The look-back on short rows: blocks of one 32-step chunk (10 for rows of 300 steps), windows of 4."""
    form = Form.PLAIN if fn in FORWARD else Form.GROUPS4
    return Plan(1, 32, 4, form, Split.LOOKBACK, window=window, epochs=epochs)


@pytest.fixture
def buffers(monkeypatch):
    """Yields the list of flag buffers the look-back launches get."""
    seen, real = [], launch._lookback_flags

    def record(built, device, size):
        seen.append(real(built, device, size))
        return seen[-1]

    monkeypatch.setattr(launch, "_lookback_flags", record)
    return seen


def _fresh(n, t, device, seed):
    x = _inputs(n, t, device)
    x["r"] = torch.randn(n, t, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(device)
    return x


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_epoch_advances(kernel_path, buffers, fn):
    """Each call publishes a row's flags as its epoch + 1 / + 2 and leaves the row's epoch 2 higher;
    the next call of the signature (new data) reuses the buffer as it is; another layout has its own
    buffer, whose epochs move on their own."""
    path = kernel_path

    def check(buf, epoch):
        buf = buf.cpu()
        assert buf[:H].tolist() == [epoch] + [0] * (H - 1)
        assert buf[H:].tolist() == [epoch - 1 + (k % 4 == 3) for k in range(10)]  # windows' last blocks: 2

    # Retrace with CPU actions is never a cached signature (its range check reads them): fresh flags
    cached = not (fn == "retrace" and path.device.type == "cpu")
    for call in range(3):
        _matches_torch_path(fn, _fresh(1, 300, path.device, call), _plan(fn))
        assert buffers[-1].numel() == core.flag_buffer_size(1, 10, True)
        assert buffers[-1].data_ptr() == buffers[0].data_ptr() or not cached
        if call == 0:  # a cached buffer may have served this plan in an earlier test: its epoch goes on from there
            first = buffers[-1][0].item()
            assert first % 2 == 0 and first >= 2 and (first == 2 or cached)
        check(buffers[-1], first + 2 * call if cached else 2)
    _matches_torch_path(fn, _fresh(1, 1000, path.device, 5), _plan(fn, 8))  # 32 blocks: another buffer
    assert buffers[-1].numel() == core.flag_buffer_size(1, 32, True) and buffers[-1][0].item() % 2 == 0
    _matches_torch_path(fn, _fresh(1, 300, path.device, 6), _plan(fn))
    check(buffers[-1], first + 6 if cached else 2)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_stale_flags_are_unpublished(kernel_path, buffers, fn):
    """Flags at the highest value an earlier call can leave (the row's current epoch) do not count as
    published: every block waits for this call's own aggregates (on the GPU, reading the NaN-poisoned
    aggregate buffers early would show)."""
    device = kernel_path.device
    _matches_torch_path(fn, _fresh(1, 300, device, 0), _plan(fn))
    buf = buffers[-1]
    for seed in (1, 2):
        buf[H:] = buf[0]
        _matches_torch_path(fn, _fresh(1, 300, device, seed), _plan(fn))


@pytest.mark.parametrize("fn", ["gae", "traces"])
def test_epochs_wrap(kernel_path, buffers, fn):
    """The int32 epochs pass 2^31 and wrap; flags count as published by their difference from the
    epoch, so calls around the wrap are still right (flags of the previous calls left in place)."""
    device = kernel_path.device
    _matches_torch_path(fn, _fresh(1, 300, device, 0), _plan(fn))
    buf = buffers[-1]
    buf[0] = 2**31 - 3
    buf[H:] = 2**31 - 3
    for seed in (1, 2, 3):
        _matches_torch_path(fn, _fresh(1, 300, device, seed), _plan(fn))
    assert buffers[-1].data_ptr() == buf.data_ptr() and buf[0].item() == -(2**31) + 3  # 2^31 - 3 + 6, wrapped


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_zeroed_flags_without_epochs(kernel_path, buffers, fn):
    """Plans without epochs (the choice for launches of many blocks) take fresh zeroed flags (LOOKBACK), no kept
    buffer."""
    for seed in (0, 1):
        _matches_torch_path(fn, _fresh(1, 300, kernel_path.device, seed), _plan(fn, epochs=False))
    assert buffers == []


def test_flag_buffers_per_plan():
    """One zeroed buffer per plan and stream, reused; uncached signatures get fresh zeros each call.
    The layouts: the row epochs in whole 128-byte lines, then the flags (kept); the flags alone (zeroed)."""
    cpu = torch.device("cpu")
    assert core.flag_buffer_size(1, 10, True) == H + 10 and core.flag_buffer_size(17, 3, True) == H + 51
    assert core.flag_buffer_size(33, 3, True) == 2 * H + 99 and core.flag_buffer_size(33, 3, False) == 99
    built = launch._Launch(None, cpu, [], launch._Lookback(1, 10, torch.float32, True, 1), cached=True)
    a = launch._lookback_flags(built, cpu, 42)
    assert a.dtype == torch.int32 and a.numel() == 42 and not a.any()
    assert launch._lookback_flags(built, cpu, 42) is a
    once = launch._Launch(None, cpu, [], launch._Lookback(1, 10, torch.float32, True, 1), cached=False)
    assert launch._lookback_flags(once, cpu, 42) is not launch._lookback_flags(once, cpu, 42)


def _refill(x, seed):
    """New rewards and values in place (the graph reads the same tensors)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    for key in ("r", "v", "nv"):
        x[key].copy_(torch.randn(x[key].shape, generator=g, device="cuda"))


@cuda
@pytest.mark.parametrize("fn", ["gae", "vtrace", "discounted", "lambda"])
def test_captured_calls_lease_arena_slices(fn, monkeypatch):
    """A captured look-back call takes its own slice of the arena (two graphs: two slices); replays
    with new data, alternating between the graphs, give what eager calls give, bit for bit. With no
    arena left, a capture zeroes fresh flags in the graph instead, with the same results."""
    n, t = (1, 1 << 20) if fn != "vtrace" else (4, 1 << 20)
    x = {k: v.float() if v.is_floating_point() else v for k, v in _inputs(n, t, "cuda").items()}
    CALLS[fn](x)  # eager: the stream's buffer and the device's arena
    index = torch.cuda.current_device()
    used = launch._ARENAS[index][1]
    g1, out1 = captured_call(fn, x)
    g2, out2 = captured_call(fn, x)
    assert launch._ARENAS[index][1] > used + 16  # two slices
    for seed in range(4):
        _refill(x, seed)
        (g1 if seed % 2 else g2).replay()
        equal_results(out1 if seed % 2 else out2, CALLS[fn](x))  # bit for bit
    arena = launch._ARENAS[index]
    monkeypatch.setitem(launch._ARENAS, index, [arena[0], arena[0].numel()])  # none left
    g3, out3 = captured_call(fn, x)
    for seed in range(2):
        _refill(x, 10 + seed)
        g3.replay()
        equal_results(out3, CALLS[fn](x))
