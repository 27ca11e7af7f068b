"""Masked statistics and the group estimators (GRPO, Dr. GRPO, RLOO) against float64 references; errors."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from rl_triton import llm
from tests._helpers import assert_close
from tests.llm import reference
from tests.llm.conftest import token_batch

TOL = {torch.float64: (1e-10, 1e-10), torch.float32: (2e-5, 1e-4), torch.bfloat16: (2e-2, 2e-2)}


# ---------------------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize(
    "shape, dtype, mask_dtype",
    [
        pytest.param((5, 33), torch.float32, torch.bool, id="2d-f32-bool"),
        pytest.param((3, 4, 7), torch.float64, torch.int32, id="3d-f64-int"),
        pytest.param((6000,), torch.float32, torch.float32, id="1d-f32-float-two-programs"),
        pytest.param((4, 9), torch.bfloat16, torch.uint8, id="bf16-uint8"),
    ],
)
def test_masked_stats(path, shape, dtype, mask_dtype):
    atol, rtol = TOL[dtype]
    x = (torch.randn(shape, dtype=torch.float64) * 3 + 1).to(dtype).to(path.device)
    m = (torch.rand(shape) > 0.4).to(mask_dtype).to(path.device)
    x[m == 0] = float("nan")  # masked entries never enter the statistics
    before = (x.clone(), m.clone())
    n, mean, m2 = reference.moments(x, m)
    for out, expected in (
        (llm.masked_mean(x, m), mean),
        (llm.masked_var(x, m), m2 / (n - 1)),
        (llm.masked_var(x, m, unbiased=False), m2 / n),
    ):
        assert out.dtype == dtype and out.dim() == 0
        assert_close(out, torch.tensor(expected, dtype=torch.float64), atol=atol, rtol=rtol)
    for shift in (True, False):
        w = llm.masked_whiten(x, m, shift_mean=shift)
        e = reference.masked_whiten(x, m, shift_mean=shift)
        valid = m.cpu() != 0
        assert w.dtype == dtype and w.shape == x.shape
        assert_close(w.cpu()[valid], e[valid], atol=atol, rtol=rtol)
    assert torch.equal(before[1], m) and torch.equal(before[0].isnan(), x.isnan())


def test_masked_mean_axis_and_empty(path):
    x = torch.randn(4, 10, device=path.device)
    m = torch.rand(4, 10, device=path.device) > 0.5
    m[2] = False
    rows = llm.masked_mean(x, m, axis=-1)
    expected = [reference.masked_mean(x[i], m[i]) for i in range(4)]
    assert expected[2] == 0.0  # the empty row
    torch.testing.assert_close(rows.cpu().double(), torch.tensor(expected, dtype=torch.float64))
    none = torch.zeros_like(m)
    for out in (llm.masked_mean(x, none), llm.masked_var(x, none, unbiased=False)):
        assert out.item() == 0.0  # as verl's (Σ m + 1e-8 in the denominator), no host sync and no error


def test_whiten_needs_two_tokens(path):
    x = torch.randn(3, 5, device=path.device)
    none, one = torch.zeros(3, 5, dtype=torch.bool, device=path.device), torch.zeros(3, 5, device=path.device)
    one[1, 2] = 1
    with pytest.raises(ValueError, match="no valid token"):
        llm.masked_whiten(x, none)
    with pytest.raises(ValueError, match="no valid token"):
        llm.masked_var(x, none)
    with pytest.raises(ValueError, match="single valid token"):
        llm.masked_whiten(x, one)
    assert llm.masked_var(x, one, unbiased=False).item() == 0.0
    with pytest.raises(ValueError, match="single valid token"):
        llm.compute_gae_advantage_return(x, x, one, 0.9, 0.9)
    with pytest.raises(ValueError, match="no valid token"):
        llm.compute_reinforce_plus_plus_outcome_advantage(x, none, gamma=0.9)
    # check=False: no count check (and no host sync), so no error either, whatever the values are then
    llm.masked_whiten(x, none, check=False)
    llm.masked_var(x, none, unbiased=False, check=False)
    llm.masked_whiten(x, one, check=False)
    llm.compute_gae_advantage_return(x, x, one, 0.9, 0.9, check=False)
    llm.compute_reinforce_plus_plus_outcome_advantage(x, none, gamma=0.9, check=False)


def _whitening_calls(x, v, m, gamma):
    """Every call that checks the count, as functions of ``check`` returning a tuple of outputs."""
    return (
        lambda c: (llm.masked_var(x, m, check=c),),
        lambda c: (llm.masked_var(x, m, unbiased=False, check=c),),
        lambda c: (llm.masked_whiten(x, m, check=c), llm.masked_whiten(x, m, shift_mean=False, check=c)),
        lambda c: llm.compute_gae_advantage_return(x, v, m, gamma, 0.95, check=c),
        lambda c: llm.compute_reinforce_plus_plus_outcome_advantage(x, m, gamma=gamma, check=c),
    )


def _same(outputs, others):
    for out, other in zip(outputs, others, strict=True):
        for a, b in zip(out, other, strict=True):
            assert torch.equal(a, b)


def test_check_false_same_numbers(path):
    x, v, m = token_batch(4, 37, path.device)
    calls = _whitening_calls(x, v, m, 0.97)
    _same([call(True) for call in calls], [call(False) for call in calls])
    n, mean, m2 = reference.moments(x, m)
    assert abs(llm.masked_var(x, m, check=False).item() - m2 / (n - 1)) < 1e-4 * m2 / (n - 1)


@pytest.mark.cuda
def test_check_false_no_host_sync():
    """check=False: the whitening calls read nothing back to the host (so a CUDA graph can capture them)."""
    # three blocks a row: the look-back split, and inside the graph capture the two passes (the same bits)
    x, v, m = token_batch(64, 9000, "cuda")
    gamma = torch.rand(64, device="cuda") * 0.1 + 0.9
    calls = _whitening_calls(x, v, m, gamma)
    checked = [call(True) for call in calls]  # compiles every kernel first
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        unchecked = [call(False) for call in calls]
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    _same(checked, unchecked)
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchronizing"):  # the mode catches the checked calls' host read
            calls[0](True)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    # and so the estimators can be captured in a CUDA graph (warmed up on a side stream first, as captures want)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        calls[3](False)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = calls[3](False) + calls[4](False)
    graph.replay()
    torch.cuda.synchronize()
    _same([checked[3] + checked[4]], [captured])


def test_local_path_does_not_import_distributed(path, monkeypatch):
    monkeypatch.setitem(sys.modules, "rl_triton.distributed", None)  # an import would raise ImportError
    x, v, m = token_batch(3, 12, path.device)
    llm.masked_whiten(x, m, process_group=None)
    llm.masked_var(x, m, process_group=None)
    llm.compute_gae_advantage_return(x, v, m, 0.9, 0.9, process_group=None)


# ---------------------------------------------------------------------------------------------- groups


def _ids(kind: str, groups: list[int]):
    if kind == "tensor":
        return torch.tensor(groups) * 1000 - 7  # not dense, negative: sorted on the device, never unique'd
    if kind == "strings":
        return np.array([f"uid-{g}" for g in groups], dtype=object)
    if kind == "numpy":
        return np.array(groups, dtype=np.int64) * 3
    return [("prompt", g) for g in groups]  # a list of hashable tuples


def _groups(b: int, size: int):
    """Group ids for b sequences: groups of ``size`` in shuffled order, plus a group of one."""
    g = [i // size for i in range(b - 1)] + [10_000]
    return [g[i] for i in torch.randperm(b).tolist()]


@pytest.mark.parametrize("kind", ["grpo", "drgrpo", "rloo"])
@pytest.mark.parametrize(
    "b, t, size, dtype, ids",
    [
        pytest.param(17, 13, 4, torch.float32, "tensor", id="B17-g4-tensor"),
        pytest.param(9, 1, 2, torch.float64, "strings", id="B9-T1-g2-f64-strings"),
        pytest.param(12, 40, 3, torch.bfloat16, "numpy", id="B12-g3-bf16-numpy"),
        pytest.param(70, 5, 69, torch.float32, "list", id="B70-g69-list"),  # a group over several chunks
    ],
)
def test_outcome(path, kind, b, t, size, dtype, ids):
    atol, rtol = TOL[dtype]
    r, _, m = token_batch(b, t, path.device, dtype)
    groups = _groups(b, size)
    index = _ids(ids, groups)
    before = (r.clone(), m.clone())
    if kind == "rloo":
        adv, adv2 = llm.compute_rloo_outcome_advantage(r, m, index)
    else:
        adv, adv2 = llm.compute_grpo_outcome_advantage(r, m, index, norm_adv_by_std_in_grpo=kind == "grpo")
    assert torch.equal(before[0], r) and torch.equal(before[1], m)
    assert adv is adv2 or torch.equal(adv, adv2)
    assert_close(adv, reference.outcome(kind, r, m, groups), atol=atol, rtol=rtol, dtype=dtype, device=path.device)


def test_outcome_epsilon_and_config(path):
    r, _, m = token_batch(6, 8, path.device)
    index = torch.tensor([0, 0, 1, 1, 1, 2])
    adv, _ = llm.compute_grpo_outcome_advantage(r, m, index, 0.5, True, config=None)
    assert_close(adv, reference.outcome("grpo", r, m, index, epsilon=0.5), atol=2e-5, rtol=1e-4)


@pytest.mark.cuda
def test_group_index_no_host_sync():
    r, _, m = token_batch(8192, 64, "cuda")
    index = torch.randint(0, 1024, (8192,), device="cuda")
    llm.compute_grpo_outcome_advantage(r, m, index)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        llm.compute_grpo_outcome_advantage(r, m, index)
        llm.compute_rloo_outcome_advantage(r, m, index)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    adv, _ = llm.compute_grpo_outcome_advantage(r, m, index)
    expected = reference.outcome("grpo", r, m, index.cpu())
    assert_close(adv, expected, atol=2e-5, rtol=1e-4)


# ---------------------------------------------------------------------------------------------- errors


def test_errors(path):
    r, v, m = token_batch(3, 6, path.device)
    gae = llm.compute_gae_advantage_return
    with pytest.raises(ValueError, match="values must have the shape"):
        gae(r, v[:, :5], m, 0.9, 0.9)
    with pytest.raises(ValueError, match="response_mask must have the shape"):
        gae(r, v, m[:2], 0.9, 0.9)
    with pytest.raises(ValueError, match="token_level_rewards must be 2-D"):
        gae(r[0], v[0], m[0], 0.9, 0.9)
    with pytest.raises(TypeError, match="values has dtype"):
        gae(r, v.double(), m, 0.9, 0.9)
    with pytest.raises(TypeError, match="token_level_rewards must be a floating"):
        gae(r.long(), v, m, 0.9, 0.9)
    with pytest.raises(ValueError, match=r"^compute_gae_advantage_return: 'gamma' must be in \[0, 1\], got 1.5$"):
        gae(r, v, m, 1.5, 0.9)
    with pytest.raises(ValueError, match=r"^compute_gae_advantage_return: 'lam' must be in \[0, 1\], got nan$"):
        gae(r, v, m, 0.9, float("nan"))
    bad_lam = torch.tensor([0.5, 2.0, 0.5], device=r.device)
    if r.device.type == "cpu":
        with pytest.raises(ValueError, match=r"'lam' must be in \[0, 1\], got values in \[0.5, 2.0\]"):
            gae(r, v, m, 0.9, bad_lam)
    else:  # the range of a device tensor is not checked (that would be a host sync)
        gae(r, v, m, 0.9, bad_lam)
    with pytest.raises(ValueError, match=r"'lam' must be a float, a 0-d tensor or a \(3,\) tensor"):
        gae(r, v, m, 0.9, torch.full((2,), 0.5))
    with pytest.raises(TypeError, match="'gamma' must be a float"):
        gae(r, v, m, "0.9", 0.9)
    with pytest.raises(ValueError, match="index must have length B = 3"):
        llm.compute_grpo_outcome_advantage(r, m, torch.arange(4))
    with pytest.raises(ValueError, match="index must have length B = 3"):
        llm.compute_rloo_outcome_advantage(r, m, ["a", "b"])
    with pytest.raises(TypeError, match="index must be an integer tensor"):
        llm.compute_grpo_outcome_advantage(r, m, torch.zeros(3))
    with pytest.raises(TypeError, match="pass gamma"):
        llm.compute_reinforce_plus_plus_outcome_advantage(r, m)
    with pytest.raises(ValueError, match="mask must have the shape"):
        llm.masked_mean(r, m[:, :2])
    with pytest.raises(ValueError, match="process_group needs axis=None"):
        llm.masked_mean(r, m, axis=0, process_group=object())


@pytest.mark.cuda
def test_errors_devices():
    r, v, m = token_batch(3, 6, "cuda")
    with pytest.raises(ValueError, match="values is on cpu"):
        llm.compute_gae_advantage_return(r, v.cpu(), m, 0.9, 0.9)
    with pytest.raises(ValueError, match="'gamma' is on cpu"):
        llm.compute_gae_advantage_return(r, v, m, torch.full((3,), 0.9), 0.9)
    adv, _ = llm.compute_gae_advantage_return(r, v, m, torch.tensor(0.9), torch.tensor(0.9, device="cuda"))
    assert adv.device.type == "cuda"


def test_process_group_goes_through_combine_moments(path, monkeypatch):
    """With a group, the statistics are combine_moments' (here a stand-in: two ranks holding the same data)."""
    import rl_triton.distributed as distributed

    seen = []

    def two_equal_ranks(count, mean, m2, process_group=None):
        seen.append(process_group)
        return count * 2, mean, m2 * 2

    monkeypatch.setattr(distributed, "combine_moments", two_equal_ranks)
    group = object()
    x, v, m = token_batch(4, 9, path.device, torch.float64)
    n, mean, m2 = reference.moments(x, m)
    var2 = 2 * m2 / (2 * n - 1)
    assert abs(llm.masked_var(x, m, process_group=group).item() - var2) < 1e-12
    assert abs(llm.masked_mean(x, m, process_group=group).item() - mean) < 1e-12
    w = llm.masked_whiten(x, m, process_group=group)
    assert_close(w, (x.cpu().double() - mean) / (var2 + 1e-8) ** 0.5, atol=1e-10, rtol=1e-10)
    adv, _ = llm.compute_gae_advantage_return(x, v, m, 0.9, 0.8, process_group=group)
    _, _, L = reference.gae(x, v, m, 0.9, 0.8)
    n, mean, m2 = reference.moments(L, m)
    assert_close(adv, (L - mean) / (2 * m2 / (2 * n - 1) + 1e-8) ** 0.5, atol=1e-10, rtol=1e-10)
    assert seen == [group] * 4


def test_moments_many_programs(kernel_path):
    """The last program of the moments launch combines every program's partial moments."""
    x = torch.randn(3 * 4096 + 17, dtype=torch.float64).to(kernel_path.device)
    m = torch.rand(x.shape) > 0.4
    n, mean, m2 = reference.moments(x, m)
    assert abs(llm.masked_var(x, m.to(x.device)).item() - m2 / (n - 1)) < 1e-12
    assert_close(llm.masked_whiten(x, m.to(x.device)), reference.masked_whiten(x, m), atol=1e-10, rtol=1e-10)
