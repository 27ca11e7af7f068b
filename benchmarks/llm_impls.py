"""PyTorch baselines of the token-level estimators (``rl_triton.llm``), written for the benchmark from the
published formulas (verl's advantage estimators; docs/llm.md). Each computes exactly what the paired
rl_triton call computes, and the suite checks it against the float64 reference before timing it.

* Loops (:data:`LOOPS`): the shape of the code LLM-RL trainers run. Masked GAE and REINFORCE++ walk the
  token positions backwards with a handful of ``(B,)`` tensor ops per position (TRL's PPO trainer has the
  same GAE loop, without interior masks); GRPO and RLOO walk the sequences in Python to collect each
  group's scores in a dict of lists (keys: verl's per-prompt uid strings), then walk them again to write
  each sequence's advantage. Whitening as verl's ``masked_whiten``: ``Σ x·m / (Σ m + 1e-8)``, the
  unbiased variance with its two host-side count checks.
* Vectorised (:data:`VECTORISED`): no Python loop over positions or sequences.

  - Masked GAE: the valid tokens of each row are compacted to the front (a scatter by their exclusive
    count), where the recursion is a plain discounted suffix sum with the constant factor γλ and the next
    value is the next compacted value; the result is gathered back (a masked token takes the value of the
    next valid one, which is what carrying ``L`` across it means).
  - REINFORCE++ (verl 0.9: the running return passes across masked tokens): the same compaction, then the
    discounted suffix sum (factor γ) of the compacted rewards, gathered back to the valid tokens; 0 elsewhere.
  - The discounted suffix sum ``y_t = Σ_{s≥t} g^(s−t) x_s`` is a matmul per chunk of ``CHUNK`` positions
    with the upper-triangular Toeplitz matrix ``g^(s−t)``, plus the suffix sum of the chunks' first
    entries with the factor ``g^CHUNK`` (the same routine, one level up) applied back elementwise. No
    division and no cumulative product, so it is exact for every g in [0, 1] (powers that underflow only
    drop contributions below float precision).
  - GRPO / RLOO: per-group counts, sums and squared deviations with ``index_add_`` over dense group ids
    ``0 .. G-1`` (G known to the caller, so no host sync), gathered back per sequence.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import torch
import torch.nn.functional as F

CHUNK = 64  # positions per matmul chunk of the discounted suffix sum
WHITEN_EPS = 1e-8  # var + 1e-8 under the rsqrt, as verl
MEAN_EPS = 1e-8  # verl's masked_mean divides by (Σ m + 1e-8)


def _acc(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


# --------------------------------------------------------------------------------------------
# loops (verl's formulas, as trainers run them)


def _loop_masked_mean(x, mask):
    return (x * mask).sum() / (mask.sum() + MEAN_EPS)


def _loop_masked_whiten(x, mask):
    mean = _loop_masked_mean(x, mask)
    var = _loop_masked_mean((x - mean) ** 2, mask)
    count = mask.sum()
    if count == 0:  # both checks read the count on the host, as verl's do
        raise ValueError("no valid token")
    if count == 1:
        raise ValueError("a single valid token: the unbiased variance is undefined")
    var = var * (count / (count - 1))
    return (x - mean) * torch.rsqrt(var + WHITEN_EPS)


@torch.no_grad()
def loop_gae(token_level_rewards, values, response_mask, gamma, lam):
    """Masked GAE, one token position at a time from the end: a masked position passes the next value and
    the running advantage through unchanged. ``response_mask`` numeric (``1 - mask`` is undefined for bool)."""
    next_v = 0.0
    run = 0.0
    per_step = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * next_v - values[:, t]
        updated = delta + gamma * lam * run
        next_v = values[:, t] * response_mask[:, t] + (1 - response_mask[:, t]) * next_v
        run = updated * response_mask[:, t] + (1 - response_mask[:, t]) * run
        per_step.append(run)
    adv = torch.stack(per_step[::-1], dim=1)
    returns = adv + values
    return _loop_masked_whiten(adv, response_mask), returns


@torch.no_grad()
def loop_reinforce_pp(token_level_rewards, response_mask, gamma):
    """REINFORCE++ returns, one position at a time from the end; a masked position keeps the running return
    (it passes across) and has return 0."""
    returns = torch.zeros_like(token_level_rewards)
    run = 0.0
    for t in reversed(range(token_level_rewards.shape[1])):
        new = token_level_rewards[:, t] + gamma * run
        returns[:, t] = new * response_mask[:, t]
        run = new * response_mask[:, t] + run * (1 - response_mask[:, t])
    adv = _loop_masked_whiten(returns, response_mask) * response_mask
    return adv, returns


@torch.no_grad()
def loop_grpo(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """GRPO: the scores of each group gathered in Python lists (``index``: verl's per-prompt uid strings),
    mean and unbiased std per group (0 and 1 for a group of one), then each sequence normalised in turn."""
    scores = token_level_rewards.sum(dim=-1)
    by_group = defaultdict(list)
    for i in range(scores.shape[0]):
        by_group[index[i]].append(scores[i])
    mean, std = {}, {}
    for key, members in by_group.items():
        if len(members) == 1:
            mean[key], std[key] = torch.tensor(0.0), torch.tensor(1.0)
        else:
            stacked = torch.stack(members)
            mean[key], std[key] = torch.mean(stacked), torch.std(stacked)
    for i in range(scores.shape[0]):
        if norm_adv_by_std_in_grpo:
            scores[i] = (scores[i] - mean[index[i]]) / (std[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - mean[index[i]]
    adv = scores.unsqueeze(-1) * response_mask
    return adv, adv


@torch.no_grad()
def loop_rloo(token_level_rewards, response_mask, index, epsilon=1e-6):
    """RLOO: per-group mean from Python lists, then ``n/(n-1)·(s - mean)`` per sequence (a group of one
    keeps its score)."""
    scores = token_level_rewards.sum(dim=-1)
    by_group = defaultdict(list)
    for i in range(scores.shape[0]):
        by_group[index[i]].append(scores[i])
    mean = {}
    for key, members in by_group.items():
        mean[key] = torch.tensor(0.0) if len(members) == 1 else torch.mean(torch.stack(members))
    for i in range(scores.shape[0]):
        n = len(by_group[index[i]])
        if n > 1:
            scores[i] = scores[i] * n / (n - 1) - mean[index[i]] * n / (n - 1)
    adv = scores.unsqueeze(-1) * response_mask
    return adv, adv


LOOPS: dict[str, Callable] = {
    "compute_gae_advantage_return": loop_gae,
    "compute_reinforce_plus_plus_outcome_advantage": loop_reinforce_pp,
    "compute_grpo_outcome_advantage": loop_grpo,
    "compute_rloo_outcome_advantage": loop_rloo,
}


# --------------------------------------------------------------------------------------------
# the discounted suffix sum as chunked matmuls


def _toeplitz(n: int, g: float) -> torch.Tensor:
    """M[s, t] = g^(s - t) for s >= t, else 0 (float64), so that ``(x @ M)_t = Σ_{s≥t} g^(s−t) x_s``."""
    i = torch.arange(n, dtype=torch.float64)
    e = i[:, None] - i[None, :]
    return torch.where(e >= 0, torch.pow(g, e.clamp(min=0)), 0.0)


class SuffixSum:
    """``y_t = Σ_{s≥t} g^(s−t) x_s`` over the last dim of ``(B, n)`` tensors, for one n and g.

    Level by level: rows padded to whole chunks of ``chunk`` positions, one matmul per chunk gives the
    within-chunk sums; the values entering each chunk from the right are the suffix sum (factor
    ``g^chunk``) of the chunks' first entries, the next level; ``y = inner + g^(chunk−i)·carry``."""

    def __init__(self, n: int, g: float, device, dtype=torch.float32, chunk: int = CHUNK):
        self.levels = []
        g = float(g)
        while n > chunk:
            k = -(-n // chunk)
            tail = torch.pow(g, torch.arange(chunk, 0, -1, dtype=torch.float64))  # g^(chunk - i)
            self.levels.append((n, k, _toeplitz(chunk, g).to(device, dtype), tail.to(device, dtype)))
            n, g = k, g**chunk
        self.levels.append((n, 1, _toeplitz(n, g).to(device, dtype), None))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._level(x, 0)

    def _level(self, x: torch.Tensor, i: int) -> torch.Tensor:
        n, k, mat, tail = self.levels[i]
        if tail is None:
            return x @ mat
        b, c = x.shape[0], mat.shape[0]
        if k * c != n:
            x = F.pad(x, (0, k * c - n))
        inner = x.reshape(b, k, c) @ mat
        starts = self._level(inner[:, :, 0], i + 1)  # the full sums at each chunk's first position
        carry = F.pad(starts[:, 1:], (0, 1))  # what enters each chunk from the one after it
        return (inner + tail * carry.unsqueeze(-1)).reshape(b, k * c)[:, :n]


# --------------------------------------------------------------------------------------------
# vectorised estimators


def _whiten(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """(x − μ)·rsqrt(σ² + 1e-8) over the entries where ``m`` (unbiased σ², two passes, no host sync)."""
    mf = m.to(x.dtype)
    count = mf.sum()
    mean = (x * mf).sum() / count
    var = ((x - mean).square() * mf).sum() / (count - 1)
    return (x - mean) * torch.rsqrt(var + WHITEN_EPS)


def _compactor(m: torch.Tensor):
    """For a bool mask (B, T): (``before``, the number of valid tokens before each t, which is t's slot among
    the valid tokens compacted to the front, and of a masked t the slot of the next valid token; ``compact``,
    which moves the valid entries of a (B, T) tensor to their slots, zeros after them, as (B, T + 1))."""
    t_len = m.shape[1]
    before = torch.cumsum(m, 1) - m.to(torch.int64)
    slot = torch.where(m, before, t_len)  # masked tokens write zeros to the spare last slot

    def compact(x: torch.Tensor) -> torch.Tensor:
        return x.new_zeros(x.shape[0], t_len + 1).scatter_(1, slot, torch.where(m, x, 0.0))

    return before, compact


def vec_gae(token_level_rewards, values, response_mask, gamma, lam, suffix: SuffixSum):
    """Masked GAE without a loop over positions (``suffix``: a SuffixSum for n = T, g = γλ)."""
    out_dtype = token_level_rewards.dtype
    acc = _acc(out_dtype)
    r, v = token_level_rewards.to(acc), values.to(acc)
    m = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    t_len = r.shape[1]
    before, compact = _compactor(m)
    r_c, v_c = compact(r), compact(v)
    delta = r_c[:, :t_len] + gamma * v_c[:, 1:] - v_c[:, :t_len]  # zero past the last valid token
    adv = suffix(delta).gather(1, before)  # a masked token takes the next valid token's value
    returns = adv + v
    return _whiten(adv, m).to(out_dtype), returns.to(out_dtype)


def vec_reinforce_pp(token_level_rewards, response_mask, gamma, suffix: SuffixSum):
    """REINFORCE++ without a loop over positions (``suffix``: a SuffixSum for n = T, g = γ)."""
    out_dtype = token_level_rewards.dtype
    acc = _acc(out_dtype)
    r = token_level_rewards.to(acc)
    m = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    before, compact = _compactor(m)
    returns = torch.where(m, suffix(compact(r)[:, : r.shape[1]]).gather(1, before), 0.0)
    adv = torch.where(m, _whiten(returns, m), 0.0)
    return adv.to(out_dtype), returns.to(out_dtype)


def _group_stats(scores, ids, num_groups):
    zeros = scores.new_zeros(num_groups)
    count = zeros.index_add(0, ids, torch.ones_like(scores))
    total = zeros.index_add(0, ids, scores)
    n = count[ids]
    return n, (total / count)[ids]


def vec_outcome(kind: str, token_level_rewards, response_mask, ids, num_groups: int, epsilon: float = 1e-6):
    """GRPO (``kind="grpo"``), Dr. GRPO (``"drgrpo"``) or RLOO (``"rloo"``) with ``index_add`` group
    statistics over dense ids ``0 .. num_groups-1``."""
    out_dtype = token_level_rewards.dtype
    scores = token_level_rewards.to(_acc(out_dtype)).sum(-1)
    n, mean = _group_stats(scores, ids, num_groups)
    dev = scores - mean
    single = n == 1
    if kind == "rloo":
        a = torch.where(single, scores, n / (n - 1) * dev)
    else:
        centred = torch.where(single, scores, dev)
        if kind == "drgrpo":
            a = centred
        else:
            sq = scores.new_zeros(num_groups).index_add(0, ids, dev.square())[ids]
            std = torch.where(single, 1.0, torch.sqrt(sq / (n - 1)))
            a = centred / (std + epsilon)
    adv = (a.unsqueeze(-1) * response_mask).to(out_dtype)
    return adv, adv


VECTORISED = ("compute_gae_advantage_return", "compute_reinforce_plus_plus_outcome_advantage",
              "compute_grpo_outcome_advantage", "compute_rloo_outcome_advantage")  # fmt: skip


def make_vectorised(
    function: str,
    t_len: int,
    device,
    dtype,
    *,
    gamma: float,
    lam: float = 1.0,
    num_groups: int = 0,
    epsilon: float = 1e-6,
    chunk: int = CHUNK,
) -> Callable:
    """The vectorised estimator ``function`` for rows of ``t_len`` positions, its constants (Toeplitz
    matrices, group count) bound: ``fn(r, v, mask)`` for GAE, ``fn(r, mask)`` for REINFORCE++,
    ``fn(r, mask, ids)`` for GRPO / RLOO."""  # fmt: skip
    acc = _acc(dtype)
    if function == "compute_gae_advantage_return":
        suffix = SuffixSum(t_len, gamma * lam, device, acc, chunk)

        def fn(r, v, mask):
            return vec_gae(r, v, mask, gamma, lam, suffix)
    elif function == "compute_reinforce_plus_plus_outcome_advantage":
        suffix = SuffixSum(t_len, gamma, device, acc, chunk)

        def fn(r, mask):
            return vec_reinforce_pp(r, mask, gamma, suffix)
    elif function == "compute_grpo_outcome_advantage":

        def fn(r, mask, ids):
            return vec_outcome("grpo", r, mask, ids, num_groups, epsilon)
    elif function == "compute_rloo_outcome_advantage":

        def fn(r, mask, ids):
            return vec_outcome("rloo", r, mask, ids, num_groups, epsilon)
    else:
        raise KeyError(function)
    fn.__name__ = f"{function}_vectorised"
    return fn
