"""Fused kernels: per-algorithm prologues and epilogues around the shared scan driver.

Each kernel reads every input once and writes every output once: :func:`core.scan_rows` walks the
chunks of the program's rows, the algorithm's prologue computes the coefficients ``a_t``, ``b_t`` of
the recurrence in registers from the loaded inputs, the chunk is scanned, and its epilogue forms and
stores the outputs. Nothing intermediate goes to device memory. A kernel only rebuilds its
hyper-parameters and hands its pointers, prologue and epilogue to the driver.

V-trace and Retrace need ``x_{t+1}`` in their epilogue (``vs_{t+1}``, ``q_targets_{t+1}``). There is
no register shift across a tile, so those kernels scan (inclusive, exclusive) pairs of maps
(:func:`core.scan_chunk_next`), which gives ``x_t`` and ``x_{t+1}`` at slot ``t`` from one prologue.

``N`` and the hyper-parameters are not specialised on, so a gamma schedule or a new number of envs
does not recompile. A per-env or per-step gamma or lambda_ (docs/semantics.md) comes as a pointer and the
strides of its (N, T) view, read at each slot by :func:`discount`, so new values do not recompile either; a
constexpr per discount (G_TENSOR, L_TENSOR) says which, so a float call compiles to the code it had before
tensors were taken. ``T`` is specialised the way Triton does by default (``T == 1``, ``T % 16 == 0``):
a row length that is a multiple of 16 makes every row 16-byte aligned, which Triton must know to
vectorise the loads; without it the kernels ran at half the speed (docs/performance.md).
So a size class is a power-of-two bucket of ``T`` plus whether ``T`` is a multiple of 16.
Retrace's number of actions is a constexpr (its tiles have an action axis), so each action count
compiles once. The 2-byte dtypes compile their own variants (groups of 8 steps, kernels/core.py).

Containment (docs/semantics.md): what a zero flag factor multiplies is selected to 0 before it enters the
arithmetic (v_next_t and E_t at terminated steps, c at done steps, the next values at truncations),
and so is what the epilogues read there (q_t, X_t); the scan itself selects at zero coefficients
(kernels/core.py), which needs finite coefficients: c_t = min(c_bar, ratio) takes c_bar for a NaN
ratio.
"""

from __future__ import annotations

import triton
import triton.language as tl

from . import core
from .core import ENV_GROUPS, PLAIN, hp_scalar


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
def gae_scalars(hp, ACC: tl.constexpr):
    """(gamma, gamma lambda, lambda): the last for a tensor gamma or lambda_ (unused, so dropped, otherwise)."""
    gamma = hp_scalar(hp[0], hp[1], ACC)
    lmbda = hp_scalar(hp[2], hp[3], ACC)
    return gamma, gamma * lmbda, lmbda


@triton.jit
def gae_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """GAE: a_t = gamma_t lambda_t (0 at done steps), b_t = delta_t."""
    HAS_TRUNC: tl.constexpr = K[0]
    HAS_BOOT: tl.constexpr = K[1]
    HAS_LAST: tl.constexpr = K[2]
    NEXT_ALL: tl.constexpr = K[3]
    G_TENSOR: tl.constexpr = K[5]
    L_TENSOR: tl.constexpr = K[6]
    p_r, p_v, p_term, p_trunc, p_boot, p_last, p_g, g_sn, g_st, p_l, l_sn, l_st = ins
    gamma, gl, lmbda = hps
    if G_TENSOR or L_TENSOR:
        gamma = discount(gamma, p_g, g_sn, g_st, o_n, o_t, m, G_TENSOR, ACC)
        gl = gamma * discount(lmbda, p_l, l_sn, l_st, o_n, o_t, m, L_TENSOR, ACC)
    q_term, q_trunc, q_bnd, b_boot = step_context(
        p_term, p_trunc, p_boot, p_last, off, o_n, o_t, m, m_n, T, HAS_TRUNC, HAS_BOOT, HAS_LAST, ACC
    )
    b_r = tl.load(p_r + off, mask=m, other=0).to(ACC)
    b_v = tl.load(p_v + off, mask=m, other=0).to(ACC)
    # v_next_t is not read at terminated steps: 0 there, which also stands for the factor (1 - term_t)
    b_vnext = tl.where(q_term, 0.0, next_value(p_v, p_boot, off, m, q_bnd, b_boot, NEXT_ALL, ACC, ST))
    b_delta = b_r + gamma * b_vnext - b_v
    b_a = tl.where(m, tl.where(q_term | q_trunc, 0.0, gl), 1.0)
    b_b = tl.where(m, b_delta, 0.0)
    return b_a, b_b, ()


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
def gae_epilogue(outs, ins, hps, ctx, b_x, b_xn, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    store_with_value(outs[0], outs[1], b_x, ins[1], off, m, K[4], False, ACC)  # K[4]: TARGET


@triton.jit(do_not_specialize=["N", "NK", "CPB", "gamma_hi", "gamma_lo", "lmbda_hi", "lmbda_lo"])
def gae_kernel(
    p_r,  # [N, T] rewards
    p_v,  # [N, T] values V(s_t)
    p_term,  # [N, T] terminateds (any dtype)
    p_trunc,  # [N, T] truncateds (if HAS_TRUNC)
    p_boot,  # [N, T] bootstrap values (if HAS_BOOT)
    p_last,  # [N] last value (if HAS_LAST)
    p_adv,  # [N, T] output advantages
    p_tgt,  # [N, T] output value targets A_t + V(s_t) (if TARGET)
    N, T,  # envs, steps
    # gamma and lambda: float32 hi/lo halves of a float; a tensor's (N, T) view and its strides (G_TENSOR, L_TENSOR)
    gamma_hi, gamma_lo, p_gamma, gamma_sn, gamma_st, lmbda_hi, lmbda_lo, p_lmbda, lmbda_sn, lmbda_st,
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block: aggregates, flags (core.lookback), blocks, chunks/block
    HAS_TRUNC: tl.constexpr, HAS_BOOT: tl.constexpr, HAS_LAST: tl.constexpr,
    NEXT_ALL: tl.constexpr,  # v_next_t = p_boot[t] at every step (TorchRL's ("next", value) form)
    TARGET: tl.constexpr,  # also store the value targets
    PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr,
    NKP: tl.constexpr,
    FORM: tl.constexpr,  # tile form (kernels/core.py)
    # Env-major rows of one chunk, T == BT (Plan.exact_t): the row length as a constexpr, so that Triton
    # knows every row 16-byte aligned (it specialises T on multiples of 16 only, which 4 and 8 are not)
    # and vectorises the loads; as retrace_kernel's.
    EXACT_T: tl.constexpr = False,
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV (core.row_length; plans.row_div)
    TM: tl.constexpr = 0,  # time-major rows (core.time_stride; Plan.env_div)
    WHOLE: tl.constexpr = False,  # T a multiple of BT, rows of whole chunks (core.chunk; Plan.whole)
    G_TENSOR: tl.constexpr = False,  # gamma is the tensor at p_gamma (discount), not the float gamma_hi + gamma_lo
    L_TENSOR: tl.constexpr = False,  # lambda likewise
):  # fmt: skip
    core.scan_rows(
        (p_r, p_v, p_term, p_trunc, p_boot, p_last, p_gamma, gamma_sn, gamma_st, p_lmbda, lmbda_sn, lmbda_st),
        (p_adv, p_tgt), (gamma_hi, gamma_lo, lmbda_hi, lmbda_lo), N, T,
        p_agg_a, p_agg_b, p_flag, NK, CPB, gae_scalars, gae_prologue, gae_epilogue,
        (HAS_TRUNC, HAS_BOOT, HAS_LAST, NEXT_ALL, TARGET, G_TENSOR, L_TENSOR),
        PHASE, ONE, ACC, BN, BT, NKP, FORM, EXACT_T, TDIV, TM, WHOLE, REVERSE=True, FULL=EXACT_T or WHOLE,
    )  # fmt: skip


@triton.jit
def vtrace_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """V-trace: (a, b) of D_t = b + a D_{t+1}, plus what the epilogue needs (rho, r, v, boundary, v_next).
    v_next is 0 at terminated steps and c_t is not read at done ones; the boundary flag passed on marks
    terminated steps too, where the epilogue's q_t is v_next (0) rather than vs_{t+1}."""
    HAS_TRUNC: tl.constexpr = K[0]
    HAS_BOOT: tl.constexpr = K[1]
    HAS_LAST: tl.constexpr = K[2]
    NEXT_ALL: tl.constexpr = K[3]
    G_TENSOR: tl.constexpr = K[4]
    p_lpt, p_lpb, p_r, p_v, p_term, p_trunc, p_boot, p_last, p_g, g_sn, g_st = ins
    gamma, rho_bar, c_bar = hps
    gamma = discount(gamma, p_g, g_sn, g_st, o_n, o_t, m, G_TENSOR, ACC)
    q_term, q_trunc, q_bnd, b_boot = step_context(
        p_term, p_trunc, p_boot, p_last, off, o_n, o_t, m, m_n, T, HAS_TRUNC, HAS_BOOT, HAS_LAST, ACC
    )
    b_r = tl.load(p_r + off, mask=m, other=0).to(ACC)
    b_v = tl.load(p_v + off, mask=m, other=0).to(ACC)
    b_vnext = tl.where(q_term, 0.0, next_value(p_v, p_boot, off, m, q_bnd, b_boot, NEXT_ALL, ACC, ST))
    b_lpt = tl.load(p_lpt + off, mask=m, other=0).to(ACC)
    b_lpb = tl.load(p_lpb + off, mask=m, other=0).to(ACC)
    b_ratio = tl.exp(b_lpt - b_lpb)
    b_rho = tl.minimum(b_ratio, rho_bar)
    # min(ratio, c_bar) as a select, c_bar for a NaN ratio on every backend (tl.minimum's on the GPU)
    b_c = tl.where(b_ratio < c_bar, b_ratio, c_bar)
    b_a = tl.where(q_term | q_trunc, 0.0, gamma * b_c)
    b_b = b_rho * (b_r + gamma * b_vnext - b_v)  # v_next (0 at terminated steps) stands for (1 - term) v_next
    ctx = (b_rho, b_r, b_v, q_bnd | q_term, b_vnext, gamma)
    return tl.where(m, b_a, 1.0), tl.where(m, b_b, 0.0), ctx


@triton.jit
def store_off_policy(p_t, p_adv, ctx, b_d, b_x1, b_d1, off, m):
    """V-trace's and Retrace's outputs from the prologue's ctx (rho, r, x = v or q, boundary, end, gamma):
    the targets x_t + D_t and the advantages rho (r + gamma X_t - x_t), X_t the end value at boundary
    (and terminated: 0) steps, x_{t+1} + D_{t+1} (the next step's target) elsewhere."""
    b_rho, b_r, b_x, q_bnd, b_end, gamma = ctx  # gamma: the scalar, or gamma_t at the slots
    b_xt = tl.where(q_bnd, b_end, b_x1 + b_d1)
    tl.store(p_t + off, b_x + b_d, mask=m)
    tl.store(p_adv + off, b_rho * (b_r + gamma * b_xt - b_x), mask=m)


@triton.jit
def vtrace_epilogue(outs, ins, hps, ctx, b_d, b_d1, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    NEXT_ALL: tl.constexpr = K[3]
    p_vs, p_adv = outs
    q_bnd, b_vnext = ctx[3], ctx[4]  # boundary (or terminated) steps, v_next (vtrace_prologue)
    if NEXT_ALL:  # values_{t+1} (inside the buffer: no boundary at t, so t + 1 < T)
        b_v1 = tl.load(ins[3] + off + ST, mask=m & ~q_bnd, other=0).to(ACC)
    else:
        b_v1 = b_vnext
    # vs_{t+1} = values_{t+1} + D_{t+1} inside the buffer; v_next (0) at terminated steps too
    store_off_policy(p_vs, p_adv, ctx, b_d, b_v1, b_d1, off, m)


@triton.jit(do_not_specialize=["N", "NK", "CPB", "gamma_hi", "gamma_lo", "rho_hi", "rho_lo", "c_hi", "c_lo"])
def vtrace_kernel(
    p_lpt,  # [N, T] log pi_target(a_t | s_t)
    p_lpb,  # [N, T] log pi_behavior(a_t | s_t)
    p_v,  # [N, T] values
    p_r,  # [N, T] rewards
    p_term, p_trunc, p_boot, p_last,  # flags and bootstrap values as in gae_kernel
    p_vs,  # [N, T] output v-trace targets
    p_adv,  # [N, T] output policy-gradient advantages
    N, T,
    gamma_hi, gamma_lo, p_gamma, gamma_sn, gamma_st,  # gamma: a float's halves or a tensor (see gae_kernel)
    rho_hi, rho_lo, c_hi, c_lo,
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block (see gae_kernel)
    HAS_TRUNC: tl.constexpr, HAS_BOOT: tl.constexpr, HAS_LAST: tl.constexpr, NEXT_ALL: tl.constexpr,
    PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr,
    NKP: tl.constexpr,
    FORM: tl.constexpr,  # tile form (kernels/core.py)
    EXACT_T: tl.constexpr = False,  # env-major rows of T == BT steps: see gae_kernel
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV: see gae_kernel
    TM: tl.constexpr = 0,  # time-major rows: see gae_kernel
    WHOLE: tl.constexpr = False,  # rows of whole chunks: see gae_kernel
    G_TENSOR: tl.constexpr = False,  # a tensor gamma: see gae_kernel
):  # fmt: skip
    core.scan_rows(
        (p_lpt, p_lpb, p_r, p_v, p_term, p_trunc, p_boot, p_last, p_gamma, gamma_sn, gamma_st), (p_vs, p_adv),
        (gamma_hi, gamma_lo, rho_hi, rho_lo, c_hi, c_lo), N, T, p_agg_a, p_agg_b, p_flag, NK, CPB,
        core.hp_scalars, vtrace_prologue, vtrace_epilogue, (HAS_TRUNC, HAS_BOOT, HAS_LAST, NEXT_ALL, G_TENSOR),
        PHASE, ONE, ACC, BN, BT, NKP, FORM, EXACT_T, TDIV, TM, WHOLE,
        REVERSE=True, NEXT=True, FULL=WHOLE,  # not EXACT_T: core.env_block
    )  # fmt: skip


@triton.jit
def _action_dot(p_w, p_nq, off, m, A: tl.constexpr, COL: tl.constexpr, W: tl.constexpr, ACC: tl.constexpr):
    """sum over actions COL .. COL + W - 1 (those < A) of w[., a] * nq[., a], from [..., W] tiles."""
    ax: tl.constexpr = len(off.shape)
    o_a = COL + tl.arange(0, W)
    off_a = tl.expand_dims(off, ax) * A + o_a
    m_a = tl.expand_dims(m, ax) & (o_a < A)
    b_w = tl.load(p_w + off_a, mask=m_a, other=0).to(ACC)
    return tl.sum(b_w * tl.load(p_nq + off_a, mask=m_a, other=0).to(ACC), ax)


@triton.jit
def _action_dot_pick(p_w, p_nq, off, m, b_act, m_act, A: tl.constexpr, AP: tl.constexpr, ACC: tl.constexpr):
    """:func:`_action_dot` over one tile of AP actions, and w[., a_t] picked out of its weights tile
    (NaN where ``m_act`` is false: an action outside [0, A))."""
    ax: tl.constexpr = len(off.shape)
    o_a = tl.arange(0, AP)
    off_a = tl.expand_dims(off, ax) * A + o_a
    m_a = tl.expand_dims(m, ax) & (o_a < A)
    b_w = tl.load(p_w + off_a, mask=m_a, other=0).to(ACC)
    b_e = tl.sum(b_w * tl.load(p_nq + off_a, mask=m_a, other=0).to(ACC), ax)
    b_pi = tl.sum(tl.where(tl.expand_dims(b_act, ax) == o_a, b_w, 0.0), ax)
    return b_e, tl.where(m_act, b_pi, float("nan"))


@triton.jit
def _term_like_e(p_term, off, m, AP: tl.constexpr):
    """The terminated flags (any dtype, nonzero: set) as a boolean in the layout of E_t, the reduction over an
    action axis: read once more through an [..., AP] tile (one lane per step loads) and reduced over it. With
    8-byte flags and a row divisor, Triton 3.6 gave the flags a load layout whose boolean mask it then converted
    to E_t's layout inside each warp with byte permutes, and that conversion is miscompiled (masks of the wrong
    steps and envs); a mask made in E_t's layout needs no conversion."""
    ax: tl.constexpr = len(off.shape)
    o_a = tl.arange(0, AP)
    b_f = tl.load(p_term + tl.expand_dims(off, ax) + o_a * 0, mask=tl.expand_dims(m, ax) & (o_a == 0), other=0)
    return tl.max((b_f != 0).to(tl.int32), ax) != 0


@triton.jit
def _env_next(x):
    """An env-major [BN, G, 4] tile of one chunk (G <= 2 groups, the latest first) one step later in
    time: slot t holds x_{t+1}, 0 past the chunk's last step. Registers only (no reload at off + 1)."""
    x0, x1, x2, x3 = core._split4(x)  # [BN, G] each
    if x.shape[1] == 1:
        n0 = tl.zeros_like(x0)
    else:
        tl.static_assert(x.shape[1] == 2, "env-major chunks of at most 8 steps")
        x0_late, _x0_early = tl.split(x0)  # step 4 of the row; step 0
        n0 = tl.join(tl.zeros_like(x0_late), x0_late)  # the earlier group's step 3 is followed by step 4
    return core._join4(x1, x2, x3, n0)


@triton.jit
def retrace_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """Retrace: (a, b) of Delta_t = b + a Delta_{t+1}, plus (rho, r, q, boundary, E) for the epilogue. SHIFT
    (env-major rows of one chunk) takes c_{t+1} from the tile in registers (:func:`_env_next`) instead of
    loading the actions, probabilities and behaviour probabilities again at off + ST; PI_TILE (p_w is p_pt, one
    action tile) picks pi(a_t | s_t) out of the weights tile instead of gathering the same bytes again. Without
    them the loads keep their order (placing the gather of pi(a_t | s_t) after the action tiles measured slower:
    docs/performance.md). c_{t+1} is not read at done steps nor E_t at terminated ones (0); the boundary flag
    passed on marks terminated steps too, where the epilogue's X_t is E_t (0) rather than q_targets_{t+1}."""
    A: tl.constexpr = K[0]
    AP: tl.constexpr = K[1]
    PIECES: tl.constexpr = K[2]
    HAS_TRUNC: tl.constexpr = K[3]
    SHIFT: tl.constexpr = K[4]
    PI_TILE: tl.constexpr = K[5]
    G_TENSOR: tl.constexpr = K[6]
    L_TENSOR: tl.constexpr = K[7]
    p_pt, p_w, p_pb, p_q, p_nq, p_act, p_r, p_term, p_trunc, p_g, g_sn, g_st, p_l, l_sn, l_st = ins
    gamma, lmbda, c_bar, rho_bar = hps
    gamma = discount(gamma, p_g, g_sn, g_st, o_n, o_t, m, G_TENSOR, ACC)
    q_term, q_trunc, q_bnd, _ = step_context(
        p_term, p_trunc, p_term, p_term, off, o_t, o_t, m, m, T, HAS_TRUNC, False, False, ACC
    )
    b_r = tl.load(p_r + off, mask=m, other=0).to(ACC)
    b_q = tl.load(p_q + off, mask=m, other=0).to(ACC)
    # pi(a_t | s_t) / mu(a_t | s_t); an action outside [0, A) gives NaN, never a wrong number.
    b_act = tl.load(p_act + off, mask=m, other=0)
    m_act = m & (b_act >= 0) & (b_act < A)
    if PI_TILE:
        tl.static_assert(not PIECES, "PI_TILE: one action tile")
        b_e, b_pi = _action_dot_pick(p_w, p_nq, off, m, b_act, m_act, A, AP, ACC)
    else:
        b_pi = tl.load(p_pt + off * A + b_act, mask=m_act, other=float("nan")).to(ACC)
    b_ratio = b_pi / tl.load(p_pb + off, mask=m, other=1).to(ACC)
    b_rho = tl.minimum(b_ratio, rho_bar)
    # c_{t+1}; zero past the last step. min(ratio, c_bar) as a select: c_bar for a NaN ratio (an action out of
    # range) on every backend, as tl.minimum gives on the GPU, so that the coefficient stays finite.
    m1 = m & (o_t + 1 < T)
    if SHIFT:  # lambda_t's tile shifts with the ratio's: lambda_{t+1} at slot t
        b_lmbda = discount(lmbda, p_l, l_sn, l_st, o_n, o_t, m, L_TENSOR, ACC)
        b_c1 = tl.where(m1, _env_next(b_lmbda * tl.where(b_ratio < c_bar, b_ratio, c_bar)), 0.0)
    else:
        b_act1 = tl.load(p_act + off + ST, mask=m1, other=0)
        m_act1 = m1 & (b_act1 >= 0) & (b_act1 < A)
        b_pi1 = tl.load(p_pt + (off + ST) * A + b_act1, mask=m_act1, other=float("nan")).to(ACC)
        b_ratio1 = b_pi1 / tl.load(p_pb + off + ST, mask=m1, other=1).to(ACC)
        b_lmbda1 = discount(lmbda, p_l, l_sn, l_st, o_n, o_t + 1, m1, L_TENSOR, ACC)  # lambda_{t+1}
        b_c1 = tl.where(m1, b_lmbda1 * tl.where(b_ratio1 < c_bar, b_ratio1, c_bar), 0.0)
    # E_t = sum_a w[t, a] Q(s_{t+1}, a), from [..., W] tiles: the A actions of a step are contiguous, so
    # the rows load as vectors (A is a constexpr); a loop over actions loaded every A-th element instead.
    # PIECES: one tile per binary digit of A (18 = 16 + 2), no padded lanes; else one tile of AP.
    if PIECES:
        tl.static_assert(A < (1 << 21), "PIECES: at most 2^21 - 1 actions")
        b_e = tl.zeros(off.shape, ACC)
        for j in tl.static_range(21):  # digits from the highest: columns in order
            if (A >> (20 - j)) & 1:
                b_e += _action_dot(p_w, p_nq, off, m, A, (A >> (21 - j)) << (21 - j), 1 << (20 - j), ACC)
    elif not PI_TILE:
        b_e = _action_dot(p_w, p_nq, off, m, A, 0, AP, ACC)
    b_a = tl.where(q_term | q_trunc, 0.0, gamma * b_c1)
    if p_term.dtype.element_ty.primitive_bitwidth > 32:  # 8-byte flags: the mask in E_t's layout (_term_like_e)
        b_e = tl.where(_term_like_e(p_term, off, m, AP), 0.0, b_e)
    else:
        b_e = tl.where(q_term, 0.0, b_e)
    b_b = b_r + gamma * b_e - b_q  # E_t (0 at terminated steps) stands for (1 - term) E_t
    ctx = (b_rho, b_r, b_q, q_bnd | q_term, b_e, gamma)
    return tl.where(m, b_a, 1.0), tl.where(m, b_b, 0.0), ctx


@triton.jit
def retrace_epilogue(outs, ins, hps, ctx, b_d, b_d1, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    SHIFT: tl.constexpr = K[4]
    p_qt, p_adv = outs
    b_q, q_bnd = ctx[2], ctx[3]  # q_t, boundary (or terminated) steps (retrace_prologue)
    if SHIFT:  # q_{t+1} from registers (used only where t is no boundary, so t + 1 < T)
        b_q1 = _env_next(b_q)
    else:
        b_q1 = tl.load(ins[3] + off + ST, mask=m & ~q_bnd, other=0).to(ACC)
    # q_targets_{t+1} inside the buffer; E_t (0) at terminated steps
    store_off_policy(p_qt, p_adv, ctx, b_d, b_q1, b_d1, off, m)


@triton.jit(
    do_not_specialize=[
        "N",
        "NK",
        "CPB",
        "gamma_hi",
        "gamma_lo",
        "lmbda_hi",
        "lmbda_lo",
        "c_hi",
        "c_lo",
        "rho_hi",
        "rho_lo",
    ]
)
def retrace_kernel(
    p_pt,  # [N, T, A] target policy pi(. | s_t)
    p_w,  # [N, T, A] weights of Q(s_{t+1}, .): pi(. | s_{t+1}) if given, else p_pt
    p_pb,  # [N, T] behaviour probability of the taken action
    p_q,  # [N, T] Q(s_t, a_t)
    p_nq,  # [N, T, A] Q(s_{t+1}, .)
    p_act,  # [N, T] actions (integer)
    p_r, p_term, p_trunc,  # [N, T] rewards, terminateds, truncateds
    p_qt,  # [N, T] output Q targets
    p_adv,  # [N, T] output advantages
    N, T,
    gamma_hi, gamma_lo, p_gamma, gamma_sn, gamma_st,  # gamma and lambda: a float's halves or a tensor (gae_kernel)
    lmbda_hi, lmbda_lo, p_lmbda, lmbda_sn, lmbda_st,
    c_hi, c_lo, rho_hi, rho_lo,
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block (see gae_kernel)
    A: tl.constexpr,  # number of actions
    AP: tl.constexpr,  # A rounded up to a power of two (the action axis of the tiles)
    PIECES: tl.constexpr,  # action tiles per binary digit of A instead of one padded to AP
    HAS_TRUNC: tl.constexpr, PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr,
    BT: tl.constexpr,
    NKP: tl.constexpr,
    FORM: tl.constexpr,  # tile form (kernels/core.py)
    # Env-major rows of one chunk (Plan.exact_t): EXACT_T: T == BT, taken as a constexpr (see gae_kernel);
    # SHIFT and PI_TILE: retrace_prologue.
    EXACT_T: tl.constexpr = False,
    SHIFT: tl.constexpr = False,
    PI_TILE: tl.constexpr = False,  # only where p_w is p_pt
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV: see gae_kernel
    TM: tl.constexpr = 0,  # time-major rows, [T, N, A] per-action tensors read as (N, T, A) views: see gae_kernel
    WHOLE: tl.constexpr = False,  # rows of whole chunks: see gae_kernel
    G_TENSOR: tl.constexpr = False,  # tensor gamma, lambda: see gae_kernel
    L_TENSOR: tl.constexpr = False,
):  # fmt: skip
    tl.static_assert(FORM == ENV_GROUPS or not SHIFT, "SHIFT: env-major rows of one chunk")
    core.scan_rows(
        (p_pt, p_w, p_pb, p_q, p_nq, p_act, p_r, p_term, p_trunc, p_gamma, gamma_sn, gamma_st, p_lmbda, lmbda_sn,
         lmbda_st), (p_qt, p_adv),
        (gamma_hi, gamma_lo, lmbda_hi, lmbda_lo, c_hi, c_lo, rho_hi, rho_lo), N, T, p_agg_a, p_agg_b, p_flag, NK, CPB,
        core.hp_scalars, retrace_prologue, retrace_epilogue,
        (A, AP, PIECES, HAS_TRUNC, SHIFT, PI_TILE, G_TENSOR, L_TENSOR), PHASE, ONE, ACC, BN, BT, NKP, FORM, EXACT_T,
        TDIV, TM, WHOLE,
        REVERSE=True, NEXT=True, FULL=WHOLE, AGGREGATE_TEST=True,  # not EXACT_T: core.env_block
    )  # fmt: skip


@triton.jit
def returns_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """TD(lambda) returns: a_t = gamma_t lambda_t (0 at done steps and boundaries), b_t = r_t + gamma_t X_t
    with X_t the bootstrap part of the return's target."""
    HAS_NV: tl.constexpr = K[0]
    HAS_TRUNC: tl.constexpr = K[1]
    HAS_BOOT: tl.constexpr = K[2]
    EXACT_T: tl.constexpr = K[4]
    G_TENSOR: tl.constexpr = K[5]
    L_TENSOR: tl.constexpr = K[6]
    p_r, p_nv, p_term, p_trunc, p_boot, p_v, p_g, g_sn, g_st, p_l, l_sn, l_st = ins
    gamma, lmbda = hps
    gamma = discount(gamma, p_g, g_sn, g_st, o_n, o_t, m, G_TENSOR, ACC)
    lmbda = discount(lmbda, p_l, l_sn, l_st, o_n, o_t, m, L_TENSOR, ACC)
    q_term, q_trunc, q_bnd, b_boot = step_context(
        p_term, p_trunc, p_boot, p_boot, off, o_n, o_t, m, m_n, T, HAS_TRUNC, HAS_BOOT, False, ACC
    )
    b_trunc = q_trunc.to(ACC)
    b_r = tl.load(p_r + off, mask=m, other=0).to(ACC)
    # X_t minus its recursive part: boot at truncations, (1-lam) nv + lam boot at the last step; the next
    # values are not read at truncations (X_t = boot_t), nor X_t at terminated steps (selected to 0).
    if HAS_NV and EXACT_T:
        # Which of the two products the compiler contracts into an FMA depends on the tile layout; spelled
        # out, a row's bits do not depend on the number of envs.
        b_nv = tl.where(q_trunc, 0.0, tl.load(p_nv + off, mask=m, other=0).to(ACC))
        b_x = tl.fma(b_boot, b_trunc + lmbda * (1 - b_trunc), (1 - b_trunc) * (1 - lmbda) * b_nv)
    else:
        b_x = b_boot * (b_trunc + lmbda * (1 - b_trunc))
        if HAS_NV:
            b_nv = tl.where(q_trunc, 0.0, tl.load(p_nv + off, mask=m, other=0).to(ACC))
            b_x += (1 - b_trunc) * (1 - lmbda) * b_nv
    b_x = tl.where(q_term, 0.0, b_x)  # also stands for the factor (1 - term_t) of gamma (1 - term_t) X_t
    b_a = tl.where(m, tl.where(q_term | q_bnd, 0.0, gamma * lmbda), 1.0)  # where gamma (1-term) lam (1-bnd) was
    if HAS_BOOT or HAS_NV:
        b_b = tl.where(m, b_r + gamma * b_x, 0.0)
    else:  # X_t minus its recursive part is 0 (r + gamma 0 is r)
        b_b = tl.where(m, b_r, 0.0)
    return b_a, b_b, ()


@triton.jit
def returns_epilogue(outs, ins, hps, ctx, b_g, b_gn, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    store_with_value(outs[0], outs[1], b_g, ins[5], off, m, K[3], True, ACC)  # K[3]: ADV


@triton.jit(do_not_specialize=["N", "NK", "CPB", "gamma_hi", "gamma_lo", "lmbda_hi", "lmbda_lo"])
def returns_kernel(
    p_r,  # [N, T] rewards
    p_nv,  # [N, T] next values V(s_{t+1}) (if HAS_NV; TD(lambda) returns)
    p_term, p_trunc, p_boot,  # flags and bootstrap values as in gae_kernel
    p_v,  # [N, T] values V(s_t) (if ADV)
    p_g,  # [N, T] output returns
    p_adv,  # [N, T] output advantages G_t - V(s_t) (if ADV)
    N, T,
    gamma_hi, gamma_lo, p_gamma, gamma_sn, gamma_st,  # gamma and lambda: a float's halves or a tensor (gae_kernel)
    lmbda_hi, lmbda_lo, p_lmbda, lmbda_sn, lmbda_st,
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block (see gae_kernel)
    HAS_NV: tl.constexpr, HAS_TRUNC: tl.constexpr, HAS_BOOT: tl.constexpr,
    ADV: tl.constexpr,  # also store the advantages
    PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr,
    NKP: tl.constexpr,
    FORM: tl.constexpr,  # tile form (kernels/core.py)
    EXACT_T: tl.constexpr = False,  # env-major rows of T == BT steps: see gae_kernel
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV: see gae_kernel
    TM: tl.constexpr = 0,  # time-major rows: see gae_kernel
    WHOLE: tl.constexpr = False,  # rows of whole chunks: see gae_kernel
    G_TENSOR: tl.constexpr = False,  # tensor gamma, lambda: see gae_kernel
    L_TENSOR: tl.constexpr = False,
):  # fmt: skip
    """TD(lambda) returns; with lambda = 1 and no next values, discounted returns."""
    core.scan_rows(
        (p_r, p_nv, p_term, p_trunc, p_boot, p_v, p_gamma, gamma_sn, gamma_st, p_lmbda, lmbda_sn, lmbda_st),
        (p_g, p_adv), (gamma_hi, gamma_lo, lmbda_hi, lmbda_lo), N, T,
        p_agg_a, p_agg_b, p_flag, NK, CPB, core.hp_scalars, returns_prologue, returns_epilogue,
        (HAS_NV, HAS_TRUNC, HAS_BOOT, ADV, EXACT_T, G_TENSOR, L_TENSOR),
        PHASE, ONE, ACC, BN, BT, NKP, FORM, EXACT_T, TDIV, TM, WHOLE, REVERSE=True, FULL=EXACT_T or WHOLE,
    )  # fmt: skip


@triton.jit
def forward_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """x_t = scale (1 - done_{t-1}) x_{t-1} + in_t (done_t with STARTS_AT)."""
    STARTS_AT: tl.constexpr = K[0]
    p_x, p_done = ins
    if STARTS_AT:
        q_done = core.flag_set(p_done, off, m)
    else:
        q_done = core.flag_set(p_done, off - ST, m & (o_t >= 1))
    b_a = tl.where(m, tl.where(q_done, 0.0, hps[0]), 1.0)  # a select where scale * (1 - done) was
    b_b = tl.load(p_x + off, mask=m, other=0).to(ACC)
    return b_a, b_b, ()


@triton.jit
def forward_epilogue(outs, ins, hps, ctx, b_y, b_yn, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    tl.store(outs[0] + off, b_y, mask=m)


@triton.jit(do_not_specialize=["N", "NK", "CPB", "scale_hi", "scale_lo"])
def forward_trace_kernel(
    p_x,  # [N, T] gradients (eligibility traces) or inputs (prefix sums)
    p_done,  # [N, T] dones (any dtype)
    p_seed,  # [N] initial state e_-1 / S_-1 (if HAS_SEED)
    p_out,  # [N, T] output
    N, T,
    scale_hi, scale_lo,  # gamma * lambda (eligibility traces) or 1 (prefix sums)
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block (see gae_kernel)
    STARTS_AT: tl.constexpr,  # reset at the flagged step instead of the step after it
    HAS_SEED: tl.constexpr, PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr,
    BT: tl.constexpr,
    NKP: tl.constexpr,
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV: see gae_kernel
    TM: tl.constexpr = 0,  # time-major rows: see gae_kernel
):  # fmt: skip
    """Forward recurrence x_t = scale (1 - done_{t-1}) x_{t-1} + in_t (done_t if STARTS_AT)."""
    core.scan_rows(
        (p_x, p_done), (p_out,), (scale_hi, scale_lo), N, T, p_agg_a, p_agg_b, p_flag, NK, CPB, core.hp_scalars,
        forward_prologue, forward_epilogue, (STARTS_AT,), PHASE, ONE, ACC, BN, BT, NKP, PLAIN, False, TDIV, TM, False,
        REVERSE=False, p_seed=p_seed, HAS_SEED=HAS_SEED, SEEDED=True,
    )  # fmt: skip
