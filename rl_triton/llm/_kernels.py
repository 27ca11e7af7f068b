"""Triton kernels of :mod:`rl_triton.llm` and their launchers.

* ``_token_scan_grouped_kernel``: masked GAE (MODE 0) or REINFORCE++ returns (MODE 1) as one scan over each
  row, plus the partial moments of the scanned state that the whitening needs. GAE's skip-mask recursion is
  linear in the state (L, nv): a valid token maps it to ``(γλ L + γ nv + r − V, V)``, a masked one leaves it
  alone, so every step is an affine map ``L' = p L + q nv + b1, nv' = rr nv + b2`` and so is any composition of
  steps (``_gae_combine``). REINFORCE++ is the scalar map ``G' = γ G + r`` at a valid token and the identity at
  a masked one (the core's ``linear_combine``). Rows longer than one block of ``BT`` tokens are split in time:
  each block composes its map and folds the maps of the blocks after it (a scan over at most ``NBP`` maps) into
  the state entering the block, either in one launch (PHASE LOOKBACK: blocks publish their maps behind flags,
  ``core.publish_and_wait``) or in two (AGGREGATES stores the maps, RESCAN rescans). The tile is the core's
  ENV_GROUPS form, with its tile helpers and combines; the scan across groups and the carry are the kernel's own
  (a GAE state is two values, and its blocks fold every later block's map, not the core's windows).
* ``_moments_kernel``: per-program (count, sum, M2) of the valid entries. It and the scan kernel end in
  ``_finalize_last``: the launch's last program combines every program's triple in a fixed order
  (deterministic, no atomics on the values) into [count, mean, M2].
* ``_whiten_kernel``: ``(x − μ)·rsqrt(σ² + 1e-8)``, reading (count, mean, M2) from device memory (so the
  statistics of several ranks can be combined in between without a host sync).
* ``_row_sum_kernel``, ``_group_kernel``, ``_broadcast_kernel``: GRPO / RLOO. Scores are row sums; the
  sequences are sorted by group id (``torch.sort``, on the device), and the program at the first sorted
  position of each group computes the group's statistics and the advantage of its members; the others exit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from .. import _config
from .._discounts import token_discount
from ..distributed import _acc_dtype as _acc
from ..kernels import core
from ..kernels.core import AGGREGATES, LOOKBACK, RESCAN, _edge, _join4, _on, _split4, linear_combine
from ..kernels.plans import Phase, Split, TokenPlan, cdiv, pow2, token_tile
from ..ops.utils import acc as _tl

# Launch decisions (block length, tile form, split) are a TokenPlan (kernels/plans.py), passed in.
_FLAT_BLOCK = 4096  # elements per program of the flat moments / whitening kernels


@triton.jit
def _gae_combine(pf, qf, rf, b1f, b2f, pg, qg, rg, b1g, b2g):
    # f (the later tokens, applied first) then g:  L -> pg (pf L + qf nv + b1f) + qg (rf nv + b2f) + b1g
    return pg * pf, pg * qf + qg * rf, rg * rf, pg * b1f + qg * b2f + b1g, rg * b2f + b2g


@triton.jit
def _gae_maps(p_r, p_v, p_m, offs, inb, g, lam, ACC: tl.constexpr):
    # the maps of GAE's tokens at offs: (p, q, rr, b1, b2), and the valid-token mask
    b_r = tl.load(p_r + offs, mask=inb, other=0).to(ACC)
    b_v = tl.load(p_v + offs, mask=inb, other=0).to(ACC)
    valid = inb & (tl.load(p_m + offs, mask=inb, other=0) != 0)
    zero = tl.zeros(b_r.shape, ACC)
    one = zero + 1.0
    return (tl.where(valid, g * lam + zero, one), tl.where(valid, g + zero, zero), tl.where(valid, zero, one),
            tl.where(valid, b_r - b_v, zero), tl.where(valid, b_v, zero), valid, b_v)  # fmt: skip


@triton.jit
def _rpp_maps(p_r, mk, offs, inb, g, ACC: tl.constexpr):
    # the maps of REINFORCE++'s tokens at offs: (a, b) = (gamma, r_t) at a valid token; the identity (1, 0) at a
    # masked one (the running return passes across it) and outside inb; and the valid-token mask
    valid = inb & (mk != 0)
    b_r = tl.load(p_r + offs, mask=inb, other=0).to(ACC)  # masked by inb only: a vector load
    zero = tl.zeros(b_r.shape, ACC)
    return tl.where(valid, g + zero, zero + 1.0), tl.where(valid, b_r, zero), valid


@triton.jit
def _gae4(e):
    # backward through a group of 4: the composed maps from the group's entry to each token, latest token first
    p0, p1, p2, p3 = _split4(e[0])
    q0, q1, q2, q3 = _split4(e[1])
    r0, r1, r2, r3 = _split4(e[2])
    u0, u1, u2, u3 = _split4(e[3])
    w0, w1, w2, w3 = _split4(e[4])
    c2 = _gae_combine(p3, q3, r3, u3, w3, p2, q2, r2, u2, w2)
    c1 = _gae_combine(c2[0], c2[1], c2[2], c2[3], c2[4], p1, q1, r1, u1, w1)
    c0 = _gae_combine(c1[0], c1[1], c1[2], c1[3], c1[4], p0, q0, r0, u0, w0)
    return c0, c1, c2, (p3, q3, r3, u3, w3)


@triton.jit
def _lin4(a, b):
    # _gae4 for REINFORCE++'s scalar maps. Not core._suffix4 (the same maps): its products in the other operand
    # order raised the register use of some of these launches.
    a0, a1, a2, a3 = _split4(a)
    b0, b1, b2, b3 = _split4(b)
    c2 = linear_combine(a3, b3, a2, b2)
    c1 = linear_combine(c2[0], c2[1], a1, b1)
    c0 = linear_combine(c1[0], c1[1], a0, b0)
    return c0, c1, c2, (a3, b3)


@triton.jit(do_not_specialize=["epoch"])
def _token_scan_grouped_kernel(
    p_r,  # rewards (B, T), contiguous
    p_v,  # values (B, T) (MODE 0)
    p_m,  # response mask (B, T), any dtype (bool as uint8); nonzero = valid
    p_g,  # gamma per row (G_PTR), stride s_g (0: one value)
    p_l,  # lam per row (L_PTR, MODE 0), stride s_l
    g_val,  # gamma as a float (not G_PTR)
    l_val,  # lam as a float (not L_PTR)
    s_g,
    s_l,
    p_x,  # out: the scanned state (L or G) in the accumulation dtype
    p_ret,  # out: returns in the input dtype (STORE_RET)
    p_agg,  # scratch: (B, NB, 5) composed map of each block (NB > 1)
    p_pc,  # out: per-program count of valid tokens (int32)
    p_ps,  # out: per-program sum of x over them
    p_pm,  # out: per-program M2 of x over them (around the program's own mean)
    p_st,  # out: [count, mean, M2] over every program's (RESCAN, LOOKBACK; written by the last program)
    p_tk,  # the ticket counter of _finalize_last (int32, 0 between launches)
    p_flag,  # look-back flags (B, NB), int32: the epoch of the call that last published each block (LOOKBACK)
    epoch,  # this call's epoch (LOOKBACK)
    B,
    T,
    NB,  # blocks per row
    MODE: tl.constexpr,  # 0: masked GAE, 1: REINFORCE++ returns
    PHASE: tl.constexpr,  # AGGREGATES: block maps only; RESCAN: carry in, scan, store; LOOKBACK: both in one launch
    CARRY: tl.constexpr,  # NB > 1
    G_PTR: tl.constexpr,
    L_PTR: tl.constexpr,
    STORE_RET: tl.constexpr,
    BN: tl.constexpr,
    BT: tl.constexpr,
    NBP: tl.constexpr,  # NB rounded up to a power of two
    VOLATILE: tl.constexpr,  # the block-map loads are volatile (look-back: written by other blocks this launch)
    ACC: tl.constexpr,
):
    # The tile is [BN, G, 4]: groups of 4 consecutive tokens (time ascending inside a group, so loads vectorise),
    # numbered latest-first along axis 1. Inside a group the backward recurrence is straight-line code in a
    # thread's registers; across groups a forward scan combines the composed maps of the groups *before* each
    # one in processing order (the tile reloaded one group later in time, from L1), which gives every group's
    # entering state without shifting registers between threads. No reverse scan (Triton lowers reverse=True
    # with lane-reversing shuffles of every element).
    G: tl.constexpr = BT // 4
    i_n = tl.program_id(0)
    if PHASE == LOOKBACK:
        i_k = NB - 1 - tl.program_id(1)  # latest block first: the blocks waited on start earlier
    else:
        i_k = tl.program_id(1)
    i_g = tl.arange(0, G)
    rows = i_n * BN + tl.arange(0, BN)
    m_row = rows < B
    cols = i_k * BT + ((G - 1 - i_g)[:, None] * 4 + tl.arange(0, 4)[None, :])[None, :, :]
    inb = m_row[:, None, None] & (cols < T)
    prev_in = inb & (cols + 4 < T) & (i_g > 0)[None, :, None]  # the group before in processing order
    offs = rows.to(tl.int64)[:, None, None] * T + cols
    if G_PTR:
        g = tl.load(p_g + rows * s_g, mask=m_row, other=0).to(ACC)[:, None, None]
    else:
        g = g_val
    i_b = tl.arange(0, NBP)
    later = m_row[:, None] & ((NB - 1 - i_b) > i_k)[None, :]  # the blocks after this one, latest first
    p_blk = p_agg + (rows.to(tl.int64)[:, None] * NB + (NB - 1 - i_b)[None, :]) * 5
    p_own = p_agg + (rows.to(tl.int64) * NB + i_k) * 5
    if MODE == 0:
        if L_PTR:
            lam = tl.load(p_l + rows * s_l, mask=m_row, other=0).to(ACC)[:, None, None]
        else:
            lam = l_val
        e = _gae_maps(p_r, p_v, p_m, offs, inb, g, lam, ACC)
        valid = e[5]
        b_v = e[6]
        c0, c1, c2, c3 = _gae4(e)
        if PHASE != RESCAN:
            # the block's map: all its groups composed, latest first
            A = tl.associative_scan(c0, 1, _gae_combine)
            tl.store(p_own + 0, _edge(A[0], 1, False, False), mask=m_row)
            tl.store(p_own + 1, _edge(A[1], 1, False, False), mask=m_row)
            tl.store(p_own + 2, _edge(A[2], 1, False, False), mask=m_row)
            tl.store(p_own + 3, _edge(A[3], 1, False, False), mask=m_row)
            tl.store(p_own + 4, _edge(A[4], 1, False, False), mask=m_row)
            if PHASE == LOOKBACK:
                core.publish_and_wait(p_flag, rows, m_row, NB, i_k, i_b, later, epoch, 1 << 16)
        if PHASE != AGGREGATES:
            f0, _, _, _ = _gae4(_gae_maps(p_r, p_v, p_m, offs + 4, prev_in, g, lam, ACC))
            # X_g: the composed map of the groups before g (identity for g = 0)
            X = tl.associative_scan(f0, 1, _gae_combine)
            if CARRY:
                c_p = tl.load(p_blk + 0, mask=later, other=1.0, volatile=VOLATILE).to(ACC)
                c_q = tl.load(p_blk + 1, mask=later, other=0.0, volatile=VOLATILE).to(ACC)
                c_r = tl.load(p_blk + 2, mask=later, other=1.0, volatile=VOLATILE).to(ACC)
                c_b1 = tl.load(p_blk + 3, mask=later, other=0.0, volatile=VOLATILE).to(ACC)
                c_b2 = tl.load(p_blk + 4, mask=later, other=0.0, volatile=VOLATILE).to(ACC)
                _, _, _, C1, C2 = tl.associative_scan((c_p, c_q, c_r, c_b1, c_b2), 1, _gae_combine)
                Lc = _edge(C1, 1, False, True)
                Vc = _edge(C2, 1, False, True)
                EL = X[0] * Lc + X[1] * Vc + X[3]  # the state entering each group
                EV = X[2] * Vc + X[4]
            else:
                EL = X[3]
                EV = X[4]
            x = _join4(c0[0] * EL + c0[1] * EV + c0[3], c1[0] * EL + c1[1] * EV + c1[3],
                       c2[0] * EL + c2[1] * EV + c2[3], c3[0] * EL + c3[1] * EV + c3[3])  # fmt: skip
            if STORE_RET:
                tl.store(p_ret + offs, x + b_v, mask=inb)
    else:
        mk = tl.load(p_m + offs, mask=inb, other=0)
        a, b, valid = _rpp_maps(p_r, mk, offs, inb, g, ACC)
        c0, c1, c2, c3 = _lin4(a, b)
        if PHASE != RESCAN:
            AA, AB = tl.associative_scan(c0, 1, linear_combine)
            tl.store(p_own + 0, _edge(AA, 1, False, False), mask=m_row)
            tl.store(p_own + 1, _edge(AB, 1, False, False), mask=m_row)
            if PHASE == LOOKBACK:
                core.publish_and_wait(p_flag, rows, m_row, NB, i_k, i_b, later, epoch, 1 << 16)
        if PHASE != AGGREGATES:
            mk4 = tl.load(p_m + offs + 4, mask=prev_in, other=0)
            fa, fb, _ = _rpp_maps(p_r, mk4, offs + 4, prev_in, g, ACC)
            f0, _, _, _ = _lin4(fa, fb)
            XA, XB = tl.associative_scan(f0, 1, linear_combine)
            if CARRY:
                c_a = tl.load(p_blk + 0, mask=later, other=1.0, volatile=VOLATILE).to(ACC)
                c_b = tl.load(p_blk + 1, mask=later, other=0.0, volatile=VOLATILE).to(ACC)
                _, CB = tl.associative_scan((c_a, c_b), 1, linear_combine)
                EG = _on(XA, XB, _edge(CB, 1, False, True))
            else:
                EG = XB
            # returns are 0 at masked positions (the state carried across them is not stored)
            x = _join4(_on(c0[0], c0[1], EG), _on(c1[0], c1[1], EG), _on(c2[0], c2[1], EG), _on(c3[0], c3[1], EG))
            x = tl.where(valid, x, 0.0)
            if STORE_RET:
                tl.store(p_ret + offs, x, mask=inb)
    if PHASE != AGGREGATES:
        tl.store(p_x + offs, x, mask=inb)
        cnt = tl.sum(tl.sum(tl.sum(valid.to(tl.int32), axis=2), axis=1), axis=0)
        tot = tl.sum(tl.sum(tl.sum(tl.where(valid, x, 0.0), axis=2), axis=1), axis=0)
        mean = tot / tl.maximum(cnt, 1).to(ACC)
        d = tl.where(valid, x - mean, 0.0)
        pid = i_n * NB + i_k
        tl.store(p_pc + pid, cnt)
        tl.store(p_ps + pid, tot)
        tl.store(p_pm + pid, tl.sum(tl.sum(tl.sum(d * d, axis=2), axis=1), axis=0))
        _finalize_last(p_pc, p_ps, p_pm, p_st, p_tk, tl.num_programs(0) * NB, 1024, ACC)


@triton.jit
def _moments_kernel(
    p_x,  # values, flat
    p_m,  # mask, flat, any dtype
    p_pc,  # out: per-program count, sum, M2
    p_ps,
    p_pm,
    p_st,  # out: [count, mean, M2] over all programs (written by the last one)
    p_tk,  # the ticket counter of _finalize_last
    n,
    BLOCK: tl.constexpr,
    ACC: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    valid = inb & (tl.load(p_m + offs, mask=inb, other=0) != 0)
    x = tl.load(p_x + offs, mask=valid, other=0).to(ACC)
    cnt = tl.sum(valid.to(tl.int32), axis=0)
    tot = tl.sum(tl.where(valid, x, 0.0), axis=0)
    mean = tot / tl.maximum(cnt, 1).to(ACC)
    d = tl.where(valid, x - mean, 0.0)
    tl.store(p_pc + pid, cnt)
    tl.store(p_ps + pid, tot)
    tl.store(p_pm + pid, tl.sum(d * d, axis=0))
    _finalize_last(p_pc, p_ps, p_pm, p_st, p_tk, tl.num_programs(0), 1024, ACC)


@triton.jit
def _combine_partials(p_pc, p_ps, p_pm, P, BLOCK: tl.constexpr, ACC: tl.constexpr):
    # Chan et al.'s combination of P triples (n_i, sum_i, M2_i): the global mean first, then
    # M2 = sum_i M2_i + n_i (mean_i - mean)^2, in a fixed order (deterministic). Volatile loads: the partials were
    # stored by other programs of this launch (L2 is where they meet, not this SM's L1).
    acc_n = tl.zeros([BLOCK], tl.int64)
    acc_s = tl.zeros([BLOCK], ACC)
    for start in range(0, P, BLOCK):
        i = start + tl.arange(0, BLOCK)
        acc_n += tl.load(p_pc + i, mask=i < P, other=0, volatile=True).to(tl.int64)
        acc_s += tl.load(p_ps + i, mask=i < P, other=0, volatile=True)
    count = tl.sum(acc_n, axis=0).to(ACC)
    mean = tl.sum(acc_s, axis=0) / tl.maximum(count, 1.0)
    acc_m = tl.zeros([BLOCK], ACC)
    for start in range(0, P, BLOCK):
        i = start + tl.arange(0, BLOCK)
        c = tl.load(p_pc + i, mask=i < P, other=0, volatile=True).to(ACC)
        s = tl.load(p_ps + i, mask=i < P, other=0, volatile=True)
        d = s / tl.maximum(c, 1.0) - mean
        acc_m += tl.load(p_pm + i, mask=i < P, other=0, volatile=True) + c * d * d
    return count, mean, tl.sum(acc_m, axis=0)


@triton.jit
def _finalize_last(p_pc, p_ps, p_pm, p_st, p_tk, P, PBLOCK: tl.constexpr, ACC: tl.constexpr):
    # Called by each of the launch's P programs once its partial moments are stored: the last one to take a
    # ticket combines all P (every other program has stored its own before taking its ticket) into
    # p_st = [count, mean, M2], and sets the ticket back to 0 for the next launch (CUDA graph replays too). No
    # program waits on another, and the combination order is fixed: deterministic, no finalize launch, and the
    # whitening reads three numbers instead of every partial.
    tl.debug_barrier()
    ticket = tl.atomic_add(p_tk, 1, sem="acq_rel")
    if ticket == P - 1:
        count, mean, m2 = _combine_partials(p_pc, p_ps, p_pm, P, PBLOCK, ACC)
        tl.store(p_st + 0, count)
        tl.store(p_st + 1, mean)
        tl.store(p_st + 2, m2)
        tl.atomic_xchg(p_tk, 0)


@triton.jit
def _whiten_kernel(
    p_x,  # values, flat (accumulation dtype or the input dtype)
    p_y,  # out, flat (may be p_x)
    p_m,  # mask, flat, any dtype (MASK_OUT)
    p_st,  # [count, mean, M2] in the accumulation dtype
    n,
    SHIFT: tl.constexpr,  # shift_mean
    MASK_OUT: tl.constexpr,  # zero where the mask is 0
    BLOCK: tl.constexpr,
    ACC: tl.constexpr,
):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inb = offs < n
    count = tl.load(p_st + 0).to(ACC)
    mean = tl.load(p_st + 1).to(ACC)
    m2 = tl.load(p_st + 2).to(ACC)
    var = m2 / tl.maximum(count - 1.0, 1.0)  # count < 2 raises on the host
    rstd = 1.0 / tl.sqrt(var + 1e-8)
    x = tl.load(p_x + offs, mask=inb, other=0).to(ACC)
    y = (x - mean) * rstd
    if not SHIFT:
        y = y + mean
    if MASK_OUT:
        y = tl.where(tl.load(p_m + offs, mask=inb, other=0) != 0, y, 0.0)
    tl.store(p_y + offs, y, mask=inb)


@triton.jit
def _row_sum_kernel(
    p_r,  # rewards (B, T)
    p_s,  # out: scores (B,) in the accumulation dtype
    B,
    T,
    BN: tl.constexpr,
    BT: tl.constexpr,
    ACC: tl.constexpr,
):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    acc = tl.zeros([BN, BT], ACC)
    for start in range(0, T, BT):
        cols = start + tl.arange(0, BT)
        inb = (rows < B)[:, None] & (cols < T)[None, :]
        acc += tl.load(p_r + rows.to(tl.int64)[:, None] * T + cols[None, :], mask=inb, other=0).to(ACC)
    tl.store(p_s + rows, tl.sum(acc, axis=1), mask=rows < B)


@triton.jit
def _group_kernel(
    p_ids,  # group ids sorted (B,), int64
    p_perm,  # the row of each sorted position (B,), int64
    p_s,  # scores by row (B,)
    p_a,  # out: per-row advantage (B,)
    B,
    eps,  # epsilon as a float (a float32 argument), or (EPS_PTR) a pointer to it in the accumulation dtype
    KIND: tl.constexpr,  # 0: GRPO, 1: Dr. GRPO, 2: RLOO
    BG: tl.constexpr,
    ACC: tl.constexpr,
    EPS_PTR: tl.constexpr = False,
):
    pid = tl.program_id(0)
    # float64 calls read epsilon from memory: a float argument is float32, and 1 + eps in float32 is off by 5e-8
    if EPS_PTR:
        eps = tl.load(eps).to(ACC)
    me = tl.load(p_ids + pid)
    prev = tl.load(p_ids + tl.maximum(pid - 1, 0))
    start = (pid == 0) | (prev != me)
    # the group's size: its ids are contiguous from its first sorted position
    n = pid * 0  # an int32 scalar tensor, carried through the loop
    more = start
    while more:
        i = pid + n + tl.arange(0, BG)
        same = (i < B) & (tl.load(p_ids + i, mask=i < B, other=0) == me)
        c = tl.sum(same.to(tl.int32), axis=0)
        n += c
        more = c == BG
    acc_s = tl.zeros([BG], ACC)
    for c0 in range(0, n, BG):
        i = c0 + tl.arange(0, BG)
        rows = tl.load(p_perm + pid + i, mask=i < n, other=0)
        acc_s += tl.load(p_s + rows, mask=i < n, other=0)
    nf = tl.maximum(n, 1).to(ACC)
    mean = tl.sum(acc_s, axis=0) / nf
    acc_m = tl.zeros([BG], ACC)
    if KIND == 0:
        for c0 in range(0, n, BG):
            i = c0 + tl.arange(0, BG)
            rows = tl.load(p_perm + pid + i, mask=i < n, other=0)
            d = tl.where(i < n, tl.load(p_s + rows, mask=i < n, other=0) - mean, 0.0)
            acc_m += d * d
    std = tl.sqrt(tl.sum(acc_m, axis=0) / tl.maximum(nf - 1.0, 1.0))
    for c0 in range(0, n, BG):
        i = c0 + tl.arange(0, BG)
        rows = tl.load(p_perm + pid + i, mask=i < n, other=0)
        s = tl.load(p_s + rows, mask=i < n, other=0)
        if KIND == 2:
            a = tl.where(n == 1, s, nf / tl.maximum(nf - 1.0, 1.0) * (s - mean))
        elif KIND == 1:
            a = tl.where(n == 1, s, s - mean)
        else:
            a = tl.where(n == 1, s / (1.0 + eps), (s - mean) / (std + eps))
        tl.store(p_a + rows, a, mask=i < n)


@triton.jit
def _broadcast_kernel(
    p_a,  # per-row advantage (B,)
    p_m,  # mask (B, T), any dtype
    p_y,  # out: (B, T), a_b where the mask is set, 0 elsewhere
    B,
    T,
    BN: tl.constexpr,
    BT: tl.constexpr,
):
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    cols = tl.program_id(1) * BT + tl.arange(0, BT)
    inb = (rows < B)[:, None] & (cols < T)[None, :]
    offs = rows.to(tl.int64)[:, None] * T + cols[None, :]
    a = tl.load(p_a + rows, mask=rows < B, other=0)[:, None]
    m = tl.load(p_m + offs, mask=inb, other=0) != 0
    tl.store(p_y + offs, tl.where(m, a, 0.0), mask=inb)


if _config.INTERPRET:  # the GAE pair map's scans as NumPy folds, beside the core's combines (kernels/core.py)
    from ..kernels._interpret import fold_gae_pair, install

    install(_gae_combine, folds=(fold_gae_pair,))


# ---------------------------------------------------------------------------------------------- launchers

_AGGREGATES, _RESCAN, _LOOKBACK = int(Phase.AGGREGATES), int(Phase.RESCAN), int(Phase.LOOKBACK)


class Partials(NamedTuple):
    """Per-program (count, sum, M2) of the valid entries, and ``st``: their combination [count, mean, M2] (the
    last program of the launch that computed them writes it)."""

    pc: torch.Tensor
    ps: torch.Tensor
    pm: torch.Tensor
    st: torch.Tensor
    acc: torch.dtype


def _partials(p: int, acc: torch.dtype, device) -> Partials:
    st = torch.empty(3, dtype=acc, device=device) if p else torch.zeros(3, dtype=acc, device=device)
    return Partials(
        torch.empty(p, dtype=torch.int32, device=device),
        torch.empty(p, dtype=acc, device=device),
        torch.empty(p, dtype=acc, device=device),
        st,
        acc,
    )


def finalize(parts: Partials):
    """(count, mean, M2) over all the partials, as 0-d tensors in the accumulation dtype (views of ``parts.st``:
    the kernels that stored the partials combined them)."""
    return parts.st[0], parts.st[1], parts.st[2]


_TICKETS: dict = {}


def _ticket(device: torch.device) -> torch.Tensor:
    """The ticket counter of :func:`_finalize_last`: one int32 per device and stream, 0 between launches (each
    launch's last program sets it back), so launches on one stream share it in turn. A CUDA graph capture gets
    its own, zeroed in the graph."""
    if _capturing(device):
        return torch.zeros(1, dtype=torch.int32, device=device)
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    tk = _TICKETS.get(key)
    if tk is None:
        tk = _TICKETS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return tk


def _u8(m: torch.Tensor) -> torch.Tensor:
    """The mask as the kernels read it (nonzero = valid): as stored, bool viewed as uint8."""
    m = m.contiguous()
    return m.view(torch.uint8) if m.dtype == torch.bool else m


def moments(x: torch.Tensor, m: torch.Tensor) -> Partials:
    """Partial moments of ``x`` where the mask ``m`` is nonzero, and their combination (:func:`finalize`)."""
    acc = _acc(x.dtype)
    n = x.numel()
    p = cdiv(n, _FLAT_BLOCK)
    parts = _partials(p, acc, x.device)
    if n:
        xf, mf = x.contiguous().reshape(-1), _u8(m).reshape(-1)
        _moments_kernel[(p,)](xf, mf, *parts[:4], _ticket(x.device), n, BLOCK=_FLAT_BLOCK, ACC=_tl(acc), num_warps=8)
    return parts


def whiten(x, stats, shift_mean: bool, out_dtype=None, mask=None, inplace=False):
    """``(x − mean)·rsqrt(M2/(count − 1) + 1e-8)`` (+ mean unless ``shift_mean``), zero where ``mask`` is 0 when
    given; into ``x`` itself when ``inplace`` and the dtypes agree. ``stats``: :class:`Partials` (their ``st``),
    or a (count, mean, M2) triple of 0-d tensors (combined across ranks, say). Returns (output, count as a
    0-d tensor)."""
    out_dtype = x.dtype if out_dtype is None else out_dtype
    acc = _acc(out_dtype)
    x = x.contiguous()
    y = x if inplace and x.dtype == out_dtype else torch.empty(x.shape, dtype=out_dtype, device=x.device)
    n = x.numel()
    if isinstance(stats, Partials):
        st = stats.st
    else:
        st = torch.stack([t.to(device=x.device, dtype=acc).reshape(()) for t in stats])
    if n:
        mf = _u8(mask).reshape(-1) if mask is not None else x
        _whiten_kernel[(cdiv(n, _FLAT_BLOCK),)](
            x.reshape(-1), y.reshape(-1), mf, st, n, SHIFT=shift_mean, MASK_OUT=mask is not None, BLOCK=_FLAT_BLOCK,
            ACC=_tl(acc), num_warps=8,
        )  # fmt: skip
    return y, st[0]


def _scan(mode: int, r, v, m, gamma, lam, plan: TokenPlan):
    b, t = r.shape
    acc = _acc(r.dtype)
    r = r.contiguous()
    v = r if v is None else v.contiguous()
    m8 = _u8(m)
    ret = torch.empty_like(r)
    # the state the whitening reads: in the accumulation dtype (for GAE it is also the advantages' buffer)
    if mode == 0 or r.dtype != acc:
        x = torch.empty(r.shape, dtype=acc, device=r.device)
    else:
        x = ret
    if r.numel() == 0:
        return x, ret, _partials(0, acc, r.device)
    bn, bt, nb = token_tile(b, t, plan.block)
    grid = (cdiv(b, bn), nb)
    parts = _partials(grid[0] * nb, acc, r.device)
    pc, ps, pm, st = parts.pc, parts.ps, parts.pm, parts.st
    agg = torch.empty(b * nb * 5, dtype=acc, device=r.device) if nb > 1 else ps
    pg, gv, sg, g_ptr = token_discount(gamma, acc, r)
    pl, lv, sl, l_ptr = token_discount(lam if lam is not None else 0.0, acc, r)
    # 8 tokens a thread: at 16 the look-back's tile and maps fill 255 registers (one or two programs an SM)
    warps = plan.warps or min(16, max(4, bn * bt // 256))
    common = dict(
        MODE=mode, CARRY=nb > 1, G_PTR=g_ptr, L_PTR=l_ptr, STORE_RET=mode == 0 or x is not ret,
        BN=bn, BT=bt, NBP=pow2(nb), ACC=_tl(acc), num_warps=warps,
    )  # fmt: skip
    args = (r, v, m8, pg, pl, gv, lv, sg, sl, x, ret, agg, pc, ps, pm, st, _ticket(r.device))
    if nb > 1 and plan.split is Split.LOOKBACK and not _capturing(r.device):
        flags, epoch = _flags(r.device, b * nb)  # one flag per (row, block): core.flag_buffer_size without epochs
        _token_scan_grouped_kernel[grid](*args, flags, epoch, b, t, nb, PHASE=_LOOKBACK, VOLATILE=True, **common)
        return x, ret, parts
    if nb > 1:
        _token_scan_grouped_kernel[grid](*args, ps, 0, b, t, nb, PHASE=_AGGREGATES, VOLATILE=False, **common)
    # rows of one block: the rescan with nothing to carry in (CARRY=False)
    _token_scan_grouped_kernel[grid](*args, ps, 0, b, t, nb, PHASE=_RESCAN, VOLATILE=False, **common)
    return x, ret, parts


def _capturing(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


_FLAGS: dict = {}


def _flags(device: torch.device, size: int):
    """(flags, epoch) for a look-back launch (core.publish_and_wait): a zeroed int32 buffer kept per device and
    stream, and the epoch this call publishes with (one more than the last call's), so the buffer is never cleared
    between calls. Graph captures do not take this path (a replay would reuse its epoch)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    entry = _FLAGS.get(key)
    if entry is None or entry[0].numel() < size or entry[1] >= 2**31 - 2:
        entry = [torch.zeros(max(size, 1024), dtype=torch.int32, device=device), 0]
        _FLAGS[key] = entry
    entry[1] += 1
    return entry[0], entry[1]


def gae(r, v, m, gamma, lam, plan: TokenPlan):
    """Masked GAE: (L in the accumulation dtype, returns, the partial moments of L over the valid tokens)."""
    return _scan(0, r, v, m, gamma, lam, plan)


def reinforce_pp(r, m, gamma, plan: TokenPlan):
    """REINFORCE++: (G in the accumulation dtype (the returns themselves when that is the input dtype),
    returns, the partial moments of G over the valid tokens)."""
    return _scan(1, r, None, m, gamma, None, plan)


_KINDS = {"grpo": 0, "drgrpo": 1, "rloo": 2}


def outcome(r, m, ids, kind: str, epsilon: float):
    """GRPO / Dr. GRPO / RLOO advantages (B, T) of the input dtype, from integer group ids (B,) on r's device."""
    b, t = r.shape
    acc = _acc(r.dtype)
    y = torch.empty_like(r)
    if b == 0 or t == 0:
        return y.zero_()
    r = r.contiguous()
    scores = torch.empty(b, dtype=acc, device=r.device)
    bt = min(1024, max(16, pow2(t)))
    bn = max(1, min(pow2(b), 4096 // bt))
    _row_sum_kernel[(cdiv(b, bn),)](r, scores, b, t, BN=bn, BT=bt, ACC=_tl(acc), num_warps=4)
    ids_sorted, perm = torch.sort(ids, stable=True)  # stable: members are summed in row order, every call
    a = torch.empty(b, dtype=acc, device=r.device)
    eps_ptr = acc == torch.float64
    eps = torch.full((1,), epsilon, dtype=acc, device=r.device) if eps_ptr else epsilon
    _group_kernel[(b,)](ids_sorted, perm, scores, a, b, eps, KIND=_KINDS[kind], BG=64, ACC=_tl(acc), EPS_PTR=eps_ptr,
                        num_warps=2)  # fmt: skip
    bt = min(2048, max(16, pow2(t)))
    bn = max(1, min(pow2(b), 4096 // bt))
    _broadcast_kernel[(cdiv(b, bn), cdiv(t, bt))](a, _u8(m), y, b, t, BN=bn, BT=bt, num_warps=4)
    return y
