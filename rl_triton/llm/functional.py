"""Token-level advantage estimators for LLM RL: drop-ins for verl's (same names, argument order, outputs).

Inputs are ``(B, T)`` tensors: B sequences of T token positions, right-padded. ``response_mask`` (bool, int or
float; nonzero = a token the policy produced) marks the tokens that count; masked tokens inside a response
(tool output, observations) and padding are both 0. Outputs are fresh tensors of the rewards' dtype; statistics
accumulate in float32 (float64 for float64 inputs). CUDA tensors run Triton kernels (``rl_triton.llm._kernels``),
CPU tensors a PyTorch path (or the kernels under ``TRITON_INTERPRET=1``), as chosen by
:func:`rl_triton.use_backend`. What each function computes is in ``docs/llm.md``.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np
import torch

from .. import distributed
from .._discounts import column, per_sequence
from .._dispatch import use_kernels
from ..distributed import _acc_dtype, _masked_moments
from . import _torch

_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
WHITEN_EPS = 1e-8


# ---------------------------------------------------------------------------------------------- validation


def _tensor(name: str, x, *, ndim: int | None = None, float_only: bool = True) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"{name} must be {ndim}-D (B, T), got shape {tuple(x.shape)}")
    if float_only and x.dtype not in _FLOATS:
        raise TypeError(f"{name} must be a floating tensor (float16, bfloat16, float32 or float64), got {x.dtype}")
    return x


def _like(name: str, x, ref: torch.Tensor, ref_name: str, *, float_only: bool) -> torch.Tensor:
    _tensor(name, x, float_only=float_only)
    if x.shape != ref.shape:
        raise ValueError(f"{name} must have the shape of {ref_name} {tuple(ref.shape)}, got {tuple(x.shape)}")
    if x.device != ref.device:
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {ref.device}")
    if float_only and x.dtype != ref.dtype:
        raise TypeError(f"{name} has dtype {x.dtype} but {ref_name} has {ref.dtype}; pass one float dtype")
    return x


def _bool_mask(mask: torch.Tensor) -> torch.Tensor:
    """Nonzero = valid; a fresh bool tensor unless the mask already is one (never modified)."""
    return mask if mask.dtype == torch.bool else mask != 0


def _check_count(count: torch.Tensor, need: int, check: bool) -> None:
    if not check:
        return
    if torch.compiler.is_compiling():  # no host read in a compiled graph: the op raises (RuntimeError) at run time
        torch._assert_async(count >= need, "the mask has fewer valid tokens than the statistics need")
        return
    n = int(count)  # the host sync verl's reference has too
    if n == 0:
        raise ValueError("the mask has no valid token (its sum is zero): the statistics are undefined")
    if n < need:
        raise ValueError("the mask has a single valid token: the unbiased variance needs at least two")


def _plan(plan, r: torch.Tensor, estimator: str):
    """The launch plan of a token scan of ``r``: :func:`plans.choose`'s, or ``plan`` once checked."""
    from . import plans

    return plans.choose(r.shape[0], r.shape[1], r.dtype, estimator) if plan is None else plans.check(plan)


def _combined(stats, process_group):
    """Kernel-path statistics for the whitening: the partials as they are (the whitening kernel combines them)
    without a group; with one, (count, mean, M2) combined across its ranks."""
    from . import _kernels

    if process_group is None:
        return stats
    if isinstance(stats, _kernels.Partials):
        stats = _kernels.finalize(stats)
    return distributed.combine_moments(*stats, process_group=process_group)


def _moments(values, mask, process_group, name="values", finalized=True):
    """(count, mean, M2) over the valid entries, combined across ``process_group`` when one is given. On the
    kernel path with ``finalized=False``: whatever :func:`_combined` gives (partials without a group)."""
    values = _tensor(name, values)
    mask = _like("mask", mask, values, name, float_only=False)
    if use_kernels(values.device):
        from . import _kernels

        # the kernels read the mask as stored (nonzero = valid): no conversion pass over an int64 mask
        stats = _combined(_kernels.moments(values, mask), process_group)
        if finalized and isinstance(stats, _kernels.Partials):
            stats = _kernels.finalize(stats)
        return values, stats
    count, mean, m2 = _masked_moments(values.to(_acc_dtype(values.dtype)), _bool_mask(mask))
    if process_group is not None:
        count, mean, m2 = distributed.combine_moments(count, mean, m2, process_group=process_group)
    return values, (count, mean, m2)


# ---------------------------------------------------------------------------------------------- statistics


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis=None, process_group=None) -> torch.Tensor:
    """Mean of ``values`` over the entries where ``mask`` is nonzero: ``Σ x·m / Σ m``.

    ``axis``: reduce over these dims only (as ``Tensor.sum(dim=axis)``); default all. ``process_group``: the
    mean over the union of every rank's entries (``axis=None`` only). Accumulates in float32 (float64 for
    float64) and returns the values' dtype. An empty mask (or an empty row along ``axis``) gives 0, as verl's
    does (it divides by ``Σ m + 1e-8``); no host sync.
    """
    if axis is not None:
        if process_group is not None:
            raise ValueError("masked_mean: process_group needs axis=None (a mean over all entries)")
        values = _tensor("values", values)
        mask = _like("mask", mask, values, "values", float_only=False)
        m = _bool_mask(mask)
        acc = _acc_dtype(values.dtype)
        s = torch.where(m, values.to(acc), 0).sum(dim=axis)
        return (s / m.sum(dim=axis, dtype=acc).clamp(min=1)).to(values.dtype)
    values, (count, mean, _) = _moments(values, mask, process_group)
    return torch.where(count > 0, mean, 0).to(values.dtype)


def masked_var(
    values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True, process_group=None, *, check: bool = True
) -> torch.Tensor:
    """Variance of ``values`` over the entries where ``mask`` is nonzero:
    ``masked_mean((x − μ)², m)``, times ``n / (n − 1)`` when ``unbiased`` (``n = Σ m``).

    With ``unbiased``, raises ValueError when the mask has fewer than two valid tokens (a host sync, as in verl);
    the biased variance of an empty mask is 0, as verl's, and needs no check. ``check=False`` skips the check
    and its sync, for masks known to be valid (a CUDA graph capture, for one):
    an invalid mask then gives an undefined value, not an error. ``process_group``: the variance over every
    rank's entries (local (count, mean, M2) combined by :func:`rl_triton.distributed.combine_moments`).
    """
    values, (count, _, m2) = _moments(values, mask, process_group)
    if not unbiased:
        return (m2 / count.clamp(min=1)).to(values.dtype)  # an empty mask: M2 = 0, so 0
    _check_count(count, 2, check)
    return (m2 / (count - 1)).to(values.dtype)


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, process_group=None, *, check: bool = True
):
    """``(x − μ)·rsqrt(σ² + 1e-8)`` at every entry (``+ μ`` when not ``shift_mean``), with μ the masked mean
    and σ² the unbiased masked variance. Masked entries are transformed too (verl's behaviour); callers that
    want zeros there multiply by the mask. Raises ValueError with fewer than two valid tokens (a host sync);
    ``check=False`` skips that check and its sync, for masks known to be valid (a CUDA graph capture, for one):
    an invalid mask then gives undefined values, not an error."""
    values, stats = _moments(values, mask, process_group, finalized=False)
    if use_kernels(values.device):
        from . import _kernels

        out, count = _kernels.whiten(values, stats, shift_mean)
    else:
        count, mean, m2 = stats
        out = _torch.whiten_apply(values, mean, m2 / (count - 1), shift_mean)
    _check_count(count, 2, check)
    return out


# ---------------------------------------------------------------------------------------------- estimators


def _token_inputs(token_level_rewards, response_mask, values=None):
    r = _tensor("token_level_rewards", token_level_rewards, ndim=2)
    if values is not None:
        _like("values", values, r, "token_level_rewards", float_only=True)
    mask = _like("response_mask", response_mask, r, "token_level_rewards", float_only=False)
    return r, mask  # as stored: the kernels read it in place, the PyTorch path converts it (_bool_mask)


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma,
    lam,
    process_group=None,
    *,
    plan=None,
    check: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE over the policy's tokens; masked tokens are skipped (they carry the next value and the running
    advantage across). Going backwards from ``nv_T = L_T = 0``::

        δ_t  = r_t + γ·nv_{t+1} − V_t
        L_t  = m_t·(δ_t + γλ·L_{t+1}) + (1 − m_t)·L_{t+1}
        nv_t = m_t·V_t + (1 − m_t)·nv_{t+1}
        returns = L + V;   advantages = masked_whiten(L, m)

    Args:
        token_level_rewards, values: ``(B, T)`` floats of one dtype and device.
        response_mask: ``(B, T)``, any dtype; nonzero marks the policy's tokens.
        gamma, lam: floats in [0, 1], 0-d tensors, or ``(B,)`` tensors (one per sequence).
        process_group: whiten with statistics over every rank's tokens.
        check: raise ValueError when the mask holds fewer than two valid tokens, which reads their count on
            the host (a sync). ``check=False`` skips it, for masks known to be valid (a CUDA graph capture, for
            one): nothing then waits on the host, and a mask that is not gives undefined values, not an error.
        plan: advanced: the launch plan of the kernel path (:class:`rl_triton.llm.plans.TokenPlan`); by
            default :func:`rl_triton.llm.plans.choose` picks it from the shape and dtype. Ignored by the
            PyTorch path (an invalid plan raises ValueError on every path).

    Returns ``(advantages, returns)``, both ``(B, T)`` of the input dtype.

    >>> import torch
    >>> from rl_triton.llm import compute_gae_advantage_return
    >>> r = torch.tensor([[0.0, 0.0, 1.0, 0.0]]); v = torch.zeros(1, 4); m = torch.tensor([[1, 0, 1, 0]])
    >>> adv, ret = compute_gae_advantage_return(r, v, m, gamma=1.0, lam=1.0)
    >>> ret.tolist()
    [[1.0, 1.0, 1.0, 0.0]]
    """
    r, m = _token_inputs(token_level_rewards, response_mask, values)
    b = r.shape[0]
    fn = "compute_gae_advantage_return"
    gamma, lam = per_sequence(fn, "gamma", gamma, b, r), per_sequence(fn, "lam", lam, b, r)
    plan = _plan(plan, r, "gae")
    if use_kernels(r.device):
        from . import _kernels

        L, ret, parts = _kernels.gae(r, values, m, gamma, lam, plan)
        stats = _combined(parts, process_group)
        adv, count = _kernels.whiten(L, stats, True, out_dtype=r.dtype, inplace=True)
        _check_count(count, 2, check)
        return adv, ret
    acc = _acc_dtype(r.dtype)
    m = _bool_mask(m)
    L = _torch.gae_scan(r, values, m, column(gamma, acc), column(lam, acc))
    ret = (L + values.to(acc)).to(r.dtype)
    return _whiten_local(L, m, process_group, r.dtype, check), ret


def _whiten_local(x_acc: torch.Tensor, m: torch.Tensor, process_group, dtype: torch.dtype, check: bool):
    count, mean, m2 = _masked_moments(x_acc, m)
    if process_group is not None:
        count, mean, m2 = distributed.combine_moments(count, mean, m2, process_group=process_group)
    _check_count(count, 2, check)
    return _torch.whiten_apply(x_acc, mean, m2 / (count - 1), True).to(dtype)


def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config=None,
    *,
    gamma=None,
    process_group=None,
    plan=None,
    check: bool = True,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ as verl 0.9 defines it: discounted returns over the policy's tokens, whitened over them.
    Masked tokens (tool output, observations, padding) are skipped: the running return passes across them
    unchanged, and their returns are 0. Going backwards from ``G_T = 0``::

        new_t = r_t + γ·G_{t+1};   returns_t = m_t·new_t;   G_t = m_t·new_t + (1 − m_t)·G_{t+1}
        advantages = masked_whiten(returns, m)·m

    ``gamma`` (keyword, or third positional as in older verl) or ``config.gamma`` (verl passes its algorithm
    config); a float, 0-d or ``(B,)`` tensor. Other keywords verl's dispatcher passes (``index``,
    ``epsilon``, ...) are accepted and ignored, as verl's function does. ``process_group``: whiten with
    statistics over every rank's tokens. Returns ``(advantages, returns)``.

    Keyword-only:
        check: raise ValueError when the mask holds fewer than two valid tokens, which reads their count on
            the host (a sync). ``check=False`` skips it, for masks known to be valid (a CUDA graph capture, for
            one): nothing then waits on the host, and a mask that is not gives undefined values, not an error.
        plan: advanced: the launch plan of the kernel path (:class:`rl_triton.llm.plans.TokenPlan`); by
            default :func:`rl_triton.llm.plans.choose` picks it from the shape and dtype. Ignored by the
            PyTorch path (an invalid plan raises ValueError on every path).
    """
    r, m = _token_inputs(token_level_rewards, response_mask)
    if gamma is None and isinstance(config, (numbers.Real, torch.Tensor)):
        config, gamma = None, config  # older verl: (token_level_rewards, response_mask, gamma)
    if gamma is None:
        if config is None:
            raise TypeError("compute_reinforce_plus_plus_outcome_advantage: pass gamma= (or config with .gamma)")
        gamma = config["gamma"] if isinstance(config, dict) else config.gamma
    gamma = per_sequence("compute_reinforce_plus_plus_outcome_advantage", "gamma", gamma, r.shape[0], r)
    plan = _plan(plan, r, "reinforce_pp")
    if use_kernels(r.device):
        from . import _kernels

        G, ret, parts = _kernels.reinforce_pp(r, m, gamma, plan)
        stats = _combined(parts, process_group)
        adv, count = _kernels.whiten(G, stats, True, out_dtype=r.dtype, mask=m)
        _check_count(count, 2, check)
        return adv, ret
    acc = _acc_dtype(r.dtype)
    m = _bool_mask(m)
    G = _torch.reinforce_pp_returns(r, m, column(gamma, acc))
    adv = _whiten_local(G, m, process_group, r.dtype, check)
    return torch.where(m, adv, 0).to(r.dtype), G.to(r.dtype)


# ---------------------------------------------------------------------------------------------- groups


def group_ids(index, b: int, device: torch.device):
    """Maps ``index`` to ``(ids, n_groups)``: ``ids`` an integer tensor of length ``b`` on ``device``.

    An integer tensor is used as it is (``n_groups`` None: not known without a host sync). Anything else
    (a list, tuple or NumPy array of hashable ids such as strings, as verl passes them) is mapped once on the
    host to dense ids ``0 .. n_groups-1`` in order of first appearance."""
    if isinstance(index, torch.Tensor):
        if index.dim() != 1 or index.shape[0] != b:
            raise ValueError(f"index must have length B = {b} (one id per sequence), got shape {tuple(index.shape)}")
        if index.is_floating_point() or index.is_complex():
            raise TypeError(f"index must be an integer tensor (or a sequence of hashable ids), got {index.dtype}")
        return index.to(device=device, dtype=torch.int64), None
    if isinstance(index, np.ndarray):
        if index.ndim != 1 or index.shape[0] != b:
            raise ValueError(f"index must have length B = {b} (one id per sequence), got shape {index.shape}")
        if index.dtype.kind in "iub":
            _, dense = np.unique(index, return_inverse=True)
            return torch.from_numpy(dense.astype(np.int64).reshape(-1)).to(device), int(dense.max(initial=-1)) + 1
        index = index.tolist()
    if not isinstance(index, Sequence) or isinstance(index, (str, bytes)):
        raise TypeError(f"index must be an integer tensor, a NumPy array or a sequence of ids, got {type(index)}")
    if len(index) != b:
        raise ValueError(f"index must have length B = {b} (one id per sequence), got {len(index)}")
    table: dict = {}
    dense = [table.setdefault(k, len(table)) for k in index]
    return torch.tensor(dense, dtype=torch.int64).to(device), len(table)


def _outcome(kind, token_level_rewards, response_mask, index, epsilon):
    r, m = _token_inputs(token_level_rewards, response_mask)
    b = r.shape[0]
    ids, n_groups = group_ids(index, b, r.device)
    if use_kernels(r.device):
        from . import _kernels

        adv = _kernels.outcome(r, m, ids, kind, float(epsilon))
        return adv, adv
    acc = _acc_dtype(r.dtype)
    scores = r.to(acc).sum(dim=-1)
    if n_groups is None:
        _, dense = torch.unique(ids, return_inverse=True)  # CPU tensors: no device to sync with
        n_groups = int(dense.max()) + 1 if b else 0
        ids = dense
    a = _torch.group_advantage(scores, ids, n_groups, kind, float(epsilon))
    adv = torch.where(_bool_mask(m), a.unsqueeze(-1), 0).to(r.dtype)
    return adv, adv


def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's outcome advantage: each sequence's score ``s_i = Σ_t r_{i,t}`` against its group's
    (sequences with the same ``index``)::

        â_i = (s_i − μ_g) / (σ_g + ε)      (norm_adv_by_std_in_grpo, GRPO)
        â_i =  s_i − μ_g                   (otherwise, Dr. GRPO)
        adv_{i,t} = â_i·m_{i,t}

    μ_g, σ_g: mean and unbiased std over the group; a group of one has μ = 0, σ = 1.
    ``index``: length B, an integer tensor (no host sync on CUDA) or a list / NumPy array of hashable ids.
    ``config`` is accepted for verl's signature and unused. Returns ``(adv, adv)``.
    """
    kind = "grpo" if norm_adv_by_std_in_grpo else "drgrpo"
    return _outcome(kind, token_level_rewards, response_mask, index, epsilon)


def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO's outcome advantage: a sequence's score against the mean of the other sequences of its group,
    ``â_i = n/(n − 1)·(s_i − μ_g)`` for a group of ``n > 1``, ``â_i = s_i`` for a group of one;
    ``adv_{i,t} = â_i·m_{i,t}``. ``epsilon``, ``config`` and other keywords are accepted for verl's signature
    and unused. Returns ``(adv, adv)``."""
    return _outcome("rloo", token_level_rewards, response_mask, index, epsilon)
