"""Triton helpers several algorithms of :mod:`rl_triton.ops` share: the per-step flags and bootstrap values
(:func:`step_context`), the next value (:func:`next_value`), a per-step discount (:func:`discount`) and the two
epilogue stores (:func:`store_with_value`, :func:`store_off_policy`).

Each algorithm is a prologue, an epilogue and a kernel that hands them to :func:`rl_triton.kernels.core.scan_rows`
(the interfaces are in its docstring and in docs/design.md, "Adding an estimator"). Containment
(docs/semantics.md): what a zero flag factor multiplies is selected to 0 before it enters the arithmetic, and so
is what the epilogues read there; the scan itself selects at zero coefficients (kernels/core.py), which needs
finite coefficients.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ..kernels import core


@triton.jit
def step_context(
    p_term, p_trunc, p_boot, p_last, off, o_n, o_t, m, m_n, T,
    HAS_TRUNC: tl.constexpr, HAS_BOOT: tl.constexpr, HAS_LAST: tl.constexpr, ACC: tl.constexpr,
):  # fmt: skip
    """Per-step flags as booleans (the kernels select on them, or take them as 0/1 in ACC): term,
    trunc, boundary = trunc OR last step; and boot_t (read only at boundary steps, so interior
    bootstrap entries cost no bandwidth)."""
    q_term = core.flag_set(p_term, off, m)
    if HAS_TRUNC:
        q_trunc = core.flag_set(p_trunc, off, m)
    else:
        q_trunc = tl.zeros(q_term.shape, tl.int1)
    b_is_last = o_t == T - 1
    q_bnd = b_is_last | q_trunc
    b_boot = tl.zeros(q_term.shape, ACC)
    if HAS_BOOT:
        b_boot = tl.load(p_boot + off, mask=m & q_bnd, other=0).to(ACC)
    if HAS_LAST:
        b_lv = tl.load(p_last + o_n, mask=m_n, other=0).to(ACC)  # env-shaped ([BN, 1(, 1)])
        b_boot = tl.where(b_is_last, b_lv, b_boot)
    return q_term, q_trunc, q_bnd, b_boot


@triton.jit
def next_value(p_v, p_boot, off, m, q_bnd, b_boot, NEXT_ALL: tl.constexpr, ACC: tl.constexpr, ST=1):
    """v_next_t: boot_t at boundary steps (q_bnd), values_{t+1} elsewhere (ST elements further on: the
    rows' core.time_stride); with NEXT_ALL, p_boot holds V(s_{t+1}) for every step and is read everywhere."""
    if NEXT_ALL:
        return tl.load(p_boot + off, mask=m, other=0).to(ACC)
    b_v1 = tl.load(p_v + off + ST, mask=m & ~q_bnd, other=0).to(ACC)
    return tl.where(q_bnd, b_boot, b_v1)


@triton.jit
def discount(x, p, s_n, s_t, o_n, o_t, m, TENSOR: tl.constexpr, ACC: tl.constexpr):
    """gamma_t or lambda_t at the tile's slots: with TENSOR the (N, T) view's element of env n at step t, at
    p + n s_n + t s_t (a per-env tensor has s_t = 0), in ACC; else the scalar x of a float call, unchanged."""
    if TENSOR:
        x = tl.load(p + o_n.to(tl.int64) * s_n + o_t.to(tl.int64) * s_t, mask=m, other=0).to(ACC)
    return x


# Each algorithm below is a prologue, an epilogue and a kernel that hands them to core.scan_rows (the
# interfaces are in its docstring). ins/outs/hp are tuples, K a tuple of the algorithm's constexprs.


@triton.jit
def store_with_value(
    p_out, p_second, b_x, p_v, off, m, SECOND: tl.constexpr, SUBTRACT: tl.constexpr, ACC: tl.constexpr
):  # fmt: skip
    """Stores x; with SECOND also x as stored plus V(s_t) (minus it with SUBTRACT), rounded once: what
    `x + values` (`x - values`) gives on the stored x (GAE's value targets, the returns' advantages)."""
    tl.store(p_out + off, b_x, mask=m)
    if SECOND:
        b_x = b_x.to(p_out.dtype.element_ty).to(ACC)
        b_v = tl.load(p_v + off, mask=m, other=0).to(ACC)
        if SUBTRACT:
            tl.store(p_second + off, b_x - b_v, mask=m)
        else:
            tl.store(p_second + off, b_x + b_v, mask=m)


@triton.jit
def store_off_policy(p_t, p_adv, ctx, b_d, b_x1, b_d1, off, m):
    """V-trace's and Retrace's outputs from the prologue's ctx (rho, r, x = v or q, boundary, end, gamma):
    the targets x_t + D_t and the advantages rho (r + gamma X_t - x_t), X_t the end value at boundary
    (and terminated: 0) steps, x_{t+1} + D_{t+1} (the next step's target) elsewhere."""
    b_rho, b_r, b_x, q_bnd, b_end, gamma = ctx  # gamma: the scalar, or gamma_t at the slots
    b_xt = tl.where(q_bnd, b_end, b_x1 + b_d1)
    tl.store(p_t + off, b_x + b_d, mask=m)
    tl.store(p_adv + off, b_rho * (b_r + gamma * b_xt - b_x), mask=m)
