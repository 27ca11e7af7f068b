"""Masked GAE and REINFORCE++ against their float64 loops, on every path."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rl_triton import llm
from rl_triton.llm import plans
from rl_triton.llm.plans import Form, Split, TokenPlan
from tests._helpers import assert_close
from tests.llm import reference
from tests.llm.conftest import SMALL_BLOCKS, token_batch

F32 = (torch.float32, 2e-5, 1e-4)
TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (2e-5, 1e-4),
    torch.bfloat16: (2e-2, 2e-2),
}
MASKS = [torch.bool, torch.int64, torch.float32]
SPLITS = [Split.TWO_PASS, Split.LOOKBACK]  # the token scans' splits (a row of one block is never split)
# (B, T, dtype, gamma/lam kind): a one-token row, odd lengths, several rows a program; every dtype and every
# kind of hyper-parameter once (interpreted kernels are slow, so not their full product).
CASES = [
    pytest.param(3, 1, torch.float32, "per-seq", id="B3-T1"),
    pytest.param(4, 37, torch.float32, "per-seq", id="B4-T37"),
    pytest.param(9, 16, torch.float32, "float", id="B9-T16-float"),
    pytest.param(2, 130, torch.float32, "0d", id="B2-T130-0d"),
    pytest.param(3, 257, torch.float32, "per-seq", id="B3-T257"),
    pytest.param(4, 37, torch.float64, "float", id="B4-T37-f64"),
    pytest.param(4, 37, torch.bfloat16, "per-seq", id="B4-T37-bf16"),
]
# Rows split in time (blocks of 64 under SMALL_BLOCKS): one to five blocks a row.
SPLIT_CASES = [
    pytest.param(2, 130, torch.float32, "per-seq", id="B2-T130"),
    pytest.param(3, 257, torch.float64, "float", id="B3-T257-f64"),
    pytest.param(2, 64, torch.float32, "0d", id="B2-T64"),
]


def _unchanged(*tensors):
    return [t.clone() for t in tensors]


def _check_same(before, after):
    for b, a in zip(before, after, strict=True):
        assert torch.equal(b, a), "an input was modified"


def _hyper(kind: str, b: int, device, value: float):
    if kind == "float":
        return value
    if kind == "0d":
        return torch.tensor(value, device=device)
    return torch.rand(b, dtype=torch.float64).to(device)


def _gae_case(path, b, t, dtype, hyper, plan=None):
    atol, rtol = TOL[dtype]
    r, v, m = token_batch(b, t, path.device, dtype, MASKS[t % 3])
    gamma, lam = _hyper(hyper, b, path.device, 0.97), _hyper(hyper, b, path.device, 0.9)
    before = _unchanged(r, v, m)
    adv, ret = llm.compute_gae_advantage_return(r, v, m, gamma, lam, plan=plan)
    _check_same(before, [r, v, m])
    e_adv, e_ret, _ = reference.gae(r, v, m, gamma, lam)
    assert_close(ret, e_ret, atol=atol, rtol=rtol, dtype=dtype, device=path.device)
    assert_close(adv, e_adv, atol=atol, rtol=rtol, dtype=dtype, device=path.device)


def _rpp_case(path, b, t, dtype, hyper, plan=None):
    atol, rtol = TOL[dtype]
    r, _, m = token_batch(b, t, path.device, dtype, MASKS[t % 3])
    gamma = _hyper(hyper, b, path.device, 0.95)
    before = _unchanged(r, m)
    adv, ret = llm.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=gamma, plan=plan)
    _check_same(before, [r, m])
    e_adv, e_ret = reference.reinforce_pp(r, m, gamma)
    assert_close(ret, e_ret, atol=atol, rtol=rtol, dtype=dtype, device=path.device)
    assert_close(adv, e_adv, atol=atol, rtol=rtol, dtype=dtype, device=path.device)


@pytest.mark.parametrize("b, t, dtype, hyper", CASES)
def test_gae(path, b, t, dtype, hyper):
    _gae_case(path, b, t, dtype, hyper)


@pytest.mark.parametrize("b, t, dtype, hyper", SPLIT_CASES)
def test_gae_split_rows(path, b, t, dtype, hyper):
    _gae_case(path, b, t, dtype, hyper, SMALL_BLOCKS)


@pytest.mark.parametrize("form", [Form.ENV_GROUPS], ids=lambda f: f.name.lower())
def test_tile_forms(kernel_path, form):
    plan = TokenPlan(block=64, form=form)
    _gae_case(kernel_path, 2, 150, torch.float32, "per-seq", plan)
    _rpp_case(kernel_path, 2, 150, torch.float32, "float", plan)


@pytest.mark.parametrize("b, t, dtype, hyper", CASES)
def test_reinforce_pp(path, b, t, dtype, hyper):
    _rpp_case(path, b, t, dtype, hyper)


@pytest.mark.parametrize("b, t, dtype, hyper", SPLIT_CASES)
def test_reinforce_pp_split_rows(path, b, t, dtype, hyper):
    _rpp_case(path, b, t, dtype, hyper, SMALL_BLOCKS)


def test_reinforce_pp_gamma_from_config(path):
    r, _, m = token_batch(3, 20, path.device)

    class Config:
        gamma = 0.9

    expected = reference.reinforce_pp(r, m, 0.9)
    for out in (
        llm.compute_reinforce_plus_plus_outcome_advantage(r, m, config=Config(), index=np.arange(3)),
        llm.compute_reinforce_plus_plus_outcome_advantage(r, m, {"gamma": 0.9}),
        llm.compute_reinforce_plus_plus_outcome_advantage(r, m, 0.9),
    ):
        for o, e in zip(out, expected, strict=True):
            assert_close(o, e, atol=2e-5, rtol=1e-4)


def test_reinforce_pp_skips_masked_tokens(path):
    # r = [0, 1, tool 5, tool 7, 2, pad 9]: the running return passes across the tool span, 0 is stored there
    r = torch.tensor([[0.0, 1.0, 5.0, 7.0, 2.0, 9.0]], device=path.device)
    m = torch.tensor([[1, 1, 0, 0, 1, 0]], device=path.device)
    _, ret = llm.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=0.5)
    assert torch.allclose(ret.cpu(), torch.tensor([[1.0, 2.0, 0.0, 0.0, 2.0, 0.0]]))
    # and the same valid-token returns as the response without its tool span
    _, short = llm.compute_reinforce_plus_plus_outcome_advantage(r[:, [0, 1, 4]], m[:, [0, 1, 4]], gamma=0.5)
    assert torch.allclose(ret[m != 0], short.reshape(-1))


def test_gae_rows_fully_masked_and_one_token(path):
    r, v, m = token_batch(6, 40, path.device)
    m[1] = False  # a fully masked row: returns carry nothing, L = 0 there
    m[2] = False
    m[2, 5] = True  # a response of one token, in the middle of its row
    m[3] = False
    m[3, 0] = True  # one token at t = 0
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.99, 0.95)
    e_adv, e_ret, L = reference.gae(r, v, m, 0.99, 0.95)
    assert torch.all(L[1] == 0)
    assert_close(ret, e_ret, atol=2e-5, rtol=1e-4)
    assert_close(adv, e_adv, atol=2e-5, rtol=1e-4)


def test_gae_golden(path):
    # one response r = [0, 1 (tool), 2, pad]: the masked token carries V and L across
    r = torch.tensor([[0.0, 1.0, 2.0, 5.0]], device=path.device)
    v = torch.tensor([[0.5, 9.0, 1.0, 7.0]], device=path.device)
    m = torch.tensor([[1, 0, 1, 0]], device=path.device)
    _, ret = llm.compute_gae_advantage_return(r, v, m, 0.5, 0.5)
    # t=2: δ = 2 - 1 = 1, L = 1; t=1 carries L = 1, nv = 1; t=0: δ = 0 + 0.5·1 - 0.5 = 0, L = 0 + 0.25·1
    expected = torch.tensor([[0.25 + 0.5, 1.0 + 9.0, 1.0 + 1.0, 0.0 + 7.0]])
    assert torch.allclose(ret.cpu(), expected)


def test_padding_nan_contained(path):
    r, v, m = token_batch(4, 90, path.device)
    r2, v2 = r.clone(), v.clone()
    r2[~m], v2[~m] = float("nan"), float("inf")
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.9, 0.8)
    adv2, ret2 = llm.compute_gae_advantage_return(r2, v2, m, 0.9, 0.8)
    assert torch.equal(adv, adv2)
    assert torch.equal(ret[m], ret2[m])
    a, g = llm.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=0.9)
    a2, g2 = llm.compute_reinforce_plus_plus_outcome_advantage(r2, m, gamma=0.9)
    assert torch.equal(a, a2) and torch.equal(g[m], g2[m])


@pytest.mark.parametrize("path", ["torch"], indirect=True)
def test_long_row_torch(path):
    r, v, m = token_batch(2, 40_000, path.device, interior=0.2)
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.999, 0.99)
    e_adv, e_ret, _ = reference.gae(r, v, m, 0.999, 0.99)
    assert_close(ret, e_ret, atol=2e-5, rtol=1e-4)
    assert_close(adv, e_adv, atol=2e-5, rtol=1e-4)
    a, g = llm.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=0.999)
    e_a, e_g = reference.reinforce_pp(r, m, 0.999)
    assert_close(g, e_g, atol=2e-5, rtol=1e-4)
    assert_close(a, e_a, atol=2e-5, rtol=1e-4)


@pytest.mark.cuda
def test_long_row_kernel():
    # 40k tokens in 10 blocks of 4096 (the default block): both splits at their real block length
    r, v, m = token_batch(2, 40_000, "cuda", interior=0.2)
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.999, 0.99)
    adv2, ret2 = llm.compute_gae_advantage_return(r, v, m, 0.999, 0.99, plan=TokenPlan(split=Split.TWO_PASS))
    assert torch.equal(adv, adv2) and torch.equal(ret, ret2)
    with torch.no_grad():
        from rl_triton import use_backend

        with use_backend("torch"):
            e_adv, e_ret = llm.compute_gae_advantage_return(r.double(), v.double(), m, 0.999, 0.99)
    assert_close(ret, e_ret, atol=2e-5, rtol=1e-4)
    assert_close(adv, e_adv, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("split", SPLITS, ids=lambda s: s.value)
def test_split_forms(kernel_path, split):
    """Rows split in time, one launch (look-back) or two: repeated calls (each look-back with its own flag epoch),
    both passes giving the same bits."""
    plan = TokenPlan(block=64, split=split)
    for _ in range(2 if split is Split.LOOKBACK else 1):
        _gae_case(kernel_path, 3, 300, torch.float32, "per-seq", plan)
        _rpp_case(kernel_path, 2, 200, torch.float32, "float", plan)
    r, v, m = token_batch(2, 200, kernel_path.device)
    other = TokenPlan(block=64, split=Split.TWO_PASS if split is Split.LOOKBACK else Split.LOOKBACK)
    a1, r1 = llm.compute_gae_advantage_return(r, v, m, 0.9, 0.8, plan=plan)
    a2, r2 = llm.compute_gae_advantage_return(r, v, m, 0.9, 0.8, plan=other)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)


@pytest.mark.cuda
def test_many_partials():
    """Over 1024 programs (too slow interpreted): the last one's combination of the partial moments loops over
    them; the ticket counter is back to 0 after every launch."""
    from rl_triton.llm import _kernels

    for split in SPLITS:
        plan = TokenPlan(block=16, split=split)
        _gae_case(SimpleNamespace(device="cuda"), 1, 16 * 1030 + 5, torch.float32, "float", plan)
    x = torch.randn(5_000_000, device="cuda")
    m = torch.rand(x.shape, device="cuda") > 0.4
    xd = x.double()[m]
    assert abs(llm.masked_var(x, m).item() - xd.var().item()) < 1e-5
    assert_close(llm.masked_whiten(x, m), (x.double() - xd.mean()) / (xd.var() + 1e-8) ** 0.5, atol=2e-5, rtol=1e-4)
    assert _kernels._ticket(x.device).item() == 0  # the counter of x's device and stream, used by every call above


def test_gae_fold():
    """The interpreter's NumPy fold of the GAE pair combine (kernels/_interpret.py): each prefix is the maps composed
    in order, the earlier applied first; under TRITON_INTERPRET=1 it is the fold registered for the kernels' combine."""
    from rl_triton import INTERPRET
    from rl_triton.kernels import _interpret

    rng = np.random.default_rng(0)
    maps = [rng.uniform(-1, 1, (3, 9)) for _ in range(5)]  # p, q, r, b1, b2 of 9 maps, 3 rows
    folded = _interpret.fold_gae_pair(*(m.copy() for m in maps))
    L0, nv0 = rng.uniform(-1, 1, 3), rng.uniform(-1, 1, 3)
    L, nv = L0, nv0
    for i in range(9):
        p, q, r, b1, b2 = (m[:, i] for m in maps)
        L, nv = p * L + q * nv + b1, r * nv + b2
        fp, fq, fr, fb1, fb2 = (f[:, i] for f in folded)
        np.testing.assert_allclose(fp * L0 + fq * nv0 + fb1, L, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(fr * nv0 + fb2, nv, rtol=1e-12, atol=1e-12)
    if INTERPRET:
        from rl_triton.llm import _kernels

        assert _interpret._FOLDS[_kernels._gae_combine.fn] is _interpret.fold_gae_pair


def test_deterministic(kernel_path):
    r, v, m = token_batch(2, 130, kernel_path.device)
    a1, r1 = llm.compute_gae_advantage_return(r, v, m, 0.9, 0.8, plan=SMALL_BLOCKS)
    a2, r2 = llm.compute_gae_advantage_return(r, v, m, 0.9, 0.8, plan=SMALL_BLOCKS)
    assert torch.equal(a1, a2) and torch.equal(r1, r2)


def test_default_plan():
    """The chosen plan is today's launch: blocks of 4096 tokens, the grouped form, the look-back split; GAE on 2- and
    4-byte floats in 4 warps, the rest 8 tokens a thread."""
    for shape, dtype in (((64, 32768), torch.float32), ((3, 5), torch.float64), ((4096, 512), torch.bfloat16)):
        rule = TokenPlan(4096, Form.ENV_GROUPS, Split.LOOKBACK, None)
        assert plans.choose(*shape, dtype, "reinforce_pp") == rule
        assert plans.choose(*shape, dtype) == (rule if dtype == torch.float64 else TokenPlan(warps=4))
    with pytest.raises(ValueError, match="estimator"):
        plans.choose(3, 5, torch.float32, "grpo")
    assert TokenPlan(form="grouped", split="two_pass") == TokenPlan(split=Split.TWO_PASS)
    assert TokenPlan(form="env_groups") == TokenPlan() and TokenPlan().form is Form.ENV_GROUPS


@pytest.mark.parametrize(
    "fields, match",
    [
        (dict(block=48), "power of two"),
        (dict(block=0), "power of two"),
        (dict(block=2048.0), "power of two"),
        (dict(block=8), r"\[16, 8192\]"),
        (dict(block=16384), r"\[16, 8192\]"),
        (dict(form="zigzag"), "form must be a Form"),
        (dict(form="reverse"), "form must be a Form"),
        (dict(form=Form.PLAIN), "form must be a Form"),
        (dict(split="ticket"), "split must be a Split"),
        (dict(split=Split.SINGLE), "split must be a Split"),
        (dict(warps=3), "warps"),
        (dict(warps=64), "warps"),
        (dict(warps=True), "warps"),
    ],
)
def test_plan_invalid(fields, match):
    with pytest.raises(ValueError, match=match):
        TokenPlan(**fields)


def test_plan_checked_when_passed(path):
    r, v, m = token_batch(2, 8, path.device)
    with pytest.raises(TypeError, match="TokenPlan"):
        llm.compute_gae_advantage_return(r, v, m, 0.9, 0.8, plan="grouped")
    with pytest.raises(TypeError, match="TokenPlan"):
        llm.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=0.9, plan=(2048, "grouped"))
    bad = TokenPlan()
    object.__setattr__(bad, "block", 100)  # a frozen plan altered behind its back is checked again
    with pytest.raises(ValueError, match="power of two"):
        llm.compute_gae_advantage_return(r, v, m, 0.9, 0.8, plan=bad)


@pytest.mark.cuda
@pytest.mark.parametrize("shape", [(64, 32768), (8, 131072), (256, 4096), (4096, 512)], ids=str)
def test_gae_large_cuda(shape):
    """The kernels at benchmark shapes against the PyTorch path in float64 on the GPU."""
    from rl_triton import use_backend

    r, v, m = token_batch(*shape, "cuda", interior=0.2)
    gamma = torch.rand(shape[0], device="cuda") * 0.1 + 0.9
    adv, ret = llm.compute_gae_advantage_return(r, v, m, gamma, 0.95)
    a2, g2 = llm.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=gamma)
    with use_backend("torch"):
        e_adv, e_ret = llm.compute_gae_advantage_return(r.double(), v.double(), m, gamma, 0.95)
        e_a2, e_g2 = llm.compute_reinforce_plus_plus_outcome_advantage(r.double(), m, gamma=gamma)
    assert_close(ret, e_ret, atol=2e-5, rtol=1e-4)
    assert_close(adv, e_adv, atol=2e-5, rtol=1e-4)
    assert_close(g2, e_g2, atol=2e-5, rtol=1e-4)
    assert_close(a2, e_a2, atol=2e-5, rtol=1e-4)
