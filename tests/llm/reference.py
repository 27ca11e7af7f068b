"""Float64 loop references of the token-level estimators, transcribed from their formulas (docs/llm.md).

Plain Python loops over sequences and tokens on float64 copies: slow, obviously right, only for tests.
"""

from __future__ import annotations

import math

import torch


def _f64(x):
    return x.detach().to("cpu", torch.float64)


def _valid(mask):
    return mask.detach().cpu() != 0


def moments(x, mask):
    x, m = _f64(x).reshape(-1).tolist(), _valid(mask).reshape(-1).tolist()
    vals = [xi for xi, mi in zip(x, m, strict=True) if mi]
    n = len(vals)
    mean = sum(vals) / n if n else math.nan
    m2 = sum((v - mean) ** 2 for v in vals) if n else math.nan
    return n, mean, m2


def masked_mean(x, mask):
    n, mean, _ = moments(x, mask)
    return mean if n else 0.0  # verl divides by n + 1e-8: an empty mask gives 0


def masked_var(x, mask, unbiased=True):
    n, _, m2 = moments(x, mask)
    if not n:
        return 0.0  # biased only: the unbiased variance of an empty mask raises
    return m2 / (n - 1) if unbiased else m2 / n


def masked_whiten(x, mask, shift_mean=True):
    n, mean, m2 = moments(x, mask)
    var = m2 / (n - 1)
    out = (_f64(x) - mean) / math.sqrt(var + 1e-8)
    return out if shift_mean else out + mean


def _per_row(h, b):
    if isinstance(h, torch.Tensor):
        h = _f64(h.reshape(-1)).tolist()
        return h * b if len(h) == 1 else h
    return [float(h)] * b


def gae(r, v, mask, gamma, lam):
    """(advantages, returns, L): the masked GAE recursion, one token at a time."""
    r64, v64 = _f64(r), _f64(v)
    rl, vl, ml = r64.tolist(), v64.tolist(), _valid(mask).tolist()
    b, t_len = r64.shape
    g, l = _per_row(gamma, b), _per_row(lam, b)
    rows = []
    for i in range(b):
        nv, run = 0.0, 0.0
        row = [0.0] * t_len
        for t in reversed(range(t_len)):
            if ml[i][t]:
                delta = rl[i][t] + g[i] * nv - vl[i][t]
                run = delta + g[i] * l[i] * run
                nv = vl[i][t]
            row[t] = run
        rows.append(row)
    L = torch.tensor(rows, dtype=torch.float64).reshape(b, t_len)
    return masked_whiten(L, mask), L + v64, L


def reinforce_pp(r, mask, gamma):
    r64 = _f64(r)
    rl, ml = r64.tolist(), _valid(mask).tolist()
    b, t_len = r64.shape
    g = _per_row(gamma, b)
    rows = []
    for i in range(b):
        run = 0.0
        row = [0.0] * t_len
        for t in reversed(range(t_len)):
            if ml[i][t]:  # a masked token keeps the running return and has return 0
                run = rl[i][t] + g[i] * run
                row[t] = run
        rows.append(row)
    G = torch.tensor(rows, dtype=torch.float64).reshape(b, t_len)
    return masked_whiten(G, mask) * _valid(mask), G


def outcome(kind, r, mask, index, epsilon=1e-6):
    """GRPO ("grpo"), Dr. GRPO ("drgrpo") or RLOO ("rloo") advantages (B, T) from the group formulas."""
    r, m = _f64(r), _valid(mask)
    ids = index.tolist() if isinstance(index, torch.Tensor) else list(index)
    scores = r.sum(dim=-1).tolist()
    groups: dict = {}
    for i, k in enumerate(ids):
        groups.setdefault(k, []).append(scores[i])
    a = []
    for i, k in enumerate(ids):
        s, grp = scores[i], groups[k]
        n = len(grp)
        mean = sum(grp) / n
        if kind == "rloo":
            a.append(s if n == 1 else n / (n - 1) * (s - mean))
            continue
        mu = 0.0 if n == 1 else mean
        sd = 1.0 if n == 1 else math.sqrt(sum((x - mean) ** 2 for x in grp) / (n - 1))
        a.append((s - mu) / (sd + epsilon) if kind == "grpo" else s - mu)
    return torch.tensor(a, dtype=torch.float64).unsqueeze(-1) * m
