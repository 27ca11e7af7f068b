"""PyTorch baselines written for the benchmark: eager loops over time and vectorised scans for
``torch.compile``. Each computes exactly the math of the rl_triton call it is compared with (the
"primary" call of :mod:`benchmarks.specs`), and the suite checks that against the float64
reference before timing it.

* Eager loops (:data:`EAGER`): the pattern most RL code uses -- a Python ``for`` loop over time
  with tensor ops across envs, on time-major ``(T, N)`` buffers (CleanRL's layout, so every
  per-step slice is contiguous), computing in the input dtype as user code does.
* Scans for ``torch.compile`` (:data:`BODIES` x :data:`SCANS`): every function is written as a
  vectorised prologue -> first-order linear scan ``x_t = a_t x_{t-+1} + b_t`` -> epilogue on
  ``(N, T)`` rows, in float32 for 16-bit inputs. The scan is pluggable:

  - ``assoc``: ``torch._higher_order_ops.associative_scan`` over whole rows with the combine
    ``(a_l, b_l), (a_r, b_r) -> (a_r a_l, a_r b_l + b_r)``; Inductor lowers it to one Triton
    kernel with ``tl.associative_scan`` that loops over the row with a carry (one program per
    group of rows, so long rows with few envs are latency-bound, as in rl_triton today).
  - ``chunked``: the same scan within chunks of ``CHUNK`` steps (rows reshaped to ``(N T / C, C)``,
    so even one long row fills the GPU), an associative scan over the chunk aggregates, and an
    elementwise fix-up ``x = A * carry + B``: O(T) work in three passes.
  - ``doubling``: Hillis-Steele log-depth doubling with shifted slices, ``log2(T)`` elementwise
    passes (O(T log T) work); only plain torch ops, the fallback if the HOP is unavailable.

  On CPU the HOP needs ``combine_mode="generic"`` (the ``pointwise`` mode is CUDA-only), and the
  suite runs these bodies uncompiled there (``--device cpu`` is a smoke mode).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

GAMMA = 0.99
LAMBDA = 0.95
RHO_BAR = 1.0
C_BAR = 1.0
CHUNK = 256  # steps per chunk of the chunked scan

# --------------------------------------------------------------------------------------------
# eager loops over time, time-major (T, N) inputs


def eager_gae(r, v, term, last):
    """CleanRL's GAE loop: ``compute_gae(r, v, term, gamma, lambda_, last_value=last)``."""
    t_len = r.shape[0]
    nonterm = 1.0 - term.to(r.dtype)
    adv = torch.empty_like(r)
    lastgaelam = torch.zeros_like(last)
    for t in reversed(range(t_len)):
        nextvalues = last if t == t_len - 1 else v[t + 1]
        delta = r[t] + GAMMA * nextvalues * nonterm[t] - v[t]
        lastgaelam = delta + GAMMA * LAMBDA * nonterm[t] * lastgaelam
        adv[t] = lastgaelam
    return (adv,)


def eager_vtrace(lpt, lpb, v, r, term, last):
    """``compute_vtrace(lpt, lpb, v, r, term, gamma, last_value=last)`` -> (vs, advantages)."""
    t_len = r.shape[0]
    ratio = (lpt - lpb).exp()
    rho = ratio.clamp(max=RHO_BAR)
    c = ratio.clamp(max=C_BAR)
    nonterm = 1.0 - term.to(r.dtype)
    vs = torch.empty_like(v)
    acc = torch.zeros_like(last)
    for t in reversed(range(t_len)):
        v_next = last if t == t_len - 1 else v[t + 1]
        delta = rho[t] * (r[t] + GAMMA * nonterm[t] * v_next - v[t])
        acc = delta + GAMMA * c[t] * nonterm[t] * acc
        vs[t] = v[t] + acc
    q = torch.cat([vs[1:], last[None]])
    adv = rho * (r + GAMMA * nonterm * q - v)
    return vs, adv


def eager_retrace(probs, mu, q, nq, act, r, term, trunc):
    """``compute_retrace(probs, mu, q, nq, act, r, term, trunc, gamma, lambda_)`` -> (q_targets, adv)."""
    t_len = r.shape[0]
    pi = probs.gather(-1, act.unsqueeze(-1)).squeeze(-1)
    ratio = pi / mu
    c = LAMBDA * ratio.clamp(max=C_BAR)
    rho = ratio.clamp(max=RHO_BAR)
    expected = (probs * nq).sum(-1)
    nonterm = 1.0 - term.to(r.dtype)
    notdone = 1.0 - (term | trunc).to(r.dtype)
    qt = torch.empty_like(q)
    acc = torch.zeros_like(q[0])
    for t in reversed(range(t_len)):
        delta = r[t] + GAMMA * nonterm[t] * expected[t] - q[t]
        acc = delta if t == t_len - 1 else delta + GAMMA * c[t + 1] * notdone[t] * acc
        qt[t] = q[t] + acc
    boundary = trunc.clone()
    boundary[-1] = True
    x = torch.where(boundary, expected, torch.cat([qt[1:], expected[-1:]]))
    adv = rho * (r + GAMMA * nonterm * x - q)
    return qt, adv


def eager_discounted_returns(r, term):
    """``compute_discounted_returns(r, term, gamma)``."""
    nonterm = 1.0 - term.to(r.dtype)
    out = torch.empty_like(r)
    g = torch.zeros_like(r[0])
    for t in reversed(range(r.shape[0])):
        g = r[t] + GAMMA * nonterm[t] * g
        out[t] = g
    return (out,)


def eager_lambda_returns(r, nv, term):
    """``compute_lambda_returns(r, nv, term, gamma, lambda_)`` (no bootstrap values)."""
    nonterm = 1.0 - term.to(r.dtype)
    out = torch.empty_like(r)
    g = torch.zeros_like(r[0])
    for t in reversed(range(r.shape[0])):
        g = r[t] + GAMMA * nonterm[t] * ((1 - LAMBDA) * nv[t] + LAMBDA * g)
        out[t] = g
    return (out,)


def eager_eligibility_traces(g, done):
    """``compute_eligibility_traces(g, done, gamma, lambda_)``."""
    notdone = 1.0 - done.to(g.dtype)
    out = torch.empty_like(g)
    e = torch.zeros_like(g[0])
    for t in range(g.shape[0]):
        e = g[t] if t == 0 else g[t] + GAMMA * LAMBDA * notdone[t - 1] * e
        out[t] = e
    return (out,)


def eager_episodic_prefix_sum(x, done):
    """``compute_episodic_prefix_sum(x, done)`` (boundary="ends_at")."""
    notdone = 1.0 - done.to(x.dtype)
    out = torch.empty_like(x)
    s = torch.zeros_like(x[0])
    for t in range(x.shape[0]):
        s = x[t] if t == 0 else x[t] + notdone[t - 1] * s
        out[t] = s
    return (out,)


EAGER: dict[str, Callable[..., tuple]] = {
    "compute_gae": eager_gae,
    "compute_vtrace": eager_vtrace,
    "compute_retrace": eager_retrace,
    "compute_discounted_returns": eager_discounted_returns,
    "compute_lambda_returns": eager_lambda_returns,
    "compute_eligibility_traces": eager_eligibility_traces,
    "compute_episodic_prefix_sum": eager_episodic_prefix_sum,
}


def time_major(x: torch.Tensor) -> torch.Tensor:
    """(N, T[, A]) -> contiguous (T, N[, A]); per-env (N,) tensors are returned as they are."""
    return x if x.ndim < 2 else x.transpose(0, 1).contiguous()


def rows_from_time_major(x: torch.Tensor) -> torch.Tensor:
    return x.transpose(0, 1)


# --------------------------------------------------------------------------------------------
# scans on (N, T) rows


def _combine(left, right):
    """Composition of x -> a_l x + b_l (applied first) with x -> a_r x + b_r."""
    a_l, b_l = left
    a_r, b_r = right
    return a_r * a_l, a_r * b_l + b_r


def _hop(a, b, reverse: bool, mode: str):
    from torch._higher_order_ops.associative_scan import associative_scan

    return associative_scan(_combine, (a, b), dim=1, reverse=reverse, combine_mode=mode)


def scan_assoc(a, b, reverse: bool, mode: str = "pointwise"):
    """x over whole rows with one associative scan (init x = 0 outside the row)."""
    return _hop(a, b, reverse, mode)[1]


def scan_chunked(a, b, reverse: bool, mode: str = "pointwise", chunk: int = CHUNK):
    """Associative scan within chunks, over the chunk aggregates, then an elementwise fix-up."""
    n, t_len = b.shape
    if t_len <= chunk:
        return scan_assoc(a, b, reverse, mode)
    pad = (-t_len) % chunk
    if pad:  # identity steps (a = 1, b = 0) after the end: they carry the zero init unchanged
        a = F.pad(a, (0, pad), value=1.0)
        b = F.pad(b, (0, pad))
    k = (t_len + pad) // chunk
    big_a, big_b = _hop(a.reshape(n * k, chunk), b.reshape(n * k, chunk), reverse, mode)
    big_a = big_a.reshape(n, k, chunk)
    big_b = big_b.reshape(n, k, chunk)
    edge = 0 if reverse else -1  # the slot holding the whole chunk's composition
    _, x_edge = _hop(big_a[:, :, edge], big_b[:, :, edge], reverse, mode)
    # state entering each chunk: x at the start of the next chunk (reverse) / end of the previous one
    carry = F.pad(x_edge[:, 1:], (0, 1)) if reverse else F.pad(x_edge[:, :-1], (1, 0))
    x = big_a * carry.unsqueeze(-1) + big_b
    return x.reshape(n, k * chunk)[:, :t_len]


def scan_doubling(a, b, reverse: bool, mode: str = "pointwise"):
    """Hillis-Steele doubling: after the pass with stride k, (a_t, b_t) composes 2k steps."""
    t_len = b.shape[1]
    k = 1
    while k < t_len:
        if reverse:
            a_s = F.pad(a[:, k:], (0, k), value=1.0)
            b_s = F.pad(b[:, k:], (0, k))
        else:
            a_s = F.pad(a[:, :-k], (k, 0), value=1.0)
            b_s = F.pad(b[:, :-k], (k, 0))
        b = a * b_s + b
        a = a * a_s
        k *= 2
    return b


def scan_cumprod(a, b, reverse: bool, mode: str = "pointwise"):
    """The closed form ``x = P * cumsum(b / P)`` with ``P = cumprod(a)``. WRONG in floating point:
    ``P`` underflows to 0 within a few thousand steps (0.94^1500 < 1e-38) and is exactly 0 after
    every episode end (a = 0), so ``b / P`` is inf and x NaN. Opt-in only (``--compile-variants
    cumprod``), to show that the float64 check reports such a baseline as incorrect."""
    if reverse:
        a, b = a.flip(1), b.flip(1)
    p = torch.cumprod(a, 1)
    x = p * torch.cumsum(b / p, 1)
    return x.flip(1) if reverse else x


SCANS: dict[str, Callable] = {
    "assoc": scan_assoc,
    "chunked": scan_chunked,
    "doubling": scan_doubling,
    "cumprod": scan_cumprod,
}


# --------------------------------------------------------------------------------------------
# prologue -> scan -> epilogue bodies on (N, T) rows (the primary call's math)


def _acc(x: torch.Tensor) -> torch.Tensor:
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _shift_future(x: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """x[:, t + 1] with ``fill`` (N,) in the last column."""
    return torch.cat([x[:, 1:], fill.unsqueeze(1)], dim=1)


def body_gae(scan, r, v, term, last):
    out_dtype = r.dtype
    r, v, last = _acc(r), _acc(v), _acc(last)
    nonterm = (~term).to(r.dtype)
    delta = r + GAMMA * nonterm * _shift_future(v, last) - v
    return (scan(GAMMA * LAMBDA * nonterm, delta, True).to(out_dtype),)


def body_vtrace(scan, lpt, lpb, v, r, term, last):
    out_dtype = r.dtype
    lpt, lpb, v, r, last = _acc(lpt), _acc(lpb), _acc(v), _acc(r), _acc(last)
    ratio = (lpt - lpb).exp()
    rho = ratio.clamp(max=RHO_BAR)
    c = ratio.clamp(max=C_BAR)
    nonterm = (~term).to(r.dtype)
    delta = rho * (r + GAMMA * nonterm * _shift_future(v, last) - v)
    vs = v + scan(GAMMA * c * nonterm, delta, True)
    adv = rho * (r + GAMMA * nonterm * _shift_future(vs, last) - v)
    return vs.to(out_dtype), adv.to(out_dtype)


def body_retrace(scan, probs, mu, q, nq, act, r, term, trunc):
    out_dtype = r.dtype
    probs, mu, q, nq, r = _acc(probs), _acc(mu), _acc(q), _acc(nq), _acc(r)
    pi = probs.gather(-1, act.unsqueeze(-1)).squeeze(-1)
    ratio = pi / mu
    c = LAMBDA * ratio.clamp(max=C_BAR)
    rho = ratio.clamp(max=RHO_BAR)
    expected = (probs * nq).sum(-1)
    nonterm = (~term).to(r.dtype)
    notdone = (~(term | trunc)).to(r.dtype)
    c_next = _shift_future(c, torch.zeros_like(c[:, 0]))
    qt = q + scan(GAMMA * c_next * notdone, r + GAMMA * nonterm * expected - q, True)
    boundary = torch.cat([trunc[:, :-1], torch.ones_like(trunc[:, -1:])], dim=1)
    x = torch.where(boundary, expected, _shift_future(qt, expected[:, -1]))
    adv = rho * (r + GAMMA * nonterm * x - q)
    return qt.to(out_dtype), adv.to(out_dtype)


def body_discounted_returns(scan, r, term):
    out_dtype = r.dtype
    r = _acc(r)
    return (scan(GAMMA * (~term).to(r.dtype), r, True).to(out_dtype),)


def body_lambda_returns(scan, r, nv, term):
    out_dtype = r.dtype
    r, nv = _acc(r), _acc(nv)
    nonterm = (~term).to(r.dtype)
    return (scan(GAMMA * LAMBDA * nonterm, r + GAMMA * (1 - LAMBDA) * nonterm * nv, True).to(out_dtype),)


def _notdone_prev(done: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """1 - done[:, t - 1], with done[:, -1] = 0 (nothing before the first step)."""
    return F.pad((~done[:, :-1]).to(dtype), (1, 0), value=1.0)


def body_eligibility_traces(scan, g, done):
    out_dtype = g.dtype
    g = _acc(g)
    return (scan(GAMMA * LAMBDA * _notdone_prev(done, g.dtype), g, False).to(out_dtype),)


def body_episodic_prefix_sum(scan, x, done):
    out_dtype = x.dtype
    x = _acc(x)
    return (scan(_notdone_prev(done, x.dtype), x, False).to(out_dtype),)


BODIES: dict[str, Callable[..., tuple]] = {
    "compute_gae": body_gae,
    "compute_vtrace": body_vtrace,
    "compute_retrace": body_retrace,
    "compute_discounted_returns": body_discounted_returns,
    "compute_lambda_returns": body_lambda_returns,
    "compute_eligibility_traces": body_eligibility_traces,
    "compute_episodic_prefix_sum": body_episodic_prefix_sum,
}


def make_scan_fn(function: str, variant: str, device_type: str) -> Callable[..., tuple]:
    """The uncompiled body of ``function`` with the ``variant`` scan, for tensors on ``device_type``."""
    body = BODIES[function]
    scan = SCANS[variant]
    mode = "pointwise" if device_type == "cuda" else "generic"

    def fn(*tensors):
        return body(lambda a, b, reverse: scan(a, b, reverse, mode), *tensors)

    fn.__name__ = f"{function}_{variant}"
    return fn
