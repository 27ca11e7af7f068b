"""Time-major calls: every per-step tensor is the (N, T) view ``x.T`` of a contiguous (T, N) tensor (a
``[num_steps, num_envs]`` rollout buffer), and every per-action one Retrace takes the (N, T, A) view of a
contiguous (T, N, A) tensor. The kernels read such rows in place (kernels/core.py, time_stride; the
time-major plans of plans.choose) instead of copying each input, and the outputs come in the same
layout. Checked against the float64 reference on every path, including the layouts' edge cases:
env counts below, at and past one env block, not multiples of the vector width, rows of one
env-major group, of several chunks and split into time blocks (the look-back over blocks of envs, and the
two-pass split), under the launcher's plans and under explicit ones (``plan=``)."""

from dataclasses import replace

import pytest
import torch

import rl_triton as R
from rl_triton import _validation
from rl_triton.kernels import plans
from rl_triton.kernels.plans import Form, Split
from rl_triton.ops import kind_of  # the launcher's plan kind of each function
from tests import reference
from tests._helpers import (
    F32_TOL,
    FUNCTIONS,
    assert_close,
    call_unmutated,
    check,
    equal_results,
    non_contiguous,
    valid_kwargs,
)

F32, BF16, F64 = torch.float32, torch.bfloat16, torch.float64


def _chosen(name, n, t, dtype=F32):
    """The launcher's plan of time-major rows of rl_triton.<name> (Retrace: valid_kwargs' 4 actions)."""
    return plans.choose(kind_of(name), n, t, dtype, time_major=True, num_actions=4 if name == "compute_retrace" else 0)


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


def _tm_kwargs(name, shape, **kw):
    return {k: _tm(v) for k, v in valid_kwargs(name, shape, **kw).items()}


def _checked(name, kwargs, plan):
    """check() of rl_triton.<name> under ``plan``, which the reference does not take."""
    out = call_unmutated(getattr(R, name), **kwargs, plan=plan)
    ref = getattr(reference, name)(**kwargs)
    like = next(v for v in kwargs.values() if isinstance(v, torch.Tensor) and v.is_floating_point())
    for o, r in zip(*((x if isinstance(x, tuple) else (x,)) for x in (out, ref)), strict=True):
        assert_close(o, r, **F32_TOL, dtype=like.dtype, device=like.device)
    return out


_FORWARD = ("compute_eligibility_traces", "compute_episodic_prefix_sum")  # forward scans: plain tiles only

_SHAPES = [
    pytest.param((3, 5), id="N3-T5"),  # fewer envs than one block; env-major groups
    pytest.param((40, 8), id="N40-T8"),  # envs a multiple of 8, one group of 8 steps
    pytest.param((33, 7), id="N33-T7"),  # envs not a multiple of 2
    pytest.param((64, 100), id="N64-T100"),  # several 64-step chunks; whole env blocks (no env mask) where taken
    pytest.param((64, 128), id="N64-T128"),  # ... and rows of whole chunks: no mask at all
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


# Rows of 3 envs and 579 steps: 10 chunks of 64 steps (Retrace: 19 of 32) in one env block, split into one time
# block per chunk; the look-back in windows of 8, so both levels of windows.
_SPLIT_T = 579
_SPLITS = {
    "lookback": dict(split=Split.LOOKBACK, window=8, chunks_per_block=1),
    "two-pass": dict(split=Split.TWO_PASS, window=1, chunks_per_block=1),
}


@pytest.mark.parametrize("split", list(_SPLITS))
@pytest.mark.parametrize("name", FUNCTIONS)
def test_split_rows(kernel_path, name, split):
    """Rows split into time blocks: the look-back over blocks of envs (core.lookback_envs) and the two-pass split,
    both whichever the launcher would take (the look-back, but for the discounted returns' short splits). A second
    call gives the same bits (the plan's launch cached with its flags: the look-back's epochs advanced in between)."""
    chosen = _chosen(name, 3, _SPLIT_T)
    assert chosen.split is (Split.TWO_PASS if name == "compute_discounted_returns" else Split.LOOKBACK)
    plan = replace(chosen, **_SPLITS[split])
    assert plan.split is not Split.LOOKBACK or plan.window < plans.cdiv(_SPLIT_T, plan.bt)
    kwargs = _tm_kwargs(name, (3, _SPLIT_T), device=kernel_path.device)
    out = _checked(name, kwargs, plan)
    equal_results(out, getattr(R, name)(**kwargs, plan=plan), atol=0, rtol=0)


# The tile forms of the reverse recurrences: descending plain tiles (kernels/core.py, DESCENDING; Retrace's
# choice) and group-major ones (the others'; Retrace's before).
_FORMS = {"descending": Form.DESCENDING, "group-major": Form.GROUPS4}
# Rows longer than one env-major group: in one pass (the launcher would split these), and split into time blocks.
# The launcher's own form of the split rows is left out: that is test_split_rows' plan.
_FORM_ROWS = {
    "N70-T300-single": ((70, 300), dict(split=Split.SINGLE, window=1)),
    f"N3-T{_SPLIT_T}-split": ((3, _SPLIT_T), {}),
}
_FORM_CASES = [
    pytest.param(name, rows, form, id=f"{name}-{rows}-{form}")
    for name in FUNCTIONS
    if name not in _FORWARD
    for rows in _FORM_ROWS
    for form in _FORMS
    if rows.endswith("single") or (form == "descending") != (name == "compute_retrace")
]


@pytest.mark.parametrize("name, rows, form", _FORM_CASES)
def test_tile_forms(kernel_path, name, rows, form):
    """Both tile forms on time-major rows, against the reference and the contiguous call."""
    shape, split = _FORM_ROWS[rows]
    chosen = _chosen(name, *shape)
    assert chosen.form is (Form.DESCENDING if name == "compute_retrace" else Form.GROUPS4)
    plan = replace(chosen, form=_FORMS[form], **split)
    kwargs = valid_kwargs(name, shape, device=kernel_path.device)
    want = getattr(R, name)(**kwargs)
    out = _checked(name, {k: _tm(v) for k, v in kwargs.items()}, plan)
    equal_results(out, want, atol=1e-6, rtol=1e-6)


def test_lookback_zeroed_flags(kernel_path):
    """The look-back over blocks of envs with flags zeroed per call (LOOKBACK, which the launcher takes for launches
    of more than 4096 blocks) instead of epochs."""
    chosen = _chosen("compute_gae", 40, 700)
    assert chosen.split is Split.LOOKBACK and chosen.epochs
    plan = replace(chosen, epochs=False)
    kwargs = _tm_kwargs("compute_gae", (40, 700), device=kernel_path.device)
    out = _checked("compute_gae", kwargs, plan)
    equal_results(out, R.compute_gae(**kwargs, plan=plan), atol=0, rtol=0)


@pytest.mark.parametrize("name", ["compute_gae", "compute_vtrace"])
def test_last_value(path, name):
    kwargs = valid_kwargs(name, (48, 20), device=path.device, last_value=True)
    check(name, **{k: _tm(v) for k, v in kwargs.items()}, **F32_TOL)


@pytest.mark.parametrize("dtype, atol, rtol", [(F64, 1e-10, 1e-10), (BF16, 2e-2, 2e-2)])
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
    kwargs = valid_kwargs("compute_gae", (40, 12), device=path.device, dtype=F64)
    grads = []
    for layout in (lambda x: x, _tm):
        r = layout(kwargs["rewards"].clone()).requires_grad_(True)
        v = layout(kwargs["values"].clone()).requires_grad_(True)
        rest = {k: layout(x) for k, x in kwargs.items() if k not in ("rewards", "values")}
        out = R.compute_gae(r, v, **rest)
        out.square().sum().backward()
        grads.append((r.grad, v.grad))
    equal_results(grads[0], grads[1], atol=1e-12, rtol=1e-12)


# The launcher's time-major plans: (kind, N, T, dtype, actions, fields). Every plan takes blocks of at least 32
# envs (whole 128-byte lines of float32 per step).
_POLICY = [
    # env blocks that fill the GPU: one pass; group-major tiles, env-major groups for rows of <= 8 steps
    ("gae", 4096, 24, F32, 0, dict(split=Split.SINGLE, form=Form.GROUPS4)),
    ("gae", 4096, 8, F32, 0, dict(form=Form.ENV_GROUPS)),
    ("forward", 4096, 512, F32, 0, dict(form=Form.PLAIN)),
    # rows too long for their env blocks split: the look-back, but for float64 (no tagged words): two passes
    ("gae", 64, 4096, F32, 0, dict(split=Split.LOOKBACK)),
    ("gae", 64, 4096, BF16, 0, dict(split=Split.LOOKBACK)),
    ("gae", 64, 4096, F64, 0, dict(split=Split.TWO_PASS)),
    # Retrace: descending tiles, env-major groups for short rows of few actions, one tile per digit of many
    ("retrace", 4096, 24, F32, 4, dict(form=Form.DESCENDING, pieces=False)),
    ("retrace", 4096, 8, F32, 4, dict(form=Form.ENV_GROUPS)),
    ("retrace", 4096, 24, F32, 18, dict(form=Form.DESCENDING, pieces=True)),
    # the discounted returns: the look-back only from splits of 64 blocks; V-trace too, with 2-byte inputs
    ("returns", 4096, 2048, F32, 0, dict(split=Split.TWO_PASS)),
    ("returns", 256, 8192, F32, 0, dict(split=Split.LOOKBACK)),
    ("vtrace", 4096, 2048, F32, 0, dict(split=Split.LOOKBACK)),
    ("vtrace", 4096, 2048, BF16, 0, dict(split=Split.TWO_PASS)),
    ("vtrace", 256, 8192, BF16, 0, dict(split=Split.LOOKBACK)),
    # whole chunks drop the time mask; env counts in whole blocks, the env mask (env_div = bn) where taken
    ("gae", 16384, 512, F32, 0, dict(whole=True, env_div=32)),
    ("gae", 4096, 2048, F32, 0, dict(split=Split.LOOKBACK, whole=True, env_div=8)),
    ("gae", 4096, 2048, BF16, 0, dict(split=Split.LOOKBACK, whole=True, env_div=32)),
    ("gae", 16384, 512, F64, 0, dict(whole=True, env_div=8)),
    ("gae", 100, 37, F32, 0, dict(whole=False, env_div=4)),
    ("returns", 16384, 512, F32, 0, dict(whole=True, env_div=1)),
    ("returns_nv", 16384, 512, F32, 0, dict(env_div=32, warps=8)),
    ("returns_nv", 16384, 512, BF16, 0, dict(env_div=32, warps=4)),
    ("returns_nv", 4096, 512, F32, 0, dict(split=Split.LOOKBACK, warps=4)),
    ("forward", 16384, 512, F32, 0, dict(whole=True, env_div=1)),
    ("retrace", 16384, 512, F32, 4, dict(whole=True, env_div=32)),
    # splits of at most 128 blocks (2- and 4-byte floats): GAE, V-trace and the discounted returns in 8 warps,
    # V-trace in look-back blocks where it took two passes; more blocks, or other kinds, keep 4 warps
    ("gae", 256, 512, F32, 0, dict(split=Split.LOOKBACK, warps=8)),
    ("gae", 64, 512, BF16, 0, dict(split=Split.LOOKBACK, warps=8)),
    ("vtrace", 64, 512, BF16, 0, dict(split=Split.LOOKBACK, warps=8)),
    ("returns", 64, 512, F32, 0, dict(split=Split.TWO_PASS, warps=8)),
    ("gae", 64, 512, F64, 0, dict(split=Split.TWO_PASS, warps=4)),
    ("vtrace", 512, 512, BF16, 0, dict(split=Split.LOOKBACK, warps=8)),
    ("gae", 1024, 512, F32, 0, dict(split=Split.LOOKBACK, warps=4)),
    ("vtrace", 1024, 512, BF16, 0, dict(split=Split.TWO_PASS, warps=4)),
    ("returns_nv", 64, 512, F32, 0, dict(split=Split.LOOKBACK, warps=4)),
    ("forward", 64, 512, F32, 0, dict(split=Split.LOOKBACK, warps=4)),
]


def _dtype_id(dtype):
    return "any" if dtype is None else str(dtype).removeprefix("torch.")


@pytest.mark.parametrize(
    "kind, n, t, dtype, num_actions, fields",
    [pytest.param(*c, id=f"{c[0]}-N{c[1]}-T{c[2]}-{_dtype_id(c[3])}" + (f"-A{c[4]}" if c[4] else "")) for c in _POLICY],
)
def test_plan_policy(kind, n, t, dtype, num_actions, fields):
    plan = plans.choose(kind, n, t, dtype, time_major=True, num_actions=num_actions)
    assert plan.bn >= 32
    assert {k: getattr(plan, k) for k in fields} == fields


def test_retrace_tiles_keep_their_size():
    """Retrace's [N, T, A] tiles: more actions, fewer steps and envs per tile."""
    few = plans.choose("retrace", 4096, 24, F32, time_major=True, num_actions=4)
    many = plans.choose("retrace", 4096, 24, F32, time_major=True, num_actions=18)
    assert many.bn * many.bt < few.bn * few.bt


# Whether time-major rows are read in place (else validation copies them contiguous): (N, T, actions, dtype).
_IN_PLACE = [
    # splits of at most 128 two-pass blocks are, whatever the dtype
    ((64, 2048, 0, None), True),
    ((64, 2048, 4, None), True),
    ((16, 262144, 0, None), False),
    ((16, 262144, 4, None), False),
    # longer ones where the look-back serves them: not float64, >= 32 envs, <= 2048 blocks; without a dtype the
    # two-pass blocks count
    ((64, 16384, 0, None), False),
    ((64, 16384, 0, F32), True),
    ((32, 65536, 0, F32), True),
    ((64, 131072, 0, BF16), True),
    ((32, 65536, 0, F64), False),
    ((16, 65536, 0, F32), False),
    ((32, 262144, 0, F32), False),
]


@pytest.mark.parametrize(
    "args, in_place",
    [pytest.param(a, p, id=f"N{a[0]}-T{a[1]}-{_dtype_id(a[3])}" + (f"-A{a[2]}" if a[2] else "")) for a, p in _IN_PLACE],
)
def test_reads_in_place(args, in_place):
    n, t, num_actions, dtype = args
    assert plans.reads_time_major_in_place(n, t, num_actions, dtype) == in_place


def test_long_rows_copy(path):
    """Rows that would split into more than 128 two-pass time blocks and that the look-back does not serve in
    place (fewer than 32 envs) are copied contiguous instead of read in place."""
    kwargs = valid_kwargs("compute_discounted_returns", (2, 8300), device=path.device)
    assert not plans.reads_time_major_in_place(2, 8300, dtype=F32)
    out = check("compute_discounted_returns", **{k: _tm(v) for k, v in kwargs.items()}, **F32_TOL)[0]
    assert out.is_contiguous()


@pytest.fixture
def in_place(monkeypatch):
    """Time-major rows read in place whatever their length (validation caches the decision: cleared around)."""
    monkeypatch.setattr(plans, "reads_time_major_in_place", lambda *args, **kwargs: True)
    _validation.clear_cache()
    yield
    _validation.clear_cache()


# (N, T), the look-back's window (at least the square root of the blocks per row), epochs (launches of at most
# 4096 blocks keep them); collected on a GPU only.
_STRESS = [
    ((16, 262144), 64, True),  # 4096 blocks of one env block
    ((64, 262144), 128, False),  # 2 env blocks: 8192 blocks, LOOKBACK (zeroed words)
    ((40, 65536), 32, True),  # 1024 blocks
    ((4096, 2048), 16, True),  # 128 env blocks of 32 blocks
]
_STRESS_CASES = [
    pytest.param(name, shape, window, epochs, id=f"{name.removeprefix('compute_')}-N{shape[0]}-T{shape[1]}-w{window}")
    for name in ("compute_gae", "compute_discounted_returns", "compute_eligibility_traces")
    for shape, window, epochs in _STRESS
    if torch.cuda.is_available()
]


@pytest.mark.parametrize("name, shape, window, epochs", _STRESS_CASES)
def test_lookback_stress_cuda(in_place, name, shape, window, epochs):
    """The look-back over blocks of envs on the GPU, where blocks run concurrently (the interpreter runs them one
    after another): rows read in place whatever their length, against the contiguous call (env-major
    kernels), and five calls bit for bit the same (epochs advancing, or words zeroed per call). The first form of
    this look-back failed here (NOTES.md)."""
    chosen = _chosen(name, *shape)
    plan = replace(chosen, split=Split.LOOKBACK, window=window, epochs=epochs, chunks_per_block=1)
    kwargs = valid_kwargs(name, shape, device="cuda")
    tm = {k: _tm(v) for k, v in kwargs.items()}
    want = getattr(R, name)(**kwargs)
    outs = [getattr(R, name)(**tm, plan=plan) for _ in range(5)]
    assert outs[0].T.is_contiguous()  # read in place
    torch.testing.assert_close(outs[0], want, atol=2e-5, rtol=2e-5)
    for o in outs[1:]:
        assert torch.equal(o, outs[0])


_WARPS_CASES = [
    pytest.param(name, warps, id=f"{name.removeprefix('compute_')}-w{warps}")
    for name in FUNCTIONS
    for warps in (2, 4, 8, 16)
    if torch.cuda.is_available() and not R.INTERPRET
]


@pytest.mark.parametrize("name, warps", _WARPS_CASES)  # compiled
def test_lookback_warps_cuda(name, warps):
    """The look-back over blocks of envs in 2 to 16 warps (2 env blocks of 32 time blocks, windows of 16 blocks:
    each reads a [16, 32] tile of words), against the float64 reference; the one the launcher refuses (Triton 3.6
    compiled TD(lambda)'s in 8 warps to misaligned loads) raises."""
    plan = replace(_chosen(name, 64, 2048), split=Split.LOOKBACK, window=16, chunks_per_block=1, warps=warps)
    kwargs = _tm_kwargs(name, (64, 2048), device="cuda")
    if name == "compute_lambda_returns" and warps == 8:
        with pytest.raises(ValueError, match="miscompiles"):
            getattr(R, name)(**kwargs, plan=plan)
        return
    _checked(name, kwargs, plan)
    torch.cuda.synchronize()


@pytest.mark.skipif(not torch.cuda.is_available() or R.INTERPRET, reason="compiled kernels on a GPU")
def test_lookback_fresh_inputs_cuda():
    """Time-major Retrace over the look-back (N64-T100: 2 env blocks of 4 time blocks), fresh inputs every call,
    against the float64 reference. Repeated calls on the same inputs cannot fail this way: a stale aggregate from
    the previous call has the same value. Folding a copy of a block's words other than the one the wait had checked
    gave a wrong carry in about one call in ten on an H200 (core._fold_tagged)."""
    assert _chosen("compute_retrace", 64, 100).split is Split.LOOKBACK
    for _ in range(150):
        kwargs = _tm_kwargs("compute_retrace", (64, 100), device="cuda")
        out = R.compute_retrace(**kwargs)
        ref = reference.compute_retrace(**{k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()})
        for o, r in zip(out, ref, strict=True):
            assert_close(o, r, **F32_TOL)


@pytest.mark.parametrize("name", FUNCTIONS if torch.cuda.is_available() and not R.INTERPRET else [])  # compiled
def test_lookback_cuda_graph(name):
    """A time-major call through the look-back captured in a CUDA graph (its flags leased from the arena) gives
    the eager call's bits on every replay, with the eager calls' epochs advancing in between (the discounted
    returns' rows take the two-pass split)."""
    chosen = _chosen(name, 64, 3000)
    assert chosen.split is (Split.TWO_PASS if name == "compute_discounted_returns" else Split.LOOKBACK)
    kwargs = {k: _tm(v) for k, v in valid_kwargs(name, (64, 3000), device="cuda").items()}
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
