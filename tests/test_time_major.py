"""Time-major calls: every per-step tensor is the (N, T) view ``x.T`` of a contiguous (T, N) tensor (a
``[num_steps, num_envs]`` rollout buffer). The kernels read such rows in place (kernels/core.py,
time_stride; launch.time_major_form) instead of copying each input, and the outputs come in the same
layout. Checked against the float64 reference on every path, including the layouts' edge cases:
env counts below, at and past one env block, not multiples of the vector width, rows of one
env-major group, of several chunks and split into time blocks."""

import pytest
import torch

import rl_triton as R
from rl_triton import _validation
from rl_triton.kernels import launch
from tests._helpers import F32_TOL, FUNCTIONS, check, equal_results, non_contiguous, valid_kwargs


def _tm(x):
    """The same values in the time-major layout (per-step tensors only)."""
    if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] > 1 and x.shape[1] > 1:
        view = non_contiguous(x, "transpose")
        assert _validation._is_time_major(view)
        return view
    return x


_SHAPES = [
    pytest.param((3, 5), id="N3-T5"),  # fewer envs than one block; env-major groups
    pytest.param((40, 8), id="N40-T8"),  # envs a multiple of 8, one group of 8 steps
    pytest.param((33, 7), id="N33-T7"),  # envs not a multiple of 2
    pytest.param((64, 100), id="N64-T100"),  # several 64-step chunks
    pytest.param((70, 300), id="N70-T300"),  # envs in 2s, several chunks
    pytest.param((2, 700), id="N2-T700"),  # few envs: rows split into time blocks (two passes)
]

_TM_FUNCTIONS = [f for f in FUNCTIONS if f != "compute_retrace"]


@pytest.mark.parametrize("name", _TM_FUNCTIONS)
@pytest.mark.parametrize("shape", _SHAPES)
def test_matches_reference(path, name, shape):
    kwargs = valid_kwargs(name, shape, device=path.device)
    tm = {k: _tm(v) for k, v in kwargs.items()}
    out = check(name, **tm, **F32_TOL)[0]
    for o in out if isinstance(out, tuple) else (out,):
        if path.is_kernel:  # outputs in the inputs' layout: o.T is a contiguous (T, N) tensor
            assert o.T.is_contiguous() and not o.is_contiguous()
        else:  # the PyTorch path computes on contiguous copies
            assert o.is_contiguous()
    equal_results(out, getattr(R, name)(**kwargs), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("name", ["compute_gae", "compute_vtrace"])
def test_last_value(path, name):
    kwargs = valid_kwargs(name, (48, 20), device=path.device, last_value=True)
    check(name, **{k: _tm(v) for k, v in kwargs.items()}, **F32_TOL)


@pytest.mark.parametrize("dtype, atol, rtol", [(torch.float64, 1e-10, 1e-10), (torch.bfloat16, 2e-2, 2e-2)])
def test_dtypes(path, dtype, atol, rtol):
    kwargs = valid_kwargs("compute_gae", (36, 70), device=path.device, dtype=dtype)
    check("compute_gae", **{k: _tm(v) for k, v in kwargs.items()}, atol=atol, rtol=rtol)


def test_prefix_sum_starts_at(path):
    kwargs = valid_kwargs("compute_episodic_prefix_sum", (34, 50), device=path.device)
    kwargs["boundary"] = "starts_at"
    check("compute_episodic_prefix_sum", **{k: _tm(v) for k, v in kwargs.items()}, **F32_TOL)


def test_decision():
    """Time-major only when every per-step tensor is; mixed layouts and Retrace copy as before."""
    _validation.clear_cache()
    kw = valid_kwargs("compute_gae", (6, 9))
    tm = {k: _tm(v) for k, v in kw.items()}
    p = _validation.prepare(
        "t", steps={"rewards": tm["rewards"], "values": tm["values"]}, flags={"terminateds": tm["terminateds"]}
    )
    assert p.time_major and p.tensors["rewards"] is tm["rewards"]
    mixed = _validation.prepare(
        "t", steps={"rewards": tm["rewards"], "values": kw["values"]}, flags={"terminateds": tm["terminateds"]}
    )
    assert not mixed.time_major and mixed.tensors["rewards"].is_contiguous()
    assert len(_validation._CACHE) == 1  # the mixed call copied: not cached
    hit = _validation.prepare(
        "t", steps={"rewards": tm["rewards"], "values": tm["values"]}, flags={"terminateds": tm["terminateds"]}
    )
    assert hit.time_major and hit.plans is p.plans
    contiguous = p.contiguous()
    assert not contiguous.time_major and all(t.is_contiguous() for t in contiguous.tensors.values())
    assert contiguous.like is contiguous.tensors["rewards"] and contiguous.plans is None
    _validation.TIME_MAJOR = False
    try:
        _validation.clear_cache()
        off = _validation.prepare("t", steps={"rewards": tm["rewards"]}, flags={"terminateds": tm["terminateds"]})
        assert not off.time_major
    finally:
        _validation.TIME_MAJOR = True
        _validation.clear_cache()


def test_retrace_copies(path):
    kwargs = valid_kwargs("compute_retrace", (5, 9), device=path.device)
    tm = {k: _tm(v) for k, v in kwargs.items()}
    out = check("compute_retrace", **tm, **F32_TOL)[0]
    assert all(o.is_contiguous() for o in out)


def test_gradients(path):
    """Autograd through a time-major call: the gradients of the contiguous call."""
    kwargs = valid_kwargs("compute_gae", (40, 12), device=path.device, dtype=torch.float64)
    grads = []
    for layout in (lambda x: x, _tm):
        r = layout(kwargs["rewards"].clone()).requires_grad_(True)
        v = layout(kwargs["values"].clone()).requires_grad_(True)
        rest = {k: layout(x) for k, x in kwargs.items() if k not in ("rewards", "values")}
        out = R.compute_gae(r, v, **rest)
        out.square().sum().backward()
        grads.append((r.grad, v.grad))
    equal_results(grads[0], grads[1], atol=1e-12, rtol=1e-12)


def test_form_policy():
    """The launcher's time-major forms: blocks of at least _TM_MIN_ENVS envs, env-major groups for
    rows of <= 8 steps, the two-pass split for rows too long for their env blocks."""
    short = launch.time_major_form("gae", 4096, 24)
    assert short.layout.tiles.bn >= launch._TM_MIN_ENVS and short.layout.nk == 1 and short.group == 4
    assert launch.time_major_form("gae", 4096, 8).group == -4
    assert launch.time_major_form("forward", 4096, 512).group == 0
    long = launch.time_major_form("gae", 64, 4096)
    assert long.layout.nk > 1 and not long.layout.lookback
    assert launch.time_major_in_place(64, 2048) and not launch.time_major_in_place(16, 262144)


def test_long_rows_copy(path):
    """Rows that would split into more than _TM_MAX_SPLIT time blocks are copied contiguous (the
    look-back serves them) instead of read in place."""
    kwargs = valid_kwargs("compute_discounted_returns", (2, 8300), device=path.device)
    assert not launch.time_major_in_place(2, 8300)
    out = check("compute_discounted_returns", **{k: _tm(v) for k, v in kwargs.items()}, **F32_TOL)[0]
    assert out.is_contiguous()
