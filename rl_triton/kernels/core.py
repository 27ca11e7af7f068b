"""The shared scan core: a chunked first-order linear recurrence over tiles of envs x time.

A program owns ``BN`` envs and walks their rows in chunks of ``BT`` steps, in processing order
(for a reverse recurrence the last chunk first). Inside a chunk time ascends along the tile, so
loads are contiguous, and the pairs ``(a_t, b_t)`` are combined with ``tl.associative_scan``
(``reverse=True`` for reverse recurrences); the state after the chunk (the carry) enters the next
one. Masked elements are set to the identity ``(1, 0)`` so that they neither change the carry nor
depend on what was loaded there.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def linear_combine(a_l, b_l, a_r, b_r):
    # (a_l, b_l) then (a_r, b_r):  x -> a_r * (a_l * x + b_l) + b_r
    return a_l * a_r, a_r * b_l + b_r


@triton.jit
def scan_chunk(b_a, b_b, b_carry, BT: tl.constexpr, REVERSE: tl.constexpr):
    """Inclusive scan of one [BN, BT] chunk (time ascending along axis 1) seeded with the carry
    [BN]: forward, or from the chunk's last slot to its first when REVERSE. Returns (x, new carry,
    the chunk's product of a), the last two being the chunk's aggregate for multi-block scans."""
    b_A, b_B = tl.associative_scan((b_a, b_b), 1, linear_combine, reverse=REVERSE)
    b_x = b_A * b_carry[:, None] + b_B
    if REVERSE:
        b_edge = tl.arange(0, BT)[None, :] == 0
    else:
        b_edge = tl.arange(0, BT)[None, :] == BT - 1
    return b_x, tl.sum(tl.where(b_edge, b_x, 0.0), 1), tl.sum(tl.where(b_edge, b_A, 0.0), 1)


# Multi-block scans. One program per (env block, time block) when rows are long and envs few:
#   PHASE 0: single pass, the program walks the whole row (CPB = all chunks, one time block).
#   PHASE 1: each program scans its time block from a zero state and stores the block's aggregate
#            (A = product of a, B = final state) in [N, NK] buffers; no outputs are written.
#   PHASE 2: each program folds the aggregates of the blocks before it (in processing order) into
#            the state entering its block, rescans the block from that state and writes outputs.
# Inputs are read twice (PHASE 1 and 2) but every program has work: a 1 x 1M row becomes hundreds
# of programs instead of one walking 1M steps. Blocks are numbered in processing order, so for a
# reverse recurrence block 0 holds the last time steps.


@triton.jit
def block_begin(p_agg_a, p_agg_b, o_n, m_n, NK, CPB, T, BT: tl.constexpr, PHASE: tl.constexpr,
                ACC: tl.constexpr, BN: tl.constexpr, NKP: tl.constexpr):  # fmt: skip
    """This program's time block: (block id, first chunk, end chunk, (A, B) of everything before
    the block, A of the block so far = 1). The state entering the block is A * x_init + B (B alone
    when the recurrence starts from 0)."""
    i_k = tl.program_id(1)
    c_lo = i_k * CPB
    c_hi = tl.minimum(c_lo + CPB, tl.cdiv(T, BT))
    b_Apre = tl.full([BN], 1.0, dtype=ACC)
    b_Bpre = tl.zeros([BN], dtype=ACC)
    if PHASE == 2:
        o_k = tl.arange(0, NKP)
        m = m_n[:, None] & (o_k < i_k)[None, :]
        off = o_n.to(tl.int64)[:, None] * NK + o_k[None, :]
        b_A, b_B = tl.associative_scan(
            (tl.load(p_agg_a + off, mask=m, other=1).to(ACC), tl.load(p_agg_b + off, mask=m, other=0).to(ACC)),
            1, linear_combine,
        )  # fmt: skip
        b_last = o_k[None, :] == NKP - 1
        b_Apre = tl.sum(tl.where(b_last, b_A, 0.0), 1)
        b_Bpre = tl.sum(tl.where(b_last, b_B, 0.0), 1)
    return i_k, c_lo, c_hi, b_Apre, b_Bpre, tl.full([BN], 1.0, dtype=ACC)


@triton.jit
def block_end(p_agg_a, p_agg_b, o_n, m_n, i_k, NK, b_A, b_carry, PHASE: tl.constexpr):
    """PHASE 1: store the time block's aggregate (A, B)."""
    if PHASE == 1:
        off = o_n.to(tl.int64) * NK + i_k
        tl.store(p_agg_a + off, b_A, mask=m_n)
        tl.store(p_agg_b + off, b_carry, mask=m_n)


@triton.jit
def env_block(N, T, BN: tl.constexpr):
    """The envs of this program: ids [BN], their mask, and the offset of each row's first element
    (int64: N * T may exceed 2^31)."""
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    return o_n, o_n < N, o_n.to(tl.int64) * T


@triton.jit
def chunk(i_p, T, o_row, m_n, BT: tl.constexpr, REVERSE: tl.constexpr):
    """The ``i_p``-th chunk in processing order (the last chunk of the row first when REVERSE):
    time of each slot [BT] (ascending, so loads are contiguous and vectorise), mask and element
    offsets [BN, BT]."""
    i_c = i_p
    if REVERSE:
        i_c = tl.cdiv(T, BT) - 1 - i_p
    o_t = i_c * BT + tl.arange(0, BT)
    m = m_n[:, None] & (o_t < T)[None, :]
    return o_t, m, o_row[:, None] + o_t[None, :]


@triton.jit
def hp_scalar(hi, lo, ACC: tl.constexpr):
    """Rebuilds a float64 hyper-parameter passed as two float32 halves (Triton passes Python
    floats as float32): exact to ~1e-15 in float64 mode, the float32 value in float32 mode."""
    return tl.cast(hi, ACC) + tl.cast(lo, ACC)


@triton.jit
def load_flag(p_flag, off, mask, ACC: tl.constexpr):
    """A flag in any stored dtype as 0/1 in the accumulation dtype (nonzero means set)."""
    return (tl.load(p_flag + off, mask=mask, other=0) != 0).to(ACC)


@triton.jit(do_not_specialize=["N"])
def linear_scan_kernel(
    p_a,  # [N, T] coefficients a_t (accumulation dtype)
    p_b,  # [N, T] offsets b_t
    p_init,  # [N] initial state x_T (reverse) or x_-1 (forward); unused unless HAS_INIT
    p_x,  # [N, T] output
    N,  # number of envs (rows)
    T,  # sequence length
    REVERSE: tl.constexpr,
    HAS_INIT: tl.constexpr,
    ACC: tl.constexpr,  # accumulation dtype
    BN: tl.constexpr,  # envs per program
    BT: tl.constexpr,  # time steps per chunk
):
    o_n, m_n, o_row = env_block(N, T, BN)
    if HAS_INIT:
        b_carry = tl.load(p_init + o_n, mask=m_n, other=0).to(ACC)
    else:
        b_carry = tl.zeros([BN], dtype=ACC)
    for i_c in range(0, tl.cdiv(T, BT)):
        o_t, m, off = chunk(i_c, T, o_row, m_n, BT, REVERSE)
        b_a = tl.load(p_a + off, mask=m, other=1).to(ACC)
        b_b = tl.load(p_b + off, mask=m, other=0).to(ACC)
        b_x, b_carry, _ = scan_chunk(b_a, b_b, b_carry, BT, REVERSE)
        tl.store(p_x + off, b_x, mask=m)
