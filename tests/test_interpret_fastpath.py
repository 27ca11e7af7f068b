"""The interpreter's NumPy folds for our scan combines (kernels/_interpret.py), the contained ones and the plain
ones, against a float64 loop over the steps, forward and reverse, on random data; the fold of the pairwise sum's
reduction and the edges it picks likewise."""

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import rl_triton as R
from rl_triton.kernels import core

pytestmark = pytest.mark.skipif(not R.INTERPRET, reason="interpreter only")


@triton.jit
def _scan2(p_a, p_b, p_out, REVERSE: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PLAIN: tl.constexpr):
    off = tl.arange(0, BN)[:, None] * BT + tl.arange(0, BT)[None, :]
    if PLAIN:
        a, b = tl.associative_scan((tl.load(p_a + off), tl.load(p_b + off)), 1, core.plain_combine, reverse=REVERSE)
    else:
        a, b = tl.associative_scan((tl.load(p_a + off), tl.load(p_b + off)), 1, core.linear_combine, reverse=REVERSE)
    tl.store(p_out + off, a)
    tl.store(p_out + BN * BT + off, b)


@triton.jit
def _scan4(p_a, p_b, p_out, REVERSE: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, PLAIN: tl.constexpr):
    off = tl.arange(0, BN)[:, None] * BT + tl.arange(0, BT)[None, :]
    x, y = tl.load(p_a + off), tl.load(p_b + off)
    ones, zeros = tl.full(x.shape, 1.0, x.dtype), tl.zeros(y.shape, y.dtype)
    if PLAIN:
        outs = tl.associative_scan((x, y, ones, zeros), 1, core.plain_combine_next, reverse=REVERSE)
    else:
        outs = tl.associative_scan((x, y, ones, zeros), 1, core.linear_combine_next, reverse=REVERSE)
    for i in tl.static_range(4):
        tl.store(p_out + i * BN * BT + off, outs[i])


def _loop(a, b, reverse):
    """(inclusive, exclusive) maps of the recurrence x -> a x + b, in processing order, float64."""
    n, t = a.shape
    out = np.zeros((4, n, t))
    acc = (np.ones(n), np.zeros(n))
    for p in range(t):
        i = t - 1 - p if reverse else p
        out[2, :, i], out[3, :, i] = acc
        acc = (acc[0] * a[:, i], a[:, i] * acc[1] + b[:, i])
        out[0, :, i], out[1, :, i] = acc
    return out


@pytest.mark.parametrize("plain", [False, True], ids=["contained", "plain"])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("kernel, n_out", [(_scan2, 2), (_scan4, 4)], ids=["linear_combine", "linear_combine_next"])
def test_fast_fold_matches_loop(kernel, n_out, reverse, plain):
    g = torch.Generator().manual_seed(3)
    a = torch.rand(4, 16, generator=g, dtype=torch.float64)
    b = torch.randn(4, 16, generator=g, dtype=torch.float64)
    out = torch.empty(n_out, 4, 16, dtype=torch.float64)
    kernel[(1,)](a, b, out, REVERSE=reverse, BN=4, BT=16, PLAIN=plain)
    np.testing.assert_allclose(out.numpy(), _loop(a.numpy(), b.numpy(), reverse)[:n_out], rtol=1e-12, atol=1e-12)


@triton.jit
def _sum_pairs(p_x, p_y, p_out, AXIS: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr):
    off = tl.arange(0, BN)[:, None] * BT + tl.arange(0, BT)[None, :]
    s, t = tl.reduce((tl.load(p_x + off), tl.load(p_y + off)), AXIS, core._add_pairs)
    o = tl.arange(0, BT if AXIS == 0 else BN)
    tl.store(p_out + o, s)
    tl.store(p_out + o.shape[0] + o, t)


@pytest.mark.parametrize("axis", [0, 1])
def test_fast_reduce_matches_loop(axis):
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(2, 4, 16, generator=g, dtype=torch.float64)
    out = torch.empty(2, x.shape[1 - axis], dtype=torch.float64)
    _sum_pairs[(1,)](x, y, out, AXIS=axis, BN=4, BT=16)
    want = np.zeros((2, x.shape[1 - axis]))
    for i in range(x.shape[axis]):  # a left fold, as the reduction's combine is applied
        want[0] += x.numpy().take(i, axis)
        want[1] += y.numpy().take(i, axis)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-12, atol=1e-12)


@triton.jit
def _edges(p_x, p_y, p_out, AXIS: tl.constexpr, FIRST: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr):
    off = tl.arange(0, BN)[:, None] * BT + tl.arange(0, BT)[None, :]
    x, y = tl.load(p_x + off), tl.load(p_y + off)
    e, f = core._edges(x, y, AXIS, FIRST, False)
    o = tl.arange(0, BT if AXIS == 0 else BN)
    tl.store(p_out + o, e)
    tl.store(p_out + o.shape[0] + o, f)
    tl.store(p_out + 2 * o.shape[0] + o, core._edge(x, AXIS, FIRST, False))
    tl.store(p_out + 3 * o.shape[0] + o, core._edge(y, AXIS, FIRST, False))


@pytest.mark.parametrize("first", [False, True], ids=["last", "first"])
@pytest.mark.parametrize("axis", [0, 1])
def test_edges_pick_the_edge_slots(axis, first):
    """core._edges (one reduction for two tiles) gives the values at the edge slots, as core._edge does for each."""
    g = torch.Generator().manual_seed(7)
    x, y = torch.randn(2, 4, 16, generator=g, dtype=torch.float32)
    out = torch.empty(4, x.shape[1 - axis], dtype=torch.float32)
    _edges[(1,)](x, y, out, AXIS=axis, FIRST=first, BN=4, BT=16)
    i = 0 if first else x.shape[axis] - 1
    want = torch.stack([x.select(axis, i), y.select(axis, i)])
    torch.testing.assert_close(out[:2], want, rtol=0, atol=0)
    torch.testing.assert_close(out[2:], want, rtol=0, atol=0)


@triton.jit
def _inner(x):
    return tl.abs(x) + 1.0


@triton.jit
def _outer(p_in, p_out, BN: tl.constexpr):
    off = tl.program_id(0) * BN + tl.arange(0, BN)
    tl.store(p_out + off, _inner(_inner(tl.load(p_in + off))))


def test_language_patched_once_per_launch(monkeypatch):
    """tests/_interpreter.py (installed by tests/conftest.py): a launch patches triton.language once, its
    device-function calls do not patch it again, the results are the interpreter's, and Triton's builtins are
    back after the launch."""
    from triton.runtime import interpreter as ti

    if not hasattr(ti, "_patch_lang_core"):
        pytest.skip("this Triton's interpreter has no _patch_lang_core: tests/_interpreter.py installs nothing")
    assert getattr(ti._patch_lang, "_rl_triton_tests", False), "tests/_interpreter.py is not installed"
    calls = []
    original = ti._patch_lang_core
    monkeypatch.setattr(ti, "_patch_lang_core", lambda *a: calls.append(1) or original(*a))
    x = torch.randn(2, 8, dtype=torch.float64)
    out = torch.empty_like(x)
    _outer[(2,)](x, out, BN=8)  # 2 programs, 2 device-function calls each: 4 more patchings without the hook
    assert len(calls) == 1
    torch.testing.assert_close(out, (x.abs() + 1.0).abs() + 1.0, rtol=0, atol=0)
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.abs)
