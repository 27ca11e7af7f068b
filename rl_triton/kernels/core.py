"""The shared scan core: a chunked first-order linear recurrence over tiles of envs x time.

A program owns ``BN`` envs and walks their rows in chunks of ``BT`` steps, in processing order
(for a reverse recurrence the last chunk first). Inside a chunk time ascends in memory order (so
loads are contiguous and vectorise); the pairs ``(a_t, b_t)`` are combined with
``tl.associative_scan`` (plain tiles) or by straight-line code inside groups of 4 or 8 steps and a
forward scan across groups (grouped tiles; see below). The state after the chunk (the carry)
enters the next one. Masked elements are set to the identity ``(1, 0)`` so that they neither
change the carry nor depend on what was loaded there.

Containment (docs/semantics.md): where a map's coefficient is 0 (a done step, or a segment holding one)
the map is the constant ``b``, and the state before it must not be read: ``0 * x + b`` is NaN for a
NaN or infinite ``x`` from another episode. So a map is applied to a state with a select (:func:`_on`),
and the contained scan (CONTAIN) also selects ``b`` in its combines. The coefficients themselves are
finite (the kernels build them so), so only the offsets ``b`` and the states need the selects.

Inside a chunk whose offsets are all finite the combines' selects change nothing (``0 * x + b`` is ``b``
for finite ``x``, but for the sign of a zero ``b``) and cost instructions on every element, so
:func:`scan_rows` tests each chunk (:func:`chunk_non_finite`) and takes the plain combines (plain_combine)
unless an offset is NaN or infinite. Time-major rows are the exception: their programs walk many chunks of 64
steps, where the test and its second path cost more registers and time than the selects (docs/performance.md),
so they take the contained combines (or the late test below). The carry entering a chunk can come from another
episode of the row whatever the chunk holds, so it is always applied with the select, which costs one select per
element.

Where the plan says so (Plan.late), a single-pass or rescan program tests once, after its whole walk
(:func:`late_rows`): plain combines and plain states (STATES off: no select at all) in every chunk, the outputs
stored, then one test, and only where it fails the program's chunks are read again and scanned contained, their
outputs stored over the plain ones. That second pass is a function compiled apart (:func:`_contained_rows`), so
the first pass keeps the registers and load schedule of a plain scan. Plain arithmetic carries a non-finite offset
or carry on to every later state (0 * inf is NaN, even behind a zero coefficient), so the last state of the walk is
finite exactly when every state was, and finite states are the contained scan's. An overflow of the plain partial
sums (coefficients above 1 over long stretches) is not contained, as the products of coefficients never were.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .. import _config
from .plans import Form, Phase

# The tile forms and phases as the kernels' FORM and PHASE constexprs take them (plans.Form, plans.Phase).
PLAIN = tl.constexpr(int(Form.PLAIN))
GROUPS4 = tl.constexpr(int(Form.GROUPS4))
GROUPS8 = tl.constexpr(int(Form.GROUPS8))
ENV_GROUPS = tl.constexpr(int(Form.ENV_GROUPS))
DESCENDING = tl.constexpr(int(Form.DESCENDING))
SINGLE = tl.constexpr(int(Phase.SINGLE))
AGGREGATES = tl.constexpr(int(Phase.AGGREGATES))
RESCAN = tl.constexpr(int(Phase.RESCAN))
LOOKBACK = tl.constexpr(int(Phase.LOOKBACK))
LOOKBACK_EPOCHS = tl.constexpr(int(Phase.LOOKBACK_EPOCHS))


@triton.jit
def linear_combine(a_l, b_l, a_r, b_r):
    # (a_l, b_l) then (a_r, b_r):  x -> a_r * (a_l * x + b_l) + b_r, the constant b_r where a_r == 0
    return a_l * a_r, tl.where(a_r == 0, b_r, a_r * b_l + b_r)


@triton.jit
def linear_combine_next(a_l, b_l, na_l, nb_l, a_r, b_r, na_r, nb_r):
    # Segments L then R. (a, b): the map of the whole segment; (na, nb): the map of the segment
    # without its last element. Associative; an element starts as ((a_t, b_t), identity).
    # Contained as linear_combine: b_l is not read where the map that multiplies it is 0.
    return (a_l * a_r, tl.where(a_r == 0, b_r, a_r * b_l + b_r),
            a_l * na_r, tl.where(na_r == 0, nb_r, na_r * b_l + nb_r))  # fmt: skip


@triton.jit
def plain_combine(a_l, b_l, a_r, b_r):
    # linear_combine without the select: the same bits where every b is finite (0 * b_l + b_r is b_r)
    return a_l * a_r, a_r * b_l + b_r


@triton.jit
def plain_combine_next(a_l, b_l, na_l, nb_l, a_r, b_r, na_r, nb_r):
    # linear_combine_next without the selects
    return a_l * a_r, a_r * b_l + b_r, a_l * na_r, na_r * b_l + nb_r


@triton.jit
def _on(A, B, x, ZERO: tl.constexpr = False, CONTAIN: tl.constexpr = True):
    """The map (A, B) applied to the state x: A x + B, or B where A == 0 (x not read; CONTAIN). ZERO: x is
    known to be 0, so B, broadcast to x (A x + B only adds zeros to it, A being finite)."""
    if ZERO:
        y, _x = tl.broadcast(B, x)
    elif CONTAIN:
        y = tl.where(A == 0, B, A * x + B)
    else:
        y = A * x + B
    return y


@triton.jit
def non_finite(x):
    """Whether any entry of the tile x (rank 1 to 3) is NaN or infinite: x * 0 is 0 for finite x and NaN
    otherwise, so the sum of those is 0 exactly when every entry is finite."""
    z = x * 0.0
    if len(z.shape) == 3:
        z = tl.sum(z, 2)
    if len(z.shape) == 2:
        z = tl.sum(z, 1)
    return tl.sum(z, 0) != 0


@triton.jit
def in_thread_zeros(x):
    """x * 0 (a rank-2 or -3 tile) summed over the axis a thread holds (the last: a group's steps, or 4
    consecutive steps of a plain tile), with no exchange between threads: 0 where those entries are finite, else
    NaN. Their sum over the rest is what :func:`non_finite` of x tests."""
    z = x * 0.0
    if len(z.shape) == 2:
        z = tl.reshape(z, [z.shape[0], z.shape[1] // 4, 4])
    return tl.sum(z, len(z.shape) - 1)


@triton.jit
def state_on(A, B, x):
    """:func:`_on`: the state A x + B entering a block from the blocks before it, on a seed x [BN]."""
    return _on(A, B, x)


# Tile forms, chosen per launch by the constexpr FORM (plans.py decides from measurements):
#
# * PLAIN: [BN, BT], time ascending along the tile; one tl.associative_scan along it (reverse=True for
#   reverse recurrences).
# * GROUPS4, GROUPS8 (group-major; reverse recurrences only): [G, BN, S], each chunk as G = BT / S groups of
#   S = 4 or 8 consecutive steps (one 16-byte vector load per row segment: 4 float32, 8 2-byte floats), the
#   groups numbered in processing order, the latest first. Inside a group the steps are combined by
#   straight-line code; a forward tl.associative_scan along axis 0 combines the group aggregates. The carry
#   is kept as a [G, BN] tile (carry_tile).
# * ENV_GROUPS (chunks of <= 8 steps): [BN, G, 4], groups along axis 1, so a thread holds a whole short row
#   and the scan across its groups stays in its registers.
# * DESCENDING (reverse recurrences on time-major rows): [BN, BT], time descending along the tile, so the
#   reverse recurrence is a forward scan; on time-major rows the loads run along the envs either way.
#
# Why: Triton lowers tl.associative_scan(reverse=True) with lane-reversing shuffles of every element, which
# made a reverse recurrence ~1.5x slower than a forward one (docs/performance.md); groups along axis 0,
# because with [BN, G, 4] tiles of long chunks Triton put its lanes along the envs and broadcast the carry
# through shared memory. Forward recurrences have no reverse scan to avoid and use plain tiles.


@triton.jit
def _split4(x):
    """[..., 4] -> the planes x[..., 0], ..., x[..., 3]."""
    y0, y1 = tl.split(tl.reshape(x, x.shape[:-1] + [2, 2]))  # y_k[..., i] = x[..., 2 i + k]
    x0, x2 = tl.split(y0)
    x1, x3 = tl.split(y1)
    return x0, x1, x2, x3


@triton.jit
def _join4(x0, x1, x2, x3):
    """Inverse of :func:`_split4`."""
    z = tl.join(tl.join(x0, x2), tl.join(x1, x3))  # z[..., i, k] = x[..., 2 i + k]
    return tl.reshape(z, z.shape[:-2] + [4])


@triton.jit
def _halves(x):
    """[..., 8] -> ([..., 4] of the even slots, [..., 4] of the odd ones)."""
    return tl.split(tl.reshape(x, x.shape[:-1] + [4, 2]))


@triton.jit
def _join8(x0, x1, x2, x3, x4, x5, x6, x7):
    """The planes x0..x7 -> [..., 8]."""
    z = tl.join(_join4(x0, x2, x4, x6), _join4(x1, x3, x5, x7))  # z[..., i, k] = x[..., 2 i + k]
    return tl.reshape(z, z.shape[:-2] + [8])


@triton.jit
def _suffix4(a0, a1, a2, a3, b0, b1, b2, b3, CONTAIN: tl.constexpr):
    """Maps (A_j, B_j) from the state after step 3 to the state at step j of 4 steps in processing
    order 3, 2, 1, 0 (x_j = a_j x_{j+1} + b_j)."""
    A3, B3 = a3, b3
    A2, B2 = a2 * A3, _on(a2, b2, B3, False, CONTAIN)
    A1, B1 = a1 * A2, _on(a1, b1, B2, False, CONTAIN)
    A0, B0 = a0 * A1, _on(a0, b0, B1, False, CONTAIN)
    return A0, A1, A2, A3, B0, B1, B2, B3


@triton.jit
def _group_maps(b_a, b_b, CONTAIN: tl.constexpr):
    """Grouped [G, BN, S] chunk (S = 4 or 8 steps per group): the maps (A_j, B_j), j < S, from the
    state entering each group (after its later steps) to the state at each of its steps, as planes
    [G, BN]: (A_0, ..., A_{S-1}, B_0, ..., B_{S-1}); for S = 4 the last four of each are unused."""
    if b_a.shape[2] == 8:
        ae, ao = _halves(b_a)
        be, bo = _halves(b_b)
        a0, a2, a4, a6 = _split4(ae)
        a1, a3, a5, a7 = _split4(ao)
        b0, b2, b4, b6 = _split4(be)
        b1, b3, b5, b7 = _split4(bo)
        A4, A5, A6, A7, B4, B5, B6, B7 = _suffix4(a4, a5, a6, a7, b4, b5, b6, b7, CONTAIN)
        L0, L1, L2, L3, M0, M1, M2, M3 = _suffix4(a0, a1, a2, a3, b0, b1, b2, b3, CONTAIN)  # from the state at step 4
        A0, A1, A2, A3 = L0 * A4, L1 * A4, L2 * A4, L3 * A4
        B0, B1 = _on(L0, M0, B4, False, CONTAIN), _on(L1, M1, B4, False, CONTAIN)
        B2, B3 = _on(L2, M2, B4, False, CONTAIN), _on(L3, M3, B4, False, CONTAIN)
    else:
        a0, a1, a2, a3 = _split4(b_a)
        b0, b1, b2, b3 = _split4(b_b)
        A0, A1, A2, A3, B0, B1, B2, B3 = _suffix4(a0, a1, a2, a3, b0, b1, b2, b3, CONTAIN)
        A4, A5, A6, A7, B4, B5, B6, B7 = A3, A3, A3, A3, B3, B3, B3, B3
    return A0, A1, A2, A3, A4, A5, A6, A7, B0, B1, B2, B3, B4, B5, B6, B7


@triton.jit
def _scan_groups(A0, B0, AXIS: tl.constexpr, CONTAIN: tl.constexpr):
    """The inclusive and exclusive maps of the group aggregates (A0, B0) along AXIS, in processing order."""
    ones, zeros = tl.full(A0.shape, 1.0, A0.dtype), tl.zeros(B0.shape, B0.dtype)
    if CONTAIN:
        iA, iB, nA, nB = tl.associative_scan((A0, B0, ones, zeros), AXIS, linear_combine_next)
    else:
        iA, iB, nA, nB = tl.associative_scan((A0, B0, ones, zeros), AXIS, plain_combine_next)
    return iA, iB, nA, nB


@triton.jit
def _group_enter(A0, B0, b_carry, ZERO: tl.constexpr, CONTAIN: tl.constexpr, STATES: tl.constexpr):
    """From the group aggregates (A0, B0) [G, BN] and the carry tile [G, BN] (see
    :func:`carry_tile`): the state entering each group, the new carry tile and the chunk's product of
    a [BN]. One forward scan across the groups (numbered in processing order)."""
    iA, iB, nA, nB = _scan_groups(A0, B0, 0, CONTAIN)
    b_enter = _on(nA, nB, b_carry, ZERO, STATES)
    # the chunk's aggregate, kept broadcast over the groups (one reduction, no [BN] -> tile broadcast)
    b_Ac, b_Bc = _edges(iA, iB, 0, False, True)
    return b_enter, _on(b_Ac, b_Bc, b_carry, ZERO, STATES), tl.sum(b_Ac, 0)  # [1, BN] -> [BN]


@triton.jit
def _group_states(b_a, b_b, b_carry, ZERO: tl.constexpr, CONTAIN: tl.constexpr, STATES: tl.constexpr):
    """The states of a grouped chunk, as tiles: (x, x one step earlier in processing order, new
    carry tile, chunk's product of a)."""
    A0, A1, A2, A3, A4, A5, A6, A7, B0, B1, B2, B3, B4, B5, B6, B7 = _group_maps(b_a, b_b, CONTAIN)
    c, b_carry_new, b_Ac = _group_enter(A0, B0, b_carry, ZERO, CONTAIN, STATES)
    x0, x1 = _on(A0, B0, c, False, STATES), _on(A1, B1, c, False, STATES)
    x2, x3 = _on(A2, B2, c, False, STATES), _on(A3, B3, c, False, STATES)
    if b_a.shape[2] == 8:
        x4, x5 = _on(A4, B4, c, False, STATES), _on(A5, B5, c, False, STATES)
        x6, x7 = _on(A6, B6, c, False, STATES), _on(A7, B7, c, False, STATES)
        b_x = _join8(x0, x1, x2, x3, x4, x5, x6, x7)
        b_xn = _join8(x1, x2, x3, x4, x5, x6, x7, c)
    else:
        b_x = _join4(x0, x1, x2, x3)
        b_xn = _join4(x1, x2, x3, c)
    return b_x, b_xn, b_carry_new, b_Ac


@triton.jit
def _env_group_states(b_a, b_b, b_carry, ZERO: tl.constexpr, CONTAIN: tl.constexpr, STATES: tl.constexpr):
    """:func:`_group_states` of an env-major [BN, G, 4] chunk (groups along axis 1, carry [BN])."""
    a0, a1, a2, a3 = _split4(b_a)
    b0, b1, b2, b3 = _split4(b_b)
    A0, A1, A2, A3, B0, B1, B2, B3 = _suffix4(a0, a1, a2, a3, b0, b1, b2, b3, CONTAIN)
    iA, iB, nA, nB = _scan_groups(A0, B0, 1, CONTAIN)
    c = _on(nA, nB, b_carry[:, None], ZERO, STATES)
    b_Ac, b_Bc = _edges(iA, iB, 1, False, False)
    x0, x1 = _on(A0, B0, c, False, STATES), _on(A1, B1, c, False, STATES)
    x2, x3 = _on(A2, B2, c, False, STATES), _on(A3, B3, c, False, STATES)
    return _join4(x0, x1, x2, x3), _join4(x1, x2, x3, c), _on(b_Ac, b_Bc, b_carry, ZERO, STATES), b_Ac


@triton.jit
def carry_tile(b_carry, BT: tl.constexpr, FORM: tl.constexpr):
    """The carry [BN] in the form the chunk scan of the tile form takes and returns: unchanged but for
    group-major tiles, which carry it broadcast to [G, BN] (a broadcast inside every chunk went through
    shared memory with a full row per thread)."""
    if FORM == GROUPS4:
        b_carry = tl.broadcast_to(b_carry[None, :], [BT // 4, b_carry.shape[0]])
    elif FORM == GROUPS8:
        b_carry = tl.broadcast_to(b_carry[None, :], [BT // 8, b_carry.shape[0]])
    return b_carry


@triton.jit
def carry_row(b_carry, FORM: tl.constexpr):
    """Inverse of :func:`carry_tile`: the carry as [BN]."""
    if FORM == GROUPS4 or FORM == GROUPS8:
        b_carry = _edge(b_carry, 0, True, False)
    return b_carry


@triton.jit
def _at_edge(b_y, AXIS: tl.constexpr, FIRST: tl.constexpr):
    """Whether a slot of ``b_y`` (rank 1 or 2) is the first (FIRST) or last along AXIS, shaped to broadcast
    against it."""
    o = tl.arange(0, b_y.shape[AXIS])
    if len(b_y.shape) == 2:
        if AXIS == 0:
            o = o[:, None]
        else:
            o = o[None, :]
    if FIRST:
        b_at = o == 0
    else:
        b_at = o == b_y.shape[AXIS] - 1
    return b_at


@triton.jit
def _edge(b_y, AXIS: tl.constexpr, FIRST: tl.constexpr, KEEP: tl.constexpr):
    """The value at the first (FIRST) or last slot of ``b_y`` along AXIS (rank 1 or 2), per the other
    axis; the reduced axis kept as size 1 with KEEP. The last processed slot of a plain [BN, BT] tile
    is the first when the recurrence runs in reverse."""
    return tl.sum(tl.where(_at_edge(b_y, AXIS, FIRST), b_y, 0.0), AXIS, keep_dims=KEEP)


@triton.jit
def _add_pairs(x_l, y_l, x_r, y_r):
    return x_l + x_r, y_l + y_r


@triton.jit
def _edges(b_x, b_y, AXIS: tl.constexpr, FIRST: tl.constexpr, KEEP: tl.constexpr):
    """:func:`_edge` of two tiles of one shape in one reduction: an aggregate's (A, B) cross the warps
    through shared memory once, not twice (a barrier pair fewer per chunk; docs/performance.md). Not
    for the time-major look-back (its folds and aggregates) nor walked plain tiles' carries, where the pair took
    more registers."""
    b_at = _at_edge(b_x, AXIS, FIRST)
    return tl.reduce((tl.where(b_at, b_x, 0.0), tl.where(b_at, b_y, 0.0)), AXIS, _add_pairs, keep_dims=KEEP)


@triton.jit
def _plain_scan(b_a, b_b, REVERSE: tl.constexpr, FORM: tl.constexpr, CONTAIN: tl.constexpr):
    """(A, B) of a plain tile's chunk from 0, scanned along time in processing order (descending tiles hold
    processing order, so they scan forward); contained combines with CONTAIN."""
    if CONTAIN:
        b_A, b_B = tl.associative_scan((b_a, b_b), 1, linear_combine, reverse=REVERSE and FORM == PLAIN)
    else:
        b_A, b_B = tl.associative_scan((b_a, b_b), 1, plain_combine, reverse=REVERSE and FORM == PLAIN)
    return b_A, b_B


@triton.jit
def scan_chunk(b_a, b_b, b_carry, BT: tl.constexpr, REVERSE: tl.constexpr, FORM: tl.constexpr,
               ZERO: tl.constexpr = False, CONTAIN: tl.constexpr = True, STATES: tl.constexpr = True):  # fmt: skip
    """Scan of one chunk (see :func:`chunk`) seeded with the carry [BN] (the state before the chunk
    in processing order). Returns (x, new carry, the chunk's product of a), the last two being the
    chunk's aggregate for multi-block scans. ZERO: the carry is known to be 0 (a block's first chunk
    without a seed), so it is not applied. CONTAIN: selects in the combines too, for a chunk with a
    non-finite offset (the module docstring); the carry is applied with a select unless STATES is off (states
    then applied by plain arithmetic: only where the outputs are tested afterwards, :func:`late_rows`)."""
    if FORM == GROUPS4 or FORM == GROUPS8:
        b_x, _xn, b_carry_new, b_Ac = _group_states(b_a, b_b, b_carry, ZERO, CONTAIN, STATES)
    elif FORM == ENV_GROUPS:
        b_x, _xn, b_carry_new, b_Ac = _env_group_states(b_a, b_b, b_carry, ZERO, CONTAIN, STATES)
    else:
        b_A, b_B = _plain_scan(b_a, b_b, REVERSE, FORM, CONTAIN)
        b_x = _on(b_A, b_B, b_carry[:, None], ZERO, STATES)
        b_carry_new = _edge(b_x, 1, REVERSE and FORM == PLAIN, False)
        b_Ac = _edge(b_A, 1, REVERSE and FORM == PLAIN, False)
    return b_x, b_carry_new, b_Ac


@triton.jit
def scan_chunk_next(b_a, b_b, b_carry, BT: tl.constexpr, REVERSE: tl.constexpr, FORM: tl.constexpr,
                    ZERO: tl.constexpr = False, CONTAIN: tl.constexpr = True,
                    STATES: tl.constexpr = True):  # fmt: skip
    """:func:`scan_chunk` of a recurrence that also returns the state one step earlier in processing
    order at each slot (x_{t+1} of a reverse recurrence; the carry at the chunk's first processed
    slot), which V-trace and Retrace need in their epilogue: no second prologue at shifted steps."""
    if FORM == GROUPS4 or FORM == GROUPS8:
        b_x, b_xn, b_carry_new, b_Ac = _group_states(b_a, b_b, b_carry, ZERO, CONTAIN, STATES)
    elif FORM == ENV_GROUPS:
        b_x, b_xn, b_carry_new, b_Ac = _env_group_states(b_a, b_b, b_carry, ZERO, CONTAIN, STATES)
    else:
        ones, zeros = tl.full(b_a.shape, 1.0, b_a.dtype), tl.zeros(b_b.shape, b_b.dtype)
        if CONTAIN:
            b_A, b_B, b_nA, b_nB = tl.associative_scan(
                (b_a, b_b, ones, zeros), 1, linear_combine_next, reverse=REVERSE and FORM == PLAIN
            )
        else:
            b_A, b_B, b_nA, b_nB = tl.associative_scan(
                (b_a, b_b, ones, zeros), 1, plain_combine_next, reverse=REVERSE and FORM == PLAIN
            )
        b_x = _on(b_A, b_B, b_carry[:, None], ZERO, STATES)
        b_xn = _on(b_nA, b_nB, b_carry[:, None], ZERO, STATES)
        b_carry_new = _edge(b_x, 1, REVERSE and FORM == PLAIN, False)
        b_Ac = _edge(b_A, 1, REVERSE and FORM == PLAIN, False)
    return b_x, b_xn, b_carry_new, b_Ac


@triton.jit
def scan_states(b_a, b_b, b_carry, BT: tl.constexpr, REVERSE: tl.constexpr, FORM: tl.constexpr, ZERO: tl.constexpr,
                NEXT: tl.constexpr, CONTAIN: tl.constexpr, STATES: tl.constexpr = True):  # fmt: skip
    """:func:`scan_chunk_next` with NEXT, else :func:`scan_chunk` with x standing for the states one step
    earlier: (x, xn, new carry, the chunk's product of a)."""
    if NEXT:
        b_x, b_xn, b_carry, b_Ac = scan_chunk_next(b_a, b_b, b_carry, BT, REVERSE, FORM, ZERO, CONTAIN, STATES)
    else:
        b_x, b_carry, b_Ac = scan_chunk(b_a, b_b, b_carry, BT, REVERSE, FORM, ZERO, CONTAIN, STATES)
        b_xn = b_x
    return b_x, b_xn, b_carry, b_Ac


# Multi-block scans: one program per (env block, time block) when rows are long and envs few. PHASE:
#   SINGLE: the program walks its whole row (CPB = all chunks, one time block).
#   AGGREGATES, RESCAN (two passes): each program scans its time block from a zero state and stores the
#     block's aggregate (A = product of a, B = final state) in [N, NK] buffers, no outputs; then each folds
#     the aggregates of the blocks before it (in processing order) into the state entering its block, and
#     rescans the block from that state. Inputs are read twice, but every program has work.
#   LOOKBACK, LOOKBACK_EPOCHS: one launch, one chunk per time block: each program scans its chunk,
#     publishes its aggregate, learns the state entering its block from the blocks before it
#     (:func:`lookback`) and applies it to the chunk still in registers; blocks are numbered by program id.
#     With epochs the flags are kept from call to call instead of zeroed for each (plans.EPOCH_MAX_BLOCKS).
# ONE (constexpr, any phase): the program's block is one chunk. The chunk loop then has constant bounds, so
# the compiler drops it, and with it the new carry and the chunk's aggregate that nothing reads.
# Blocks are numbered in processing order, so for a reverse recurrence block 0 holds the last time steps.


# The look-back's flag buffer (launch._scratch), int32: LOOKBACK, zeroed for each call: the N * NK flags (one
# per time block); LOOKBACK_EPOCHS, kept from call to call: N epochs (one per row, padded to whole 128-byte
# lines), then the flags.
EPOCH_LINE = 32
_EPOCH_LINE = tl.constexpr(EPOCH_LINE)


def flag_buffer_size(n: int, nk: int, epochs: bool) -> int:
    """Elements of the flag buffer of a look-back over ``n`` rows of ``nk`` blocks (LOOKBACK_EPOCHS: ``epochs``)."""
    return (-(-n // EPOCH_LINE) * EPOCH_LINE if epochs else 0) + n * nk


@triton.jit
def block_begin(p_agg_a, p_agg_b, i_k, o_n, m_n, NK, CPB, T, BT: tl.constexpr, PHASE: tl.constexpr,
                ACC: tl.constexpr, BN: tl.constexpr, NKP: tl.constexpr, ONE: tl.constexpr):  # fmt: skip
    """Time block ``i_k``: (chunk loop bounds, offset added to the loop index to get the chunk,
    (A, B) of everything before the block, A of the block so far = 1). The state entering the block
    is A * x_init + B (B alone when the recurrence starts from 0). Look-back blocks learn (A, B) later, from
    :func:`lookback`. ONE (the block is one chunk): constant loop bounds, so the compiler drops the
    loop of one iteration and the carry and aggregate reductions nothing reads after it."""
    if ONE:
        c_lo = 0
        c_hi = 1
        if PHASE == SINGLE:
            c_off = 0
        else:
            c_off = i_k  # one chunk per block
    else:
        c_lo = i_k * CPB
        c_hi = tl.minimum(c_lo + CPB, tl.cdiv(T, BT))
        c_off = 0
    b_Apre = tl.full([BN], 1.0, dtype=ACC)
    b_Bpre = tl.zeros([BN], dtype=ACC)
    if PHASE == RESCAN:
        o_k = tl.arange(0, NKP)
        m = m_n[:, None] & (o_k < i_k)[None, :]
        off = o_n.to(tl.int64)[:, None] * NK + o_k[None, :]
        b_A, b_B = tl.associative_scan(
            (tl.load(p_agg_a + off, mask=m, other=1).to(ACC), tl.load(p_agg_b + off, mask=m, other=0).to(ACC)),
            1, linear_combine,
        )  # fmt: skip
        b_Apre, b_Bpre = _edges(b_A, b_B, 1, False, False)
    return c_lo, c_hi, c_off, b_Apre, b_Bpre, tl.full([BN], 1.0, dtype=ACC)


@triton.jit
def block_end(p_agg_a, p_agg_b, o_n, m_n, i_k, NK, b_A, b_carry, PHASE: tl.constexpr):
    """AGGREGATES: store the time block's aggregate (A, B)."""
    if PHASE == AGGREGATES:
        off = o_n.to(tl.int64) * NK + i_k
        tl.store(p_agg_a + off, b_A, mask=m_n)
        tl.store(p_agg_b + off, b_carry, mask=m_n)


@triton.jit
def _fold_published(p_agg_a, p_agg_b, p_flag, o_b, m_b, LEVEL, WRAP: tl.constexpr):
    """Wait until the blocks ``o_b`` (where ``m_b``) have published their aggregates of level ``LEVEL``
    (the row's epoch in this call plus 1 or 2), then fold them in order: (A, B) [1], the identity
    where none is selected. A flag counts once it is at LEVEL or past it; with WRAP (epochs, which may
    pass 2^31: see lookback) compared as the int32 difference flag - LEVEL, which wraps."""
    f = tl.load(p_flag + o_b, mask=m_b, other=LEVEL, volatile=True)
    if WRAP:
        while tl.min(f - LEVEL, 0) < 0:
            f = tl.load(p_flag + o_b, mask=m_b, other=LEVEL, volatile=True)
        m_b = m_b & (f - LEVEL >= 0)  # the loads below depend on the flags, so they cannot run ahead of them
    else:
        while tl.min(f, 0) < LEVEL:
            f = tl.load(p_flag + o_b, mask=m_b, other=LEVEL, volatile=True)
        m_b = m_b & (f >= LEVEL)
    b_A, b_B = tl.associative_scan(
        (tl.load(p_agg_a + o_b, mask=m_b, other=1, volatile=True),
         tl.load(p_agg_b + o_b, mask=m_b, other=0, volatile=True)),
        0, linear_combine,
    )  # fmt: skip
    return _edges(b_A, b_B, 0, False, True)


@triton.jit
def lookback(p_agg_a, p_agg_b, p_flag, i_n, i_k, N, NK, b_Al, b_Bl, E, ACC: tl.constexpr, S: tl.constexpr,
             EPOCHS: tl.constexpr):  # fmt: skip
    """The (A, B) of everything before time block ``i_k`` of env ``i_n`` (one env per program),
    given the block's own aggregate (b_Al, b_Bl) [1]. Deterministic: the blocks are cut into windows
    of S (at most S windows per row: the launcher picks S >= sqrt(NK)); the last block of each window
    publishes the window's aggregate, which depends on that window alone; the state before block k
    is the fold of the aggregates of the windows before k's, then of the blocks of k's window before
    k, each by a tl.associative_scan of fixed shape. Which values are combined, and in which order,
    depends only on k, never on which blocks happened to finish first (a classic decoupled
    look-back would make the rounding, and so the outputs, vary from call to call); and no block
    waits on a chain of windows, only on the blocks and windows before it.

    [2, N, NK] buffers: p_agg_* [0] block aggregates, [1] window aggregates (stored at the window's
    last block). p_flag: the flag buffer (EPOCH_LINE above); the row's flags hold E + 1 once the
    block's aggregate is stored, E + 2 once its window's is, where E is the row's epoch in this call
    (EPOCHS, LOOKBACK_EPOCHS: read by :func:`env_block`; 0 in LOOKBACK, whose buffers are zeroed); what an
    earlier call left there is at most E (and not 2^31 below it: every call writes every flag of its
    rows), so it reads as unpublished. A block publishes its aggregate (and its window's) before it
    waits, and waits only for blocks numbered before it by program id, which relies on the GPU starting
    programs in id order (env_block).

    The row's last block advances the row's epoch by 2 once its waits are over: every block of the row
    has published a flag computed from E by then (directly, or through its window's last block, which
    published after seeing them), so has read E. The next call on the buffer then needs no zeroed
    flags (LOOKBACK_EPOCHS, launch._lookback_flags)."""
    o1 = tl.arange(0, 1)
    if EPOCHS:
        p_epoch = p_flag + i_n
        p_flag += ((N + _EPOCH_LINE - 1) // _EPOCH_LINE) * _EPOCH_LINE
    row = i_n.to(tl.int64) * NK
    inc = N.to(tl.int64) * NK
    me = row + i_k + o1
    tl.store(p_agg_a + me, b_Al)
    tl.store(p_agg_b + me, b_Bl)
    tl.atomic_xchg(p_flag + me, tl.full([1], 1, tl.int32) + E, sem="release")
    # the blocks of this window before this one
    o_s = tl.arange(0, S)
    base = (i_k // S) * S
    wA, wB = _fold_published(p_agg_a + row, p_agg_b + row, p_flag + row, base + o_s, base + o_s < i_k, E + 1, EPOCHS)
    if i_k % S == S - 1:  # the window's last block: publish the window's aggregate
        b_WA, b_WB = linear_combine(wA, wB, b_Al, b_Bl)
        tl.store(p_agg_a + inc + me, b_WA)
        tl.store(p_agg_b + inc + me, b_WB)
        tl.atomic_xchg(p_flag + me, tl.full([1], 2, tl.int32) + E, sem="release")
    # the windows before this one (window j's aggregate sits at its last block, j * S + S - 1)
    b_pA = tl.full([1], 1.0, ACC)
    b_pB = tl.zeros([1], ACC)
    if base > 0:
        o_v = o_s * S + (S - 1)
        b_pA, b_pB = _fold_published(
            p_agg_a + inc + row, p_agg_b + inc + row, p_flag + row, o_v, o_s < i_k // S, E + 2, EPOCHS
        )
    if EPOCHS:
        if i_k == NK - 1:  # the row's last block: every block of the row has read E (above)
            tl.store(p_epoch, E + 2)
    return linear_combine(b_pA, b_pB, wA, wB)


def tm_flag_buffer_size(nb: int, nk: int, w: int) -> int:
    """Elements (int32) of the flag buffer of a look-back over ``nb`` blocks of ``w`` time-major envs, ``nk`` time
    blocks each (:func:`lookback_envs`): the blocks' epochs, in whole lines (so the words after them are 8-byte
    aligned), then four planes of nb * nk * w tagged words (int64)."""
    return -(-max(nb, 1) // EPOCH_LINE) * EPOCH_LINE + 8 * nb * nk * w


@triton.jit
def _tagged(x, tag):
    """A float32 [W] as words (int64) tagged with ``tag`` (int32) in their high half (:func:`lookback_envs`)."""
    return (x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (tag.to(tl.int64) << 32)


@triton.jit
def _tag_late(wa, wb, m, LEVEL):
    """Per word pair, how far its tags are past LEVEL (the int32 difference, which wraps); 0 where not ``m``."""
    return tl.where(m, tl.minimum((wa >> 32).to(tl.int32) - LEVEL, (wb >> 32).to(tl.int32) - LEVEL), 0)


@triton.jit
def _fold_tagged(p_a, p_b, o_b, m_b, LEVEL, W: tl.constexpr):
    """:func:`_fold_published` over blocks of W envs whose aggregates are tagged words (:func:`_tagged`): wait
    until the words of the blocks ``o_b`` [S] (where ``m_b``) carry LEVEL or later, then fold them in order.
    Returns (A, B) [W]."""
    off = o_b.to(tl.int64)[:, None] * W + tl.arange(0, W)[None, :]
    m = m_b[:, None] & (off >= 0)  # (off >= 0: always true) broadcasts the mask to [S, W]
    pending = True
    while pending:
        wa = tl.load(p_a + off, mask=m, other=0, volatile=True)
        wb = tl.load(p_b + off, mask=m, other=0, volatile=True)
        pending = tl.min(tl.min(_tag_late(wa, wb, m, LEVEL), 1), 0) < 0
    # Loaded once more after the wait: the wait's reduction reads one copy of each word, but where the layout
    # holds a word in several threads the copy folded below may be another, loaded before the word was published
    # (stale aggregates in about one call in ten on an H200). After the wait's barrier every copy is current.
    wa = tl.load(p_a + off, mask=m, other=0, volatile=True)
    wb = tl.load(p_b + off, mask=m, other=0, volatile=True)
    b_A, b_B = tl.associative_scan(
        (tl.where(m, wa.to(tl.int32).to(tl.float32, bitcast=True), 1.0),
         tl.where(m, wb.to(tl.int32).to(tl.float32, bitcast=True), 0.0)),
        0, linear_combine,
    )  # fmt: skip
    return _edge(b_A, 0, False, False), _edge(b_B, 0, False, False)


@triton.jit
def lookback_envs(p_flag, i_n, i_k, N, NK, b_Al, b_Bl, E, S: tl.constexpr, EPOCHS: tl.constexpr):
    """:func:`lookback` for programs of W envs (time-major rows, float32 aggregates): the (A, B) [W] of
    everything before time block ``i_k`` of env block ``i_n``, given the block's own (b_Al, b_Bl) [W]. The same
    windows, order of folds and epochs (read from and advanced in p_flag[i_n]).

    Each aggregate is published as one word: its float32 bits, tagged with E + 1 (block) or E + 2 (window) in
    the high half, stored once, whichever thread holds it; a reader spins on volatile loads of the words
    themselves until every tag it needs is current. No flag is published apart from the data, so nothing
    depends on the order in which different threads' stores reach memory: a flag released by one thread
    after a barrier does not make the other threads' aggregate stores visible at GPU scope, which is why the
    first form of this look-back (docs/design.md) read stale aggregates. Buffer
    (:func:`tm_flag_buffer_size`): the epochs of the cdiv(N, W) env blocks, then the words of the planes
    [block A, block B, window A, window B] x env blocks x NK x W, zeroed once (LOOKBACK_EPOCHS) or per call (LOOKBACK).
    Every call writes every block word of its rows, and the window words its readers read."""
    W: tl.constexpr = b_Al.shape[0]
    tl.static_assert(b_Al.dtype == tl.float32, "time-major look-back: float32 aggregates")
    NB = tl.cdiv(N, W)
    p_w = (p_flag + ((NB + _EPOCH_LINE - 1) // _EPOCH_LINE) * _EPOCH_LINE).to(tl.pointer_type(tl.int64))
    plane = NB.to(tl.int64) * NK * W
    row = i_n.to(tl.int64) * NK * W
    me = row + i_k * W + tl.arange(0, W)
    tl.store(p_w + me, _tagged(b_Al, E + 1))
    tl.store(p_w + plane + me, _tagged(b_Bl, E + 1))
    # the blocks of this window before this one
    o_s = tl.arange(0, S)
    base = (i_k // S) * S
    wA, wB = _fold_tagged(p_w + row, p_w + plane + row, base + o_s, base + o_s < i_k, E + 1, W)
    if i_k % S == S - 1:  # the window's last block: publish the window's aggregate
        b_WA, b_WB = linear_combine(wA, wB, b_Al, b_Bl)
        tl.store(p_w + 2 * plane + me, _tagged(b_WA, E + 2))
        tl.store(p_w + 3 * plane + me, _tagged(b_WB, E + 2))
    # the windows before this one (window j's aggregate sits at its last block, j * S + S - 1)
    b_pA = tl.full([W], 1.0, tl.float32)
    b_pB = tl.zeros([W], tl.float32)
    if base > 0:
        b_pA, b_pB = _fold_tagged(p_w + 2 * plane + row, p_w + 3 * plane + row, o_s * S + (S - 1), o_s < i_k // S,
                                  E + 2, W)  # fmt: skip
    if EPOCHS:
        if i_k == NK - 1:  # the row's last block: every block of the row has read E (see lookback)
            tl.store(p_flag + i_n, E + 2)
    return linear_combine(b_pA, b_pB, wA, wB)


@triton.jit
def lookback_prefix(b_a, b_b, p_agg_a, p_agg_b, p_flag, o_n, i_k, E, N, NK, BT: tl.constexpr, REVERSE: tl.constexpr,
                    FORM: tl.constexpr, ACC: tl.constexpr, S: tl.constexpr, EPOCHS: tl.constexpr,
                    CONTAIN: tl.constexpr):  # fmt: skip
    """Look-back phases (one chunk per time block): the chunk's aggregate from a scan of the (a, b) already
    in registers (contained with CONTAIN), then :func:`lookback` (one env per program) or
    :func:`lookback_envs` (blocks of time-major envs). Returns (A, B) of everything before the block, [1] or
    [BN]."""
    b_Al, b_Bl = chunk_aggregate(b_a, b_b, o_n, BT, REVERSE, FORM, ACC, CONTAIN)
    if o_n.shape[0] == 1:
        b_A, b_B = lookback(p_agg_a, p_agg_b, p_flag, tl.sum(o_n, 0), i_k, N, NK, b_Al, b_Bl, E, ACC, S, EPOCHS)
    else:
        b_A, b_B = lookback_envs(p_flag, tl.min(o_n, 0) // o_n.shape[0], i_k, N, NK, b_Al, b_Bl, E, S, EPOCHS)
    return b_A, b_B


@triton.jit
def chunk_aggregate(b_a, b_b, o_n, BT: tl.constexpr, REVERSE: tl.constexpr, FORM: tl.constexpr, ACC: tl.constexpr,
                    CONTAIN: tl.constexpr):  # fmt: skip
    """The chunk's aggregate (product of a, final state from 0), each [BN] (o_n: the program's env ids)."""
    if FORM == GROUPS4 or FORM == GROUPS8:  # from the scan across groups, without a carry tile to reduce again
        A0, A1, A2, A3, A4, A5, A6, A7, B0, B1, B2, B3, B4, B5, B6, B7 = _group_maps(b_a, b_b, CONTAIN)
        iA, iB, _nA, _nB = _scan_groups(A0, B0, 0, CONTAIN)
        b_Al, b_Bl = _edges(iA, iB, 0, False, False)
    elif FORM != ENV_GROUPS and o_n.shape[0] == 1:
        # one env per program: the pair crosses the warps in one reduction (time-major blocks of many envs
        # keep two, which cost them registers)
        b_A, b_B = _plain_scan(b_a, b_b, REVERSE, FORM, CONTAIN)
        b_Al, b_Bl = _edges(b_A, b_B, 1, REVERSE and FORM == PLAIN, False)
    else:
        b_zero = carry_tile(tl.zeros(o_n.shape, ACC), BT, FORM)
        _x, b_Bl, b_Al = scan_chunk(b_a, b_b, b_zero, BT, REVERSE, FORM, True, CONTAIN)
        b_Bl = carry_row(b_Bl, FORM)
    return b_Al, b_Bl


@triton.jit
def chunk_non_finite(b_a, b_b, o_n, BT: tl.constexpr, REVERSE: tl.constexpr, FORM: tl.constexpr, ACC: tl.constexpr,
                     AGGREGATE: tl.constexpr):  # fmt: skip
    """Whether the chunk holds a non-finite offset: by a reduction of its offsets (:func:`non_finite`), or with
    AGGREGATE (look-back blocks) from the final state of its plain scan from 0 (:func:`chunk_aggregate`), which
    the look-back computes anyway. That state is non-finite exactly when an offset is (a plain combine carries a
    NaN or an infinity on, as 0 * inf is NaN), or when a partial sum overflows, which the contained scan then
    handles as before. Which is faster depends on the kernel (docs/performance.md)."""
    if AGGREGATE:
        _A, b_Bl = chunk_aggregate(b_a, b_b, o_n, BT, REVERSE, FORM, ACC, False)
        bad = non_finite(b_Bl)
    else:
        bad = non_finite(b_b)
    return bad


@triton.jit
def block_states(b_a, b_b, b_carry, p_agg_a, p_agg_b, p_flag, o_n, i_k, e_k, N, NK, b_seed, BT: tl.constexpr,
                 REVERSE: tl.constexpr, FORM: tl.constexpr, ACC: tl.constexpr, NKP: tl.constexpr, PHASE: tl.constexpr,
                 ZERO: tl.constexpr, NEXT: tl.constexpr, SEEDED: tl.constexpr, CONTAIN: tl.constexpr):  # fmt: skip
    """:func:`scan_states` of a chunk, after the look-back in look-back phases (the state entering the block
    from the blocks before it). The look-back's scan of the chunk from 0 and this one take the same combines
    (CONTAIN) in the same branch of scan_rows, so the compiler computes the scan once; with the test and the
    look-back in separate branches it computed it twice."""
    if PHASE >= LOOKBACK:  # one chunk per block
        b_Ap, b_Bp = lookback_prefix(
            b_a, b_b, p_agg_a, p_agg_b, p_flag, o_n, i_k, e_k, N, NK, BT, REVERSE, FORM, ACC, NKP,
            PHASE == LOOKBACK_EPOCHS, CONTAIN,
        )  # fmt: skip
        if SEEDED:
            b_Bp = state_on(b_Ap, b_Bp, b_seed)
        b_carry = carry_tile(b_Bp, BT, FORM)
    return scan_states(b_a, b_b, b_carry, BT, REVERSE, FORM, ZERO, NEXT, CONTAIN)


@triton.jit
def _late_chunk(ins, outs, hps, i_p, o_row, o_n, m_n, b_carry, T, ST, K, BT: tl.constexpr, REVERSE: tl.constexpr,
                 FORM: tl.constexpr, ACC: tl.constexpr, ZERO: tl.constexpr, NEXT: tl.constexpr, WHOLE: tl.constexpr,
                 PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr):  # fmt: skip
    """One chunk of a late program's first pass (:func:`late_rows`): prologue, scan and epilogue, by plain arithmetic
    throughout. Returns (:func:`in_thread_zeros` of the states, new carry)."""
    o_t, m, off, o_nb, m_nb = chunk(i_p, T, o_row, o_n, m_n, BT, REVERSE, FORM, ST, WHOLE)
    b_a, b_b, ctx = PROLOGUE(ins, hps, off, o_t, m, o_nb, m_nb, T, ST, K, ACC)
    b_x, b_xn, b_carry, _Ac = scan_states(b_a, b_b, b_carry, BT, REVERSE, FORM, ZERO, NEXT, False, False)
    b_zeros = in_thread_zeros(b_x)  # before the epilogue, as the states are not needed after it
    EPILOGUE(outs, ins, hps, ctx, b_x, b_xn, off, m, ST, K, ACC)
    return b_zeros, b_carry


@triton.jit
def late_rows(ins, outs, hps, o_row, o_n, m_n, b_carry, c_lo, c_hi, c_off, T, ST, K, BT: tl.constexpr,
              REVERSE: tl.constexpr, FORM: tl.constexpr, ACC: tl.constexpr, ZERO: tl.constexpr, NEXT: tl.constexpr,
              WHOLE: tl.constexpr, ONE: tl.constexpr, PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr):  # fmt: skip
    """The program's chunks by plain arithmetic (Plan.late; single-pass and rescan programs), every output stored,
    then one test, returned: plain arithmetic carries a non-finite offset or entering state on to every later state
    (0 * inf is NaN), so the row's last state is finite exactly when all were, and then they are the contained
    scan's. Where it is not (or a partial sum overflowed), :func:`scan_rows` walks the program again, contained
    (:func:`_contained_rows`). One test per program, after the stores: no block-wide reduction between a chunk's
    loads and its scan."""
    if ONE:  # the chunk's states tested (its carry, which nothing else reads, the compiler drops)
        b_zeros, _c = _late_chunk(
            ins, outs, hps, c_off, o_row, o_n, m_n, b_carry, T, ST, K, BT, REVERSE, FORM, ACC, ZERO, NEXT, WHOLE,
            PROLOGUE, EPILOGUE,
        )  # fmt: skip
        bad = tl.sum(tl.sum(b_zeros, 1), 0) != 0  # b_zeros: [G, BN], [BN, G] or [BN, BT // 4]; NaN where not finite
    else:
        for i_c in range(c_lo, c_hi):
            _z, b_carry = _late_chunk(
                ins, outs, hps, i_c + c_off, o_row, o_n, m_n, b_carry, T, ST, K, BT, REVERSE, FORM, ACC, ZERO, NEXT,
                WHOLE, PROLOGUE, EPILOGUE,
            )  # fmt: skip
        bad = non_finite(carry_row(b_carry, FORM))
    return bad


@triton.jit
def row_length(T, TDIV: tl.constexpr, EXACT_T: tl.constexpr = False, BT: tl.constexpr = 1, PHASE: tl.constexpr = 0):
    """``T``, in a form from which the compiler knows it a multiple of ``TDIV`` (the launcher passes
    TDIV > 1 only where that holds: plans.row_div). Triton specialises an integer argument on
    divisibility by 16 only; from a multiple of 4 (or 8) it can prove 4-step rows 16-byte aligned and
    vectorise the loads and the masks against T. (T // TDIV) * TDIV is T, and its divisibility is
    what the compiler's analysis derives from the multiplication. EXACT_T (single-pass rows of one chunk, T == BT
    steps; Plan.exact_t): the constexpr BT itself."""
    if EXACT_T:
        tl.static_assert(PHASE == SINGLE, "EXACT_T: single-pass rows of one chunk")
        T = BT
    elif TDIV > 1:
        T = (T // TDIV) * TDIV
    return T


@triton.jit
def env_count(N, TM: tl.constexpr):
    """``N``, in a form from which the compiler knows it a multiple of TM when TM > 1 (time-major rows
    whose env count the launcher found a multiple of TM: steps then start 16-byte aligned and loads along the
    envs vectorise; the same device as row_length's)."""
    if TM > 1:
        N = (N // TM) * TM
    return N


@triton.jit
def env_block(
    p_flag, N, T, NK, BN: tl.constexpr, PHASE: tl.constexpr, TM: tl.constexpr = 0, FULL: tl.constexpr = False
):
    """The envs of this program: ids [BN], their mask, the offset of each row's first element (int64:
    N * T may exceed 2^31), the program's time block, and with LOOKBACK_EPOCHS the row's look-back epoch (0
    otherwise), read here so that the load overlaps the inputs' (:func:`lookback`). Look-back blocks are
    numbered by program id, which relies on the GPU starting programs in the order of their ids (as CUB's
    decoupled look-back does). TM: time-major rows (:func:`time_stride`), whose first elements are the env
    ids themselves; TM >= BN (the launcher found N a multiple of the env block) makes the env mask a constant.
    FULL (EXACT_T, :func:`row_length`, or WHOLE, :func:`chunk`) with one env per program: the env mask is a
    constant (a program per env), so that with the time mask gone every mask folds away. V-trace never passes
    it, Retrace only with WHOLE: their rows of 4 or 8 steps would round differently (the constant mask changes
    which products the compiler fuses into FMAs)."""
    N = env_count(N, TM)
    if PHASE >= LOOKBACK:
        v = tl.program_id(0)
        i_n = v // NK
        i_k = v % NK
        if PHASE == LOOKBACK_EPOCHS:
            epoch = tl.load(p_flag + i_n)
        else:
            epoch = 0
    else:
        epoch = 0
        i_n = tl.program_id(0)
        i_k = tl.program_id(1)
    o_n = i_n * BN + tl.arange(0, BN)
    if TM:
        o_row = o_n.to(tl.int64)
    else:
        o_row = o_n.to(tl.int64) * T
    if (FULL and BN == 1) or TM >= BN:
        m_n = tl.full([BN], True, tl.int1)
    else:
        m_n = o_n < N
    return o_n, m_n, o_row, i_k, epoch


@triton.jit
def time_stride(N, TM: tl.constexpr):
    """Elements between consecutive steps of a row: 1 for env-major rows (an [N, T] contiguous tensor, TM = 0),
    N for time-major ones (TM >= 1: the (N, T) view ``x.T`` of a contiguous [T, N] tensor, as rollout buffers
    of ``[num_steps, num_envs]`` give; N a multiple of TM: :func:`env_count`), int64 there since t * N may
    exceed 2^31."""
    if TM:
        st = env_count(N, TM).to(tl.int64)
    else:
        st = 1
    return st


@triton.jit
def chunk(i_p, T, o_row, o_n, m_n, BT: tl.constexpr, REVERSE: tl.constexpr, FORM: tl.constexpr, ST=1,
          WHOLE: tl.constexpr = False):  # fmt: skip
    """The ``i_p``-th chunk in processing order (the last chunk of the row first when REVERSE).
    Returns, shaped to broadcast against the tile ([BN, BT] plain, [G, BN, S] grouped, [BN, G, 4]
    env-major grouped): the time of each slot, the mask and element offsets (tile-shaped), and the
    env ids and their mask. ST: the rows' :func:`time_stride`. WHOLE: T is a multiple of BT (the launcher knows), so
    no chunk has steps past the row's end and the mask is the env mask alone."""
    if REVERSE:
        i_c = tl.cdiv(T, BT) - 1 - i_p
    else:  # i_p in T's integer type: int64 for rows over 2^31 steps, where i_c * BT must not wrap
        i_c = i_p + (T - T)
    if FORM == GROUPS4 or FORM == GROUPS8:
        tl.static_assert(REVERSE, "grouped tiles serve reverse recurrences only")
        S: tl.constexpr = 8 if FORM == GROUPS8 else 4
        G: tl.constexpr = BT // S
        o_g = G - 1 - tl.arange(0, G)  # latest group first
        o_t = (i_c * BT + o_g * S)[:, None, None] + tl.arange(0, S)[None, None, :]
        o_nb = o_n[None, :, None]
        m_nb = m_n[None, :, None]
        off = o_row[None, :, None] + o_t * ST
    elif FORM == ENV_GROUPS:
        tl.static_assert(REVERSE, "env-major groups serve reverse recurrences only")
        G: tl.constexpr = BT // 4
        o_g = G - 1 - tl.arange(0, G)  # latest group first
        o_t = (i_c * BT + (o_g * 4)[:, None] + tl.arange(0, 4)[None, :])[None, :, :]
        o_nb = o_n[:, None, None]
        m_nb = m_n[:, None, None]
        off = o_row[:, None, None] + o_t * ST
    else:
        o_s = tl.arange(0, BT)
        if FORM == DESCENDING:  # processing order, the latest step first
            tl.static_assert(REVERSE, "descending tiles serve reverse recurrences only")
            o_s = BT - 1 - o_s
        o_t = (i_c * BT + o_s)[None, :]
        o_nb = o_n[:, None]
        m_nb = m_n[:, None]
        off = o_row[:, None] + o_t * ST
    if WHOLE:
        m = m_nb & (o_t == o_t)  # (true) broadcasts the env mask to the tile
    else:
        m = m_nb & (o_t < T)
    return o_t, m, off, o_nb, m_nb


@triton.jit
def scan_rows(
    ins, outs, hp,  # tuples: what the prologue reads (pointers), the outputs, the hyper-parameters' (hi, lo) halves
    N, T, p_agg_a, p_agg_b, p_flag, NK, CPB,  # envs, steps; multi-block scratch (see PHASE above)
    SCALARS: tl.constexpr, PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr,  # the algorithm: @triton.jit functions
    K: tl.constexpr,  # a tuple of the algorithm's own constexprs, handed to both
    PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr,
    NKP: tl.constexpr, FORM: tl.constexpr, EXACT_T: tl.constexpr, TDIV: tl.constexpr, TM: tl.constexpr,
    WHOLE: tl.constexpr,  # the plan's constexprs (launch._build)
    REVERSE: tl.constexpr = True, NEXT: tl.constexpr = False, FULL: tl.constexpr = False,
    p_seed=None, HAS_SEED: tl.constexpr = False, SEEDED: tl.constexpr = False, AGGREGATE_TEST: tl.constexpr = False,
    LATE: tl.constexpr = False, CONTAINED: tl.constexpr = False,
):  # fmt: skip
    """The one driver loop of the fused kernels: this program's envs and time block, the carry, and per chunk
    (in processing order) its slots, the algorithm's prologue, the state entering the block (look-back), the
    scan and the algorithm's epilogue; then the block's aggregate (AGGREGATES).

    ``SCALARS(hp, ACC) -> hps``: the scalars the prologue and epilogue take (:func:`hp_scalars`, or derived
    ones), once per program. ``PROLOGUE(ins, hps, off, o_t, m, o_n, m_n, T, ST, K, ACC) -> (a, b, ctx)``: the
    coefficients of x_t = a_t x_{t -/+ 1} + b_t at the chunk's slots (``off`` element offsets, ``o_t`` steps,
    ``m`` mask, all tile-shaped; ``o_n``, ``m_n`` the env ids and mask shaped to broadcast against the tile;
    ``ST`` the :func:`time_stride`), the identity (1, 0) where ``m`` is false, and a tuple ``ctx`` of what the
    epilogue needs. ``EPILOGUE(outs, ins, hps, ctx, x, xn, off, m, ST, K, ACC)`` stores the outputs from the
    states x (and with NEXT the states one step earlier in processing order, :func:`scan_chunk_next`; else xn
    is x).

    REVERSE: backward recurrence. FULL: the env mask is a constant (:func:`env_block`). SEEDED (forward
    rows): the row starts from a seed state, p_seed's [N] where HAS_SEED, else 0, to which look-back blocks
    apply the map of the blocks before them; other rows start from 0, which no phase applies. AGGREGATE_TEST:
    look-back blocks test their chunk by its aggregate rather than its offsets (:func:`chunk_non_finite`); on
    time-major rows the only test (their other chunks, and look-back blocks without it, are contained). LATE
    (Plan.late; single-pass and rescan programs): plain arithmetic throughout, one test after the stores
    (:func:`late_rows`). CONTAINED: every chunk contained, no test (the late test's second pass,
    :func:`_contained_rows`)."""
    T = row_length(T, TDIV, EXACT_T, BT, PHASE)
    o_n, m_n, o_row, i_k, e_k = env_block(p_flag, N, T, NK, BN, PHASE, TM, FULL)
    ST = time_stride(N, TM)
    hps = SCALARS(hp, ACC)  # here, where the kernels always rebuilt them: the same code
    c_lo, c_hi, c_off, b_Apre, b_carry, b_Ablk = block_begin(
        p_agg_a, p_agg_b, i_k, o_n, m_n, NK, CPB, T, BT, PHASE, ACC, BN, NKP, ONE
    )
    b_seed = tl.zeros([BN], dtype=ACC)
    if SEEDED:
        if HAS_SEED:
            b_seed = tl.load(p_seed + o_n, mask=m_n, other=0).to(ACC)
            if PHASE == SINGLE or PHASE == RESCAN:  # the state entering the block: the prefix map on the seed
                b_carry = state_on(b_Apre, b_carry, b_seed)
    b_carry = carry_tile(b_carry, BT, FORM)
    # a block's first chunk that starts from the zero state does not apply it
    ZERO: tl.constexpr = ONE and (PHASE == AGGREGATES or (PHASE == SINGLE and not HAS_SEED))
    AGGREGATE: tl.constexpr = PHASE >= LOOKBACK and AGGREGATE_TEST  # the test this block takes
    if LATE and (PHASE == SINGLE or PHASE == RESCAN):  # plain throughout, one test after the stores
        bad = late_rows(
            ins, outs, hps, o_row, o_n, m_n, b_carry, c_lo, c_hi, c_off, T, ST, K, BT, REVERSE, FORM, ACC, ZERO,
            NEXT, WHOLE, ONE, PROLOGUE, EPILOGUE,
        )  # fmt: skip
        if bad:
            _contained_rows(
                ins, outs, hp, N, T, p_agg_a, p_agg_b, p_flag, NK, CPB, SCALARS, PROLOGUE, EPILOGUE, K, PHASE, ONE,
                ACC, BN, BT, NKP, FORM, EXACT_T, TDIV, TM, WHOLE, REVERSE, NEXT, FULL, p_seed, HAS_SEED, SEEDED,
            )  # fmt: skip
    else:
        for i_c in range(c_lo, c_hi):
            o_t, m, off, o_nb, m_nb = chunk(i_c + c_off, T, o_row, o_n, m_n, BT, REVERSE, FORM, ST, WHOLE)
            b_a, b_b, ctx = PROLOGUE(ins, hps, off, o_t, m, o_nb, m_nb, T, ST, K, ACC)
            # selects in the combines only for a chunk with a non-finite offset (the module docstring);
            # time-major programs walk many short chunks, where the test's second path cost more than the selects
            # it saves (but for look-back blocks that test their aggregate, which the look-back computes anyway)
            if CONTAINED or (TM > 0 and not AGGREGATE):
                contain = True  # a constant: the branch below is taken at compile time
            else:
                contain = chunk_non_finite(b_a, b_b, o_n, BT, REVERSE, FORM, ACC, AGGREGATE)
            if contain:
                b_x, b_xn, b_carry, b_Ac = block_states(
                    b_a, b_b, b_carry, p_agg_a, p_agg_b, p_flag, o_n, i_k, e_k, N, NK, b_seed, BT, REVERSE, FORM,
                    ACC, NKP, PHASE, ZERO, NEXT, SEEDED, True,
                )  # fmt: skip
            else:
                b_x, b_xn, b_carry, b_Ac = block_states(
                    b_a, b_b, b_carry, p_agg_a, p_agg_b, p_flag, o_n, i_k, e_k, N, NK, b_seed, BT, REVERSE, FORM,
                    ACC, NKP, PHASE, ZERO, NEXT, SEEDED, False,
                )  # fmt: skip
            if PHASE != AGGREGATES:
                EPILOGUE(outs, ins, hps, ctx, b_x, b_xn, off, m, ST, K, ACC)
            b_Ablk *= b_Ac
        b_carry = carry_row(b_carry, FORM)
        block_end(p_agg_a, p_agg_b, o_n, m_n, i_k, NK, b_Ablk, b_carry, PHASE)


@triton.jit(noinline=True)
def _contained_rows(ins, outs, hp, N, T, p_agg_a, p_agg_b, p_flag, NK, CPB, SCALARS: tl.constexpr,
                    PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr, K: tl.constexpr, PHASE: tl.constexpr,
                    ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr, NKP: tl.constexpr,
                    FORM: tl.constexpr, EXACT_T: tl.constexpr, TDIV: tl.constexpr, TM: tl.constexpr,
                    WHOLE: tl.constexpr, REVERSE: tl.constexpr, NEXT: tl.constexpr, FULL: tl.constexpr, p_seed,
                    HAS_SEED: tl.constexpr, SEEDED: tl.constexpr):  # fmt: skip
    """The second pass of a late program (:func:`late_rows`): the program's walk again from its inputs, every chunk
    contained, its outputs stored over the plain ones. A function of its own (scalar arguments, not inlined), so
    that the first pass keeps its own registers and load schedule: compiled inline, the contained scan next to the
    plain walk made ptxas split the walk's loads into several trips to memory (docs/performance.md)."""
    scan_rows(
        ins, outs, hp, N, T, p_agg_a, p_agg_b, p_flag, NK, CPB, SCALARS, PROLOGUE, EPILOGUE, K, PHASE, ONE, ACC, BN,
        BT, NKP, FORM, EXACT_T, TDIV, TM, WHOLE, REVERSE, NEXT, FULL, p_seed, HAS_SEED, SEEDED, CONTAINED=True,
    )  # fmt: skip


@triton.jit
def hp_scalar(hi, lo, ACC: tl.constexpr):
    """Rebuilds a float64 hyper-parameter passed as two float32 halves (Triton passes Python
    floats as float32): exact to ~1e-15 in float64 mode, the float32 value in float32 mode."""
    return tl.cast(hi, ACC) + tl.cast(lo, ACC)


@triton.jit
def hp_scalars(hp, ACC: tl.constexpr):
    """The hyper-parameters passed as (hi, lo) halves ``hp = (x_hi, x_lo, y_hi, y_lo, ...)``, 1 to 4 of them, as
    ACC scalars (:func:`hp_scalar`): a :func:`scan_rows` SCALARS."""
    tl.static_assert(len(hp) % 2 == 0 and len(hp) <= 8, "hp_scalars: 1 to 4 (hi, lo) pairs")
    if len(hp) == 2:
        out = (hp_scalar(hp[0], hp[1], ACC),)
    elif len(hp) == 4:
        out = (hp_scalar(hp[0], hp[1], ACC), hp_scalar(hp[2], hp[3], ACC))
    elif len(hp) == 6:
        out = (hp_scalar(hp[0], hp[1], ACC), hp_scalar(hp[2], hp[3], ACC), hp_scalar(hp[4], hp[5], ACC))
    else:
        out = (hp_scalar(hp[0], hp[1], ACC), hp_scalar(hp[2], hp[3], ACC), hp_scalar(hp[4], hp[5], ACC),
               hp_scalar(hp[6], hp[7], ACC))  # fmt: skip
    return out


@triton.jit
def flag_set(p_flag, off, mask):
    """A flag in any stored dtype as a boolean (nonzero means set)."""
    return tl.load(p_flag + off, mask=mask, other=0) != 0


@triton.jit
def load_flag(p_flag, off, mask, ACC: tl.constexpr):
    """A flag in any stored dtype as 0/1 in the accumulation dtype (nonzero means set)."""
    return flag_set(p_flag, off, mask).to(ACC)


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
    o_n, m_n, o_row, _k, _e = env_block(p_x, N, T, 1, BN, SINGLE)
    if HAS_INIT:
        b_carry = tl.load(p_init + o_n, mask=m_n, other=0).to(ACC)
    else:
        b_carry = tl.zeros([BN], dtype=ACC)
    for i_c in range(0, tl.cdiv(T, BT)):
        o_t, m, off, _n, _m = chunk(i_c, T, o_row, o_n, m_n, BT, REVERSE, PLAIN)
        b_a = tl.load(p_a + off, mask=m, other=1).to(ACC)
        b_b = tl.load(p_b + off, mask=m, other=0).to(ACC)
        b_x, b_carry, _ = scan_chunk(b_a, b_b, b_carry, BT, REVERSE, PLAIN)
        tl.store(p_x + off, b_x, mask=m)


# The token scans' look-back (rl_triton.llm): rows of a few long blocks whose maps are not core's (a, b) pairs
# (GAE carries (L, nv)), so each block folds the maps of every later block of its row itself, in a fixed order,
# instead of lookback's windows. Its flags: one int32 per (row, block) (flag_buffer_size without epochs), kept
# from call to call and tagged with the call's epoch, which the host advances by one per call.


@triton.jit
def publish_and_wait(p_flag, rows, m_row, NB, i_k, i_b, later, epoch, MAX_SPIN: tl.constexpr):
    """Flags block ``i_k`` of ``rows`` (its map stored just before) as published for ``epoch``, then waits until
    the blocks selected by ``later`` ([BN, NBP] over blocks ``NB - 1 - i_b``) have published theirs. Blocks are
    launched latest-first, so a block only waits on blocks that started before it. The wait is bounded (MAX_SPIN
    polls): never a hang."""
    tl.debug_barrier()
    tl.atomic_xchg(p_flag + rows.to(tl.int64) * NB + i_k, epoch + rows * 0, mask=m_row, sem="release")
    p_f = p_flag + rows.to(tl.int64)[:, None] * NB + (NB - 1 - i_b)[None, :]
    spins = i_k * 0
    pending = tl.sum(tl.sum(later.to(tl.int32), axis=1), axis=0) > 0
    while pending:
        f = tl.atomic_add(p_f, 0, mask=later, sem="acquire")
        spins += 1
        waiting = tl.sum(tl.sum(((f != epoch) & later).to(tl.int32), axis=1), axis=0)
        pending = (waiting > 0) & (spins < MAX_SPIN)
    tl.debug_barrier()


if _config.INTERPRET:  # the combines' scans and _edges' reductions as NumPy folds in the interpreter (_interpret.py)
    from ._interpret import fold_sums, install, install_reduce

    install(linear_combine, linear_combine_next, plain_combine, plain_combine_next)
    install_reduce(_add_pairs, fold_sums)
