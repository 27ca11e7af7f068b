"""Time-major calls: every per-step tensor is the (N, T) view ``x.T`` of a contiguous (T, N) tensor (a
``[num_steps, num_envs]`` rollout buffer), and every per-action one Retrace takes the (N, T, A) view of a
contiguous (T, N, A) tensor. The kernels read such rows in place (kernels/core.py,
time_stride; launch.time_major_form) instead of copying each input, and the outputs come in the same
layout. Checked against the float64 reference on every path, including the layouts' edge cases:
env counts below, at and past one env block, not multiples of the vector width, rows of one
env-major group, of several chunks and split into time blocks (the look-back over blocks of envs, and the
two-pass split)."""

import pytest
import torch

import rl_triton as R
from rl_triton import _validation
from rl_triton.kernels import launch
from tests._helpers import F32_TOL, FUNCTIONS, check, equal_results, non_contiguous, valid_kwargs


def _tm(x):
    """The same values in the time-major layout: (N, T) views of (T, N) tensors, (N, T, A) views of (T, N, A)
    ones; per-env tensors unchanged."""
    if isinstance(x, torch.Tensor) and x.dim() in (2, 3) and x.shape[0] > 1 and x.shape[1] > 1:
        if x.dim() == 2:
            view = non_contiguous(x, "transpose")
        else:
            view = x.transpose(0, 1).contiguous().transpose(0, 1)
            assert torch.equal(view, x)
        assert _validation._is_time_major(view)
        return view
    return x


_FORWARD = ("compute_eligibility_traces", "compute_episodic_prefix_sum")  # forward scans: plain tiles only

_SHAPES = [
    pytest.param((3, 5), id="N3-T5"),  # fewer envs than one block; env-major groups
    pytest.param((40, 8), id="N40-T8"),  # envs a multiple of 8, one group of 8 steps
    pytest.param((33, 7), id="N33-T7"),  # envs not a multiple of 2
    pytest.param((64, 100), id="N64-T100"),  # several 64-step chunks
    pytest.param((70, 300), id="N70-T300"),  # envs in 2s, several chunks
    pytest.param((2, 700), id="N2-T700"),  # few envs: rows split into time blocks (two passes)
]


@pytest.mark.parametrize("name", FUNCTIONS)
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


@pytest.mark.parametrize("lookback", [True, False], ids=["lookback", "two-pass"])
@pytest.mark.parametrize("name", FUNCTIONS)
def test_split_rows(path, name, lookback, monkeypatch):
    """Rows split into time blocks: the look-back over blocks of envs (core.lookback_envs; 33 blocks in windows
    of 16, so both levels of windows) and the two-pass split. A second call gives the same bits (the look-back's
    epochs advanced in between)."""
    monkeypatch.setattr(launch, "_TM_LOOKBACK", lookback)
    monkeypatch.setattr(launch, "_TM_LOOKBACK_MIN_SPLIT", {})  # the discounted returns' too
    kwargs = {k: _tm(v) for k, v in valid_kwargs(name, (3, 2100), device=path.device).items()}
    form = launch.time_major_form("gae", 3, 2100, dtype=torch.float32)
    assert form.layout.lookback == lookback and (form.layout.window < form.layout.nk or not lookback)
    out = check(name, **kwargs, **F32_TOL)[0]
    equal_results(out, getattr(R, name)(**kwargs), atol=0, rtol=0)


@pytest.mark.parametrize("group", [-1, None], ids=["descending", "group-major"])
@pytest.mark.parametrize("name", [n for n in FUNCTIONS if n not in _FORWARD])
def test_tile_forms(path, name, group, monkeypatch):
    """Both tile forms of the reverse recurrences on time-major rows longer than one env-major group: descending
    plain tiles (kernels/core.py, GROUPED = -1; Retrace's policy) and group-major ones (the others' policy;
    Retrace's before), single pass and split into time blocks, against the reference and the contiguous call."""
    monkeypatch.setattr(launch, "_TM_RETRACE_GROUP", group)
    if group is not None:
        monkeypatch.setattr(launch, "_TM_GROUP", group)
    for shape in [(70, 300), (3, 2100)]:
        kwargs = valid_kwargs(name, shape, device=path.device)
        want = getattr(R, name)(**kwargs)
        out = check(name, **{k: _tm(v) for k, v in kwargs.items()}, **F32_TOL)[0]
        equal_results(out, want, atol=1e-6, rtol=1e-6)


def test_lookback_zeroed_flags(path, monkeypatch):
    """The look-back over blocks of envs with flags zeroed per call (PHASE 4: launches of more blocks than
    _EPOCH_MAX_BLOCKS) instead of epochs."""
    monkeypatch.setattr(launch, "_EPOCH_MAX_BLOCKS", 0)
    kwargs = {k: _tm(v) for k, v in valid_kwargs("compute_gae", (40, 700), device=path.device).items()}
    out = check("compute_gae", **kwargs, **F32_TOL)[0]
    equal_results(out, R.compute_gae(**kwargs), atol=0, rtol=0)


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
    """Time-major only when every per-step tensor is; mixed layouts copy as before."""
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


@pytest.mark.parametrize("num_actions", [3, 18])  # a padded action tile; one tile per binary digit (16 + 2)
@pytest.mark.parametrize("shape", [(40, 8), (33, 70), (2, 300)], ids=["N40-T8", "N33-T70", "N2-T300"])
def test_retrace_actions(path, num_actions, shape):
    """Retrace reads [T, N, A] tensors in place, with and without next-step probabilities."""
    kwargs = valid_kwargs("compute_retrace", shape, num_actions=num_actions, device=path.device)
    for next_probs in (True, False):
        if not next_probs:
            kwargs.pop("next_action_probs_target")
        out = check("compute_retrace", **{k: _tm(v) for k, v in kwargs.items()}, **F32_TOL)[0]
        assert all(o.T.is_contiguous() for o in out) if path.is_kernel else all(o.is_contiguous() for o in out)


def test_retrace_decision():
    """Retrace runs time-major only when its per-action tensors and actions are time-major views too."""
    _validation.clear_cache()
    kw = valid_kwargs("compute_retrace", (6, 9))
    tm = {k: _tm(v) for k, v in kw.items()}

    def prepare(**over):
        t = {**tm, **over}
        return _validation.prepare(
            "t", steps={"action_probs_behavior": t["action_probs_behavior"], "rewards": t["rewards"]},
            flags={"terminateds": t["terminateds"]},
            per_action={"action_probs_target": t["action_probs_target"], "next_q_values_all": t["next_q_values_all"]},
            actions=("actions", t["actions"]),
        )  # fmt: skip

    p = prepare()
    assert p.time_major and p.tensors["next_q_values_all"] is tm["next_q_values_all"]
    assert p.tensors["actions"] is tm["actions"]
    for name in ("next_q_values_all", "actions"):
        mixed = prepare(**{name: kw[name]})
        assert not mixed.time_major and all(t.is_contiguous() for t in mixed.tensors.values() if t is not None)
    padded = torch.zeros(9, 6, 5)[:, :, :4]  # (T, N, A) with a padded action axis: not a time-major view
    assert not _validation._is_time_major(padded.transpose(0, 1))
    _validation.clear_cache()


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
    assert long.layout.nk > 1 and not long.layout.lookback  # no dtype: the split time_major_in_place counts
    assert launch.time_major_form("gae", 64, 4096, dtype=torch.bfloat16).layout.lookback
    assert not launch.time_major_form("gae", 64, 4096, dtype=torch.float64).layout.lookback
    assert launch.time_major_in_place(64, 2048) and not launch.time_major_in_place(16, 262144)
    few = launch.retrace_time_major_form(4096, 24, 4)
    assert few.group == -1 and not few.pieces and few.layout.tiles.bn >= launch._TM_MIN_ENVS  # descending tiles
    assert launch.retrace_time_major_form(4096, 8, 4).group == -4
    many = launch.retrace_time_major_form(4096, 24, 18)
    assert many.group == -1 and many.pieces
    assert many.layout.tiles.bn * many.layout.tiles.bt < few.layout.tiles.bn * few.layout.tiles.bt
    assert launch.time_major_in_place(64, 2048, 4) and not launch.time_major_in_place(16, 262144, 4)
    # the discounted returns: the look-back only from splits of _TM_LOOKBACK_MIN_SPLIT blocks
    assert not launch.time_major_form("returns", 4096, 2048, dtype=torch.float32).layout.lookback
    assert launch.time_major_form("returns", 256, 8192, dtype=torch.float32).layout.lookback
    # V-trace too, with 2-byte inputs
    assert launch.time_major_form("vtrace", 4096, 2048, dtype=torch.float32).layout.lookback
    assert not launch.time_major_form("vtrace", 4096, 2048, dtype=torch.bfloat16).layout.lookback
    assert launch.time_major_form("vtrace", 256, 8192, dtype=torch.bfloat16).layout.lookback
    # longer rows in place where the look-back serves them: not float64, >= _TM_MIN_ENVS envs, <= 2048 blocks
    assert launch.time_major_in_place(32, 65536, dtype=torch.float32)
    assert launch.time_major_in_place(64, 131072, dtype=torch.bfloat16)
    assert not launch.time_major_in_place(32, 65536, dtype=torch.float64)
    assert not launch.time_major_in_place(16, 65536, dtype=torch.float32)
    assert not launch.time_major_in_place(32, 262144, dtype=torch.float32)


def test_long_rows_copy(path):
    """Rows that would split into more than _TM_MAX_SPLIT time blocks are copied contiguous (the
    look-back serves them) instead of read in place."""
    kwargs = valid_kwargs("compute_discounted_returns", (2, 8300), device=path.device)
    assert not launch.time_major_in_place(2, 8300)
    out = check("compute_discounted_returns", **{k: _tm(v) for k, v in kwargs.items()}, **F32_TOL)[0]
    assert out.is_contiguous()


_STRESS = [
    pytest.param((16, 262144), None, id="16x262144"),  # 4096 blocks of one env block, windows of 64
    pytest.param((64, 262144), 128, id="64x262144-w128"),  # 2 env blocks: 8192 blocks, PHASE 4 (zeroed words)
    pytest.param((40, 65536), 8, id="40x65536-w8"),  # 1024 blocks: the windows grow to 32
    pytest.param((4096, 2048), None, id="4096x2048"),  # 128 env blocks of 32 blocks
]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA is not available")
@pytest.mark.parametrize("name", ["compute_gae", "compute_discounted_returns", "compute_eligibility_traces"])
@pytest.mark.parametrize("shape, window", _STRESS)
def test_lookback_stress_cuda(name, shape, window, monkeypatch):
    """The look-back over blocks of envs on the GPU, where blocks run concurrently (the interpreter runs them one
    after another): rows forced in place whatever their length, against the contiguous call (env-major
    kernels), and five calls bit for bit the same. The first form of this look-back failed here (NOTES.md)."""
    monkeypatch.setattr(launch, "_TM_MAX_SPLIT", 1 << 30)
    monkeypatch.setattr(launch, "_TM_LOOKBACK_MIN_SPLIT", {})  # the discounted returns' rows too
    if window is not None:
        monkeypatch.setattr(launch, "_TM_WINDOW", window)
    kwargs = valid_kwargs(name, shape, device="cuda")
    tm = {k: _tm(v) for k, v in kwargs.items()}
    assert launch.time_major_form("gae", *shape, dtype=torch.float32).layout.lookback
    want = getattr(R, name)(**kwargs)
    outs = [getattr(R, name)(**tm) for _ in range(5)]
    assert outs[0].T.is_contiguous()  # read in place
    torch.testing.assert_close(outs[0], want, atol=2e-5, rtol=2e-5)
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


@pytest.mark.skipif(not torch.cuda.is_available() or R.INTERPRET, reason="needs a CUDA GPU, compiled kernels")
@pytest.mark.parametrize("name", FUNCTIONS)
def test_lookback_cuda_graph(name):
    """A time-major call through the look-back captured in a CUDA graph (its flags leased from the arena) gives
    the eager call's bits on every replay, with the eager calls' epochs advancing in between."""
    kwargs = {k: _tm(v) for k, v in valid_kwargs(name, (64, 3000), device="cuda").items()}
    assert launch.time_major_form("gae", 64, 3000, dtype=torch.float32).layout.lookback
    fn = getattr(R, name)
    eager = fn(**kwargs)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(**kwargs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = fn(**kwargs)
    for _ in range(3):
        graph.replay()
        fn(**kwargs)
        torch.cuda.synchronize()
        equal_results(captured, eager, atol=0, rtol=0)
