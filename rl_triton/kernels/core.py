"""The shared scan core: a chunked first-order linear recurrence over tiles of envs x time.

A program owns ``BN`` envs and walks their rows in chunks of ``BT`` steps, in processing order
(``p = 0, 1, ...``; for a reverse recurrence step ``p`` is time ``T-1-p``, so one forward scan
serves both directions). Inside a chunk the pairs ``(a_p, b_p)`` are combined with
``tl.associative_scan``; the state after the chunk (the carry) enters the next one. Masked
elements are set to the identity ``(1, 0)`` so that they neither change the carry nor depend on
what was loaded there.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def linear_combine(a_l, b_l, a_r, b_r):
    # (a_l, b_l) then (a_r, b_r):  x -> a_r * (a_l * x + b_l) + b_r
    return a_l * a_r, a_r * b_l + b_r


@triton.jit
def scan_chunk(b_a, b_b, b_carry, BT: tl.constexpr):
    """Inclusive scan of one [BN, BT] chunk seeded with the carry [BN]. Returns (x, new carry, the
    chunk's product of a), the last two being the chunk's aggregate for multi-block scans."""
    b_A, b_B = tl.associative_scan((b_a, b_b), 1, linear_combine)
    b_x = b_A * b_carry[:, None] + b_B
    b_last = tl.arange(0, BT)[None, :] == BT - 1
    return b_x, tl.sum(tl.where(b_last, b_x, 0.0), 1), tl.sum(tl.where(b_last, b_A, 0.0), 1)


# Multi-block scans. One program per (env block, time block) when rows are long and envs few:
#   PHASE 0: single pass, the program walks the whole row (CPB = all chunks, one time block).
#   PHASE 1: each program scans its time block from a zero state and stores the block's aggregate
#            (A = product of a, B = final state) in [N, NK] buffers; no outputs are written.
#   (host)   the generic scan kernel runs over the aggregates in processing order: the state after
#            each block.
#   PHASE 2: each program rescans its time block starting from the state after the previous block
#            and writes the outputs.
# Inputs are read twice (PHASE 1 and 2) but every program has work: a 1 x 1M row becomes hundreds
# of programs instead of one walking 1M steps.


@triton.jit
def block_begin(p_state, o_n, m_n, NK, CPB, T, BT: tl.constexpr, PHASE: tl.constexpr, ACC: tl.constexpr,
                BN: tl.constexpr):  # fmt: skip
    """This program's time block: (block id, first chunk, end chunk, carry entering it, A = 1)."""
    i_k = tl.program_id(1)
    c_lo = i_k * CPB
    c_hi = tl.minimum(c_lo + CPB, tl.cdiv(T, BT))
    b_carry = tl.zeros([BN], dtype=ACC)
    if PHASE == 2:
        b_carry = tl.load(p_state + o_n.to(tl.int64) * NK + i_k - 1, mask=m_n & (i_k > 0), other=0).to(ACC)
    return i_k, c_lo, c_hi, b_carry, tl.full([BN], 1.0, dtype=ACC)


@triton.jit
def block_end(p_agg_a, p_agg_b, o_n, m_n, i_k, NK, b_A, b_carry, PHASE: tl.constexpr):
    """PHASE 1: store the time block's aggregate (A, B)."""
    if PHASE == 1:
        off = o_n.to(tl.int64) * NK + i_k
        tl.store(p_agg_a + off, b_A, mask=m_n)
        tl.store(p_agg_b + off, b_carry, mask=m_n)


@triton.jit
def time_offsets(i_c, T, BT: tl.constexpr, REVERSE: tl.constexpr):
    """Time index of each processing slot of chunk ``i_c`` (negative or >= T where masked)."""
    o_p = i_c * BT + tl.arange(0, BT)
    if REVERSE:
        return T - 1 - o_p
    return o_p


@triton.jit
def env_block(N, T, BN: tl.constexpr):
    """The envs of this program: ids [BN], their mask, and the offset of each row's first element
    (int64: N * T may exceed 2^31)."""
    o_n = tl.program_id(0) * BN + tl.arange(0, BN)
    return o_n, o_n < N, o_n.to(tl.int64) * T


@triton.jit
def chunk(i_c, T, o_row, m_n, BT: tl.constexpr, REVERSE: tl.constexpr):
    """Chunk ``i_c`` of the program's rows: time of each slot [BT], mask and element offsets [BN, BT]."""
    o_t = time_offsets(i_c, T, BT, REVERSE)
    m = m_n[:, None] & ((o_t >= 0) & (o_t < T))[None, :]
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


@triton.jit(do_not_specialize=["N", "T"])
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
        b_x, b_carry, _ = scan_chunk(b_a, b_b, b_carry, BT)
        tl.store(p_x + off, b_x, mask=m)
