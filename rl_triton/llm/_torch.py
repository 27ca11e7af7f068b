"""The PyTorch path of :mod:`rl_triton.llm`: the same algorithms as the kernels, in tensor ops.

The recurrences run as log-depth (Hillis-Steele) scans of their affine maps: ``ceil(log2 T)`` rounds of
elementwise ops over the whole ``(B, T)`` tile instead of a Python loop over ``T``. They compute the same maps
as the loop, grouped differently, so results agree with it to rounding. Not :func:`rl_triton.scan.torch_scan`:
that one reads a finiteness test on the host between its passes, which ``torch.compile(fullgraph=True)`` of these
functions cannot trace, and it has no map of GAE's two-value state (nor this path's flush of subnormal products).

Every function takes validated inputs (``functional.py``): ``m`` is a bool mask, ``gamma`` / ``lam`` are Python
floats or ``(B, 1)`` tensors in the accumulation dtype.
"""

from __future__ import annotations

import torch

from ..distributed import _acc_dtype as acc_dtype

# ---------------------------------------------------------------------------------------------- whitening


def whiten_apply(x: torch.Tensor, mean: torch.Tensor, var: torch.Tensor, shift_mean: bool) -> torch.Tensor:
    acc = acc_dtype(x.dtype)
    out = (x.to(acc) - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        out = out + mean
    return out.to(x.dtype)


# ---------------------------------------------------------------------------------------------- scans


def _shift_back(x: torch.Tensor, s: int, fill: float) -> torch.Tensor:
    """x[:, t + s], ``fill`` past the end."""
    if s >= x.shape[-1]:
        return torch.full_like(x, fill)
    return torch.cat([x[:, s:], x.new_full((x.shape[0], s), fill)], dim=1)


def _flush(x: torch.Tensor) -> torch.Tensor:
    # Products of discounts over long spans underflow; subnormal operands make CPU arithmetic many times slower,
    # and a coefficient below the smallest normal number changes no result at this precision.
    return torch.where(x.abs() < torch.finfo(x.dtype).tiny, 0.0, x)


def gae_scan(r, v, m, gamma, lam) -> torch.Tensor:
    """L of the masked GAE recursion (docs/llm.md), in the accumulation dtype.

    Step t, going backwards, maps the state (L, nv) after it to
        valid token:  (γλ·L + γ·nv + r_t − V_t,  V_t)
        masked token: (L, nv)
    i.e. ``L' = p L + q nv + b1``, ``nv' = rr nv + b2``. Composing two such maps gives one of the same form,
    so an inclusive reverse scan of the maps, applied to the zero state (L_T = nv_T = 0), gives every L_t."""
    acc = acc_dtype(r.dtype)
    r, v = r.to(acc), v.to(acc)
    one, zero = torch.ones((), dtype=acc), torch.zeros((), dtype=acc)
    p = torch.where(m, gamma * lam * torch.ones_like(r), one)
    q = torch.where(m, gamma * torch.ones_like(r), zero)
    rr = torch.where(m, zero, one)
    b1 = torch.where(m, r - v, zero)
    b2 = torch.where(m, v, zero)
    s = 1
    t_len = r.shape[-1]
    while s < t_len:
        # the maps covering [t+s, t+2s) run first (they are later in time), then [t, t+s)
        pf, qf, rf, b1f, b2f = (_shift_back(x, s, f) for x, f in ((p, 1.0), (q, 0.0), (rr, 1.0), (b1, 0.0), (b2, 0.0)))
        p, q, rr, b1, b2 = (p * pf, p * qf + q * rf, rr * rf, p * b1f + q * b2f + b1, rr * b2f + b2)
        p, q = _flush(p), _flush(q)
        s *= 2
    return b1


def linear_scan_reverse(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x_t = a_t x_{t+1} + b_t, x_T = 0 (a log-depth scan; where a_t == 0 the state after is not read)."""
    s = 1
    t_len = a.shape[-1]
    while s < t_len:
        af, bf = _shift_back(a, s, 1.0), _shift_back(b, s, 0.0)
        b = torch.where(a == 0, b, a * bf + b)
        a = _flush(a * af)
        s *= 2
    return b


def reinforce_pp_returns(r, m, gamma) -> torch.Tensor:
    """REINFORCE++'s returns in the accumulation dtype: going backwards from ``G_T = 0``, a valid token maps the
    running return to ``r_t + γ G``, a masked one passes it across unchanged; returns are 0 at masked tokens."""
    acc = acc_dtype(r.dtype)
    a = torch.where(m, gamma * torch.ones(r.shape, dtype=acc, device=r.device), 1.0)
    G = linear_scan_reverse(a, torch.where(m, r.to(acc), 0.0))
    return torch.where(m, G, 0.0)


# ---------------------------------------------------------------------------------------------- groups


def group_advantage(scores: torch.Tensor, gid: torch.Tensor, n_groups: int, kind: str, epsilon: float):
    """Per-sequence outcome advantage from the scores (B,) and dense group ids (B,) in [0, n_groups).
    kind: "grpo" (normalised by the group's std), "drgrpo" (mean only) or "rloo"."""
    acc = scores.dtype
    counts = torch.zeros(n_groups, dtype=acc, device=scores.device).index_add_(0, gid, torch.ones_like(scores))
    sums = torch.zeros(n_groups, dtype=acc, device=scores.device).index_add_(0, gid, scores)
    mean = (sums / counts)[gid]
    n = counts[gid]
    single = n == 1
    if kind == "rloo":
        return torch.where(single, scores, n / (n - 1).clamp(min=1) * (scores - mean))
    centred = torch.where(single, scores, scores - mean)
    if kind == "drgrpo":
        return centred
    sq = torch.zeros(n_groups, dtype=acc, device=scores.device).index_add_(0, gid, (scores - mean).square())
    std = torch.sqrt(sq[gid] / (n - 1).clamp(min=1))
    return centred / (torch.where(single, 1.0, std) + epsilon)
