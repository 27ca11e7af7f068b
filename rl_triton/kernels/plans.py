"""Launch plans: how a fused kernel covers the (N, T) rows of one call, as data.

A :class:`Plan` is a small frozen description of one launch configuration: the tile (envs per program,
steps per chunk, warps), its form, how rows of many chunks are split into time blocks, and a few
specialisations the compiler can use. :func:`choose` picks the plan of a call from its kernel kind,
shape and dtype; the launcher (:mod:`.launch`) turns a plan into grids and constexprs. Tests and the
tuning tool pass their own plans to the public functions (``plan=``) instead of changing any setting.

Every table entry below is a measured choice on an NVIDIA H200; ``docs/performance.md`` lists the
evidence, one line per decision. This module imports no Triton, so validation can consult it cheaply.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import NamedTuple

import torch


class Form(enum.IntEnum):
    """Tile form of a chunk (``kernels/core.py``); the value is the kernels' FORM constexpr."""

    PLAIN = 0  # [BN, BT], time ascending; one associative scan along it
    GROUPS4 = 1  # [G, BN, 4]: groups of 4 steps in registers, a forward scan across groups
    GROUPS8 = 2  # [G, BN, 8]: the same with 8-step groups (16-byte loads of 2-byte floats)
    ENV_GROUPS = 3  # [BN, G, 4]: a thread holds a whole short row (chunks of <= 8 steps)
    DESCENDING = 4  # [BN, BT], time descending: a reverse recurrence as a forward scan

    @property
    def group(self) -> int:
        """Steps per group (1 for the plain forms)."""
        return {Form.GROUPS4: 4, Form.GROUPS8: 8, Form.ENV_GROUPS: 4}.get(self, 1)


class Split(enum.Enum):
    """How a row of several chunks is covered."""

    SINGLE = "single"  # one program walks the whole row
    TWO_PASS = "two_pass"  # blocks store aggregates, then rescan from the folded prefix (inputs read twice)
    LOOKBACK = "lookback"  # one chunk per block, prefixes from a deterministic look-back (inputs read once)


class Phase(enum.IntEnum):
    """What one launch of a split does (``kernels/core.py``); the value is the kernels' PHASE constexpr."""

    SINGLE = 0  # Split.SINGLE: a program walks its whole row
    AGGREGATES = 1  # Split.TWO_PASS, first launch: each time block stores its aggregate, no outputs
    RESCAN = 2  # Split.TWO_PASS, second launch: each block folds the aggregates before it and rescans
    LOOKBACK = 3  # Split.LOOKBACK with flags zeroed per call
    LOOKBACK_EPOCHS = 4  # Split.LOOKBACK with epoch-tagged flags kept from call to call


@dataclass(frozen=True)
class Plan:
    """One launch configuration of a fused scan kernel."""

    bn: int  # envs per program
    bt: int  # steps per chunk
    warps: int
    form: Form = Form.PLAIN
    split: Split = Split.SINGLE
    chunks_per_block: int = 1  # TWO_PASS: chunks per time block
    window: int = 1  # LOOKBACK: blocks per window (core.lookback)
    epochs: bool = True  # LOOKBACK: flags tagged by epoch and kept between calls, instead of zeroed per call
    maxnreg: int | None = None  # register cap (Triton's maxnreg) of single-pass and look-back launches
    exact_t: bool = False  # T == BT: the row length is a constexpr, so every mask of the chunk folds away
    whole: bool = False  # T is a multiple of BT: no time mask
    row_div: int = 1  # T is a multiple of this (lets Triton prove 4- and 8-step rows aligned)
    env_div: int = 1  # time-major rows: N is a multiple of this (vector loads along the envs; bn: no env mask)
    pieces: bool = False  # Retrace: one action tile per binary digit of A instead of one padded tile
    shift: bool = False  # Retrace, exact env-major rows: c_{t+1} and q_{t+1} shifted in registers
    pi_tile: bool = False  # Retrace, exact env-major rows: pi(a_t | s_t) picked out of the weights tile
    late: bool = False  # single pass or rescan: the plain walk's outputs stored, then one test (core.late_rows)


# The kinds of launch plans: one per kernel measured here. Each op names the kind whose plans its calls take
# (its ``kind``; rl_triton.ops.kind_of by public function): a new op names the existing kind its kernel is most
# like ("forward" for a forward scan, else "gae" say) until plans measured for it are added here.
KINDS = ("gae", "vtrace", "returns", "returns_nv", "forward", "retrace")

MAX_BT = 1024  # longest walked chunk
BLOCK = 1024  # elements per program of packed short rows
MAX_BLOCKS = 1024  # two-pass blocks per row (the rescan folds their aggregates in registers)
TARGET_PROGRAMS = 1024  # split rows into time blocks when the env blocks give fewer than half this
MIN_CHUNKS_FOR_SPLIT = 4
EPOCH_MAX_BLOCKS = 4096  # look-back launches up to this many blocks keep epoch-tagged flags
ENV_GROUPS_MAX_BT = 8


class _OneChunk(NamedTuple):
    """Rows of one chunk longer than MAX_BT."""

    factor: int  # longest such row, in MAX_BTs
    per_thread: int  # elements per thread
    max_warps: int


class _SplitPolicy(NamedTuple):
    """A kind's time-block split."""

    factor: int  # block length in walked chunks
    lookback: bool  # the look-back (else two passes)
    window: int
    warps: int | None  # None: the warps of the block's length
    maxnreg: int | None  # register cap (float32)


_ONE_CHUNK = {
    "gae": _OneChunk(2, 16, 8),
    "vtrace": _OneChunk(4, 8, 16),
    "returns": _OneChunk(4, 16, 8),
    "returns_nv": _OneChunk(4, 8, 8),
    "forward": _OneChunk(4, 16, 8),
}
_ONE_CHUNK_16BIT = {"gae": _OneChunk(4, 16, 8)}
# Kinds whose one-chunk rows of 1024-4096 steps take exact_t (V-trace rounds differently and runs slower).
_EXACT_ONE_CHUNK = ("gae", "returns", "returns_nv")
# Rows of exactly 8 steps: a whole row per thread (4 warps) for these kinds and for 2-byte floats.
_ROW_PER_THREAD = ("vtrace",)
# Single-pass rows of several whole chunks that drop the time mask, by kind: element sizes.
_WHOLE = {"returns": (4, 2), "returns_nv": (4, 2), "retrace": (2,)}
# Register caps of single-pass programs of one chunk per row: kind -> {(bt, warps): cap}; then those of 2-byte
# floats only (float32 lost there or was not timed).
_SINGLE_CAPS = {"gae": {(512, 4): 48, (1024, 4): 48}, "returns": {(4096, 8): 64}, "vtrace": {(2048, 8): 80}}
_SINGLE_CAPS_16BIT = {"vtrace": {(512, 2): 72, (4096, 16): 64}, "returns_nv": {(4096, 8): 64}}
_RETRACE_SINGLE_CAP = 64
# Register caps of single-pass float32 programs that walk several chunks and test each before its scan (GAE, which
# the late test made slower): kind -> {(bt, warps): cap}.
_WALKED_CAPS = {"gae": {(1024, 4): 56}}
# Single-pass programs of one env that store their plain outputs first and test them once after (Plan.late), by
# kind: {(bt, warps, element size): register cap}, for rows of one chunk (_LATE) and rows walked in several
# (_LATE_WALKED). The contained second pass is compiled apart (core._contained_rows); a cap keeps the first pass's
# occupancy where the second would raise the kernel's registers (the second spills instead). Entries whose rows
# timed slower than the test before the scan are left out (GAE, V-trace's 2-byte 512- and 2048-step rows,
# TD(lambda)'s 2-byte 512-step rows, the forward scans' float32 2048-step rows: docs/performance.md).
_LATE = {
    "returns": {(4096, 8, 4): 64, (4096, 8, 2): 64, (2048, 4, 4): 64, (2048, 4, 2): 56, (512, 2, 2): None},
    "returns_nv": {(4096, 8, 4): 64, (4096, 8, 2): 64, (2048, 8, 4): 40, (2048, 8, 2): 40},
    "forward": {(4096, 8, 4): None, (4096, 8, 2): None, (2048, 4, 2): None},
    "vtrace": {(4096, 16, 4): None, (4096, 16, 2): 64, (2048, 8, 4): 80},
}
_LATE_WALKED = {
    "returns": {(1024, 4, 4): 48, (1024, 4, 2): None},
    "returns_nv": {(1024, 4, 4): 48, (1024, 4, 2): 48},
    "forward": {(1024, 4, 4): 48, (2048, 4, 2): 56},
    "vtrace": {(1024, 4, 4): None, (1024, 4, 2): None},
}
# Envs and warps of single-pass tiles of 2-byte floats, by kind: {(bn, bt): (bn, warps)}, where other than tile()'s
# measured faster: rows of one 512-step chunk in one-env programs of 2 warps instead of two-env programs of 4 (the
# same 8 elements a thread, twice the programs). Retrace and the forward scans lost there.
_TILE_16BIT = {kind: {(2, 512): (1, 2)} for kind in ("gae", "vtrace", "returns", "returns_nv")}

# Single-pass rows walked in chunks of 2-byte floats, by kind: the chunk length, where longer than MAX_BT measured
# faster (the forward scans: half the chunks, so half the per-chunk tests and carry reductions).
_WALKED_BT_16BIT = {"forward": 2048}

# Time-block splits per kind.
_SPLIT = {
    "gae": _SplitPolicy(2, True, 64, None, 72),
    "vtrace": _SplitPolicy(1, True, 128, None, 80),
    "returns": _SplitPolicy(2, True, 128, None, 64),
    "returns_nv": _SplitPolicy(2, True, 64, 4, 80),
    "forward": _SplitPolicy(2, True, 128, None, 72),
    "retrace": _SplitPolicy(1, True, 256, None, 128),
}
# Float32 caps of look-back rows of at least _LONG_ROW_BLOCKS blocks, where lower than _SPLIT's measured faster
# (more programs per SM to wait on the look-back); shorter rows keep _SPLIT's (TD(lambda): 256x65,536 lost).
_LONG_ROW_BLOCKS = 128
_LONG_ROW_CAPS = {"vtrace": 72, "returns_nv": 72, "forward": 64}
# Register caps of look-back blocks of 2-byte floats (float32 ones: _SPLIT, _LONG_ROW_CAPS).
_SPLIT_CAPS_16BIT = {"vtrace": 80, "returns": 64, "forward": 80}
# Look-back windows of 2-byte floats where other than _SPLIT's measured faster (V-trace 64x262,144: 128 lost).
_SPLIT_WINDOWS_16BIT = {"vtrace": 256}
# Launches of fewer blocks than _SMALL[kind] are latency-bound and take _SPLIT_SMALL[kind] instead.
_SMALL = {"gae": 2048, "returns": 2048, "returns_nv": 2048, "forward": 4096}
_SPLIT_SMALL = {
    "gae": _SplitPolicy(4, True, 512, None, None),
    "returns": _SplitPolicy(2, True, 128, None, None),
    "returns_nv": _SplitPolicy(2, True, 256, 4, None),
    "forward": _SplitPolicy(1, False, 256, None, None),
}

# Retrace: [N, T, A] tiles keep their size as A grows (programs of BLOCK * scale / AP steps).
_RETRACE_ACTIONS = 4  # scale for up to _RETRACE_GROUPED_MAX_AP padded actions
_RETRACE_MANY_ACTIONS = 8  # scale beyond
_RETRACE_MIN_BLOCK = 128
_RETRACE_GROUPED_MAX_AP = 8
_RETRACE_PIECES_MIN_AP = 16

# Time-major rows: programs of blocks of envs walking time in short chunks.
_TM_MIN_ENVS = 32  # whole 128-byte lines of float32 per step
_TM_BT = 64
_TM_BLOCK = 2048
_TM_WARPS = 4
_TM_RETRACE_BLOCK = 1024
_TM_RETRACE_WARPS = 8
_TM_WINDOW = 16
_TM_MAX_SPLIT = 128  # two-pass splits up to this many blocks are read in place
_TM_MAX_LOOKBACK = 2048  # look-back rows up to this many blocks are read in place
_TM_ENV_DIV = {"returns": 1, "forward": 1}  # vector loads along the envs lost for these (8 otherwise)
_TM_ENV_DIV_LOOKBACK = {"forward": 1}
_TM_LOOKBACK_MIN_SPLIT = {"returns": {4: 64, 2: 64}, "vtrace": {2: 64}}  # kind -> element size -> blocks
# Register caps of time-major look-back blocks, by (kind, element size): one to three programs more per SM, where
# that measured faster; only for launches of at least _TM_CAP_MIN_BLOCKS blocks, which fill every SM (on fewer the
# cap adds no program that runs, only its spills).
_TM_LOOKBACK_CAPS = {("vtrace", 4): 128, ("returns_nv", 4): 72, ("returns_nv", 2): 64, ("gae", 2): 64}
_TM_CAP_MIN_BLOCKS = 1024
# Warps of single-pass time-major programs, by (kind, element size), where other than _TM_WARPS measured faster.
_TM_SINGLE_WARPS = {("returns_nv", 4): 8}
# Split launches of 2- and 4-byte floats in at most _TM_FEW_BLOCKS blocks (latency-bound: an H200's 132 SMs run
# one block each or none): the warps of the kinds whose blocks measured faster with more, and the kinds that take
# the look-back there even below _TM_LOOKBACK_MIN_SPLIT.
_TM_FEW_BLOCKS = 128
_TM_FEW_WARPS = {"gae": 8, "vtrace": 8, "returns": 8}
_TM_FEW_LOOKBACK = ("vtrace",)
# Time-major plans whose env count divides by their env block take it as env_div, which drops the env mask (with
# whole chunks every mask folds away), by kind and element size: (single-pass plans, split ones). Not the forward
# scans (their bits change), nor the returns without next values (slower).
_TM_ENV_BLOCKS = {
    "gae": ((4, 2), (2,)), "vtrace": ((4, 2), ()), "retrace": ((4, 2), (4, 2)), "returns_nv": ((4, 2), (2,)),
}  # fmt: skip


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1)."""
    return 1 << (x - 1).bit_length() if x > 1 else 1


def _is_f32(dtype: torch.dtype | None) -> bool:
    return dtype is None or dtype == torch.float32


def tile(n: int, t: int, block: int = BLOCK) -> Plan:
    """Walked tiles: rows up to MAX_BT steps are one chunk, short rows packed block // BT to a program."""
    bt = min(MAX_BT, block, max(4, pow2(max(t, 1))))
    bn = max(1, min(block // bt, pow2(max(n, 1))))
    return Plan(bn, bt, 4 if bt >= 512 else 8)


def _chunk_warps(kind: str, bt: int, dtype: torch.dtype | None) -> int:
    """Warps of a one-env program of ``bt`` steps: the kind's elements per thread, 4 to its cap."""
    one = _one_chunk(kind, dtype)
    return min(one.max_warps, max(4, bt // (32 * one.per_thread)))


def _one_chunk(kind: str, dtype: torch.dtype | None) -> _OneChunk:
    if dtype is not None and dtype.itemsize == 2 and kind in _ONE_CHUNK_16BIT:
        return _ONE_CHUNK_16BIT[kind]
    return _ONE_CHUNK[kind]


def _time_blocks(env_programs: int, n_chunks: int) -> tuple[int, int]:
    """(time blocks, chunks per block) of rows of ``n_chunks`` chunks: enough blocks to fill the GPU."""
    if env_programs * 2 >= TARGET_PROGRAMS or n_chunks < MIN_CHUNKS_FOR_SPLIT:
        return 1, n_chunks
    nk = min(cdiv(TARGET_PROGRAMS, env_programs), n_chunks, MAX_BLOCKS)
    cpb = cdiv(n_chunks, nk)
    return cdiv(n_chunks, cpb), cpb


def _window(n_chunks: int, window: int) -> int:
    """The look-back window: at most the blocks (as a power of 2), doubled until ``window`` windows cover the row."""
    window = min(pow2(n_chunks), window)
    while window * window < n_chunks:
        window *= 2
    return window


def _split(n: int, t: int, base: Plan, kind: str, dtype: torch.dtype | None, block_warps: bool = True) -> Plan:
    """``base`` with the time-block split that rows of ``t`` steps need. ``block_warps``: one-env blocks take
    the warps of their length (else they keep the base's)."""
    n_chunks = cdiv(t, base.bt)
    nk, _ = _time_blocks(cdiv(n, base.bn), n_chunks)
    if nk == 1:
        return base
    policy = _SPLIT[kind]
    if n * cdiv(t, base.bt * policy.factor) < _SMALL.get(kind, 0):
        policy = _SPLIT_SMALL[kind]
    factor, lookback, window, warps, maxnreg = policy
    if block_warps and (factor > 1 or base.bn == 1):
        bt = base.bt * factor
        if warps is None or factor == 1:
            warps = 4 if kind == "retrace" else _chunk_warps(kind, bt, dtype)
        base = Plan(1, bt, warps)
        n_chunks = cdiv(t, bt)
        if n_chunks == 1:
            return base
    if lookback and base.bn == 1:
        blocks = cdiv(n, base.bn) * n_chunks
        if maxnreg is not None and n_chunks >= _LONG_ROW_BLOCKS:
            maxnreg = _LONG_ROW_CAPS.get(kind, maxnreg)
        if dtype is not None and dtype.itemsize == 2:
            window = _SPLIT_WINDOWS_16BIT.get(kind, window)
        return replace(
            base, split=Split.LOOKBACK, window=_window(n_chunks, window), epochs=blocks <= EPOCH_MAX_BLOCKS,
            maxnreg=maxnreg if _is_f32(dtype) else _SPLIT_CAPS_16BIT.get(kind) if dtype.itemsize == 2 else None,
        )  # fmt: skip
    return replace(base, split=Split.TWO_PASS, chunks_per_block=cdiv(n_chunks, MAX_BLOCKS))


def _chunks(plan: Plan, t: int) -> int:
    return cdiv(t, plan.bt)


def _one_chunk_rows(plan: Plan, t: int) -> bool:
    """Single pass, one chunk per row."""
    return plan.split is Split.SINGLE and _chunks(plan, t) == 1


def _whole(kind: str, plan: Plan, t: int, dtype: torch.dtype) -> bool:
    walked = plan.split is Split.SINGLE and _chunks(plan, t) > 1 and plan.bn == 1 and t % plan.bt == 0
    return walked and dtype.itemsize in _WHOLE.get(kind, ())


def _grouped_form(plan: Plan, dtype: torch.dtype) -> Form:
    """Group-major groups: of 8 steps for 2-byte floats when every thread holds a whole group, else 4."""
    per_thread = plan.bn * plan.bt // (32 * plan.warps)
    if dtype.itemsize == 2 and plan.bt >= 8 and per_thread >= 8:
        return Form.GROUPS8
    return Form.GROUPS4


def row_div(t: int) -> int:
    """The largest of 8 and 4 dividing ``t`` that tells Triton more than its own multiple-of-16 class (else 1)."""
    if t % 16 == 0:
        return 1
    return 8 if t % 8 == 0 else 4 if t % 4 == 0 else 1


def _env_div(n: int, kind: str, lookback: bool) -> int:
    d = (_TM_ENV_DIV_LOOKBACK if lookback else _TM_ENV_DIV).get(kind, 8)
    while n % d:
        d //= 2
    return d


def _scan(kind: str, n: int, t: int, dtype: torch.dtype) -> Plan:
    """Env-major rows of GAE, V-trace, the returns and the forward scans."""
    factor = _one_chunk(kind, dtype).factor
    bt = max(4, pow2(max(t, 1)))
    if MAX_BT < bt <= factor * MAX_BT:
        base = Plan(1, bt, _chunk_warps(kind, bt, dtype))
    else:
        base = tile(n, t)
    plan = _split(n, t, base, kind, dtype)
    if plan.split is Split.SINGLE and dtype is not None and dtype.itemsize == 2:
        bn, warps = _TILE_16BIT.get(kind, {}).get((plan.bn, plan.bt), (plan.bn, plan.warps))
        plan = replace(plan, bn=bn, warps=warps)
        walked_bt = _WALKED_BT_16BIT.get(kind, plan.bt)
        if plan.bn == 1 and plan.bt < walked_bt < t:
            plan = replace(plan, bt=walked_bt, warps=_chunk_warps(kind, walked_bt, dtype))
    if _one_chunk_rows(plan, t) and (_is_f32(dtype) or dtype.itemsize == 2):
        caps = _SINGLE_CAPS.get(kind, {}) | (_SINGLE_CAPS_16BIT.get(kind, {}) if dtype.itemsize == 2 else {})
        plan = replace(plan, maxnreg=caps.get((plan.bt, plan.warps)))
    form = Form.ENV_GROUPS if plan.bt <= ENV_GROUPS_MAX_BT else _grouped_form(plan, dtype)
    if form is Form.ENV_GROUPS and plan.split is Split.SINGLE and t == plan.bt:
        # exact rows of 4 or 8 steps; rows of 8 a whole row per thread where that measured faster
        per_thread = t == 8 and (kind in _ROW_PER_THREAD or dtype.itemsize == 2)
        base = tile(n, t)
        if per_thread:
            base = replace(base, warps=4)
        if base != Plan(plan.bn, plan.bt, plan.warps):
            plan = _split(n, t, base, kind, dtype, block_warps=False)
        plan = replace(plan, form=form, exact_t=True)
    else:
        exact = _one_chunk_rows(plan, t) and plan.bn == 1 and t == plan.bt > ENV_GROUPS_MAX_BT
        exact = exact and kind in _EXACT_ONE_CHUNK
        plan = replace(plan, form=form, exact_t=exact, whole=_whole(kind, plan, t, dtype), row_div=row_div(t))
    plan = _late(kind, plan, t, dtype)
    if kind == "forward":  # the forward scans: plain tiles, no exact rows
        return replace(plan, form=Form.PLAIN, exact_t=False, row_div=row_div(t))
    return plan if not plan.exact_t else replace(plan, row_div=1)


def _late(kind: str, plan: Plan, t: int, dtype: torch.dtype | None) -> Plan:
    """Single-pass plans in float32 or 2-byte floats: Plan.late and its cap where _LATE (rows of one chunk) or
    _LATE_WALKED (walked rows) lists a one-env program, else the cap of _WALKED_CAPS (walked float32 rows)."""
    if plan.split is not Split.SINGLE or dtype is None or not (_is_f32(dtype) or dtype.itemsize == 2):
        return plan
    walked = _chunks(plan, t) > 1
    late = (_LATE_WALKED if walked else _LATE).get(kind, {})
    key = (plan.bt, plan.warps, dtype.itemsize)
    if plan.bn == 1 and key in late:
        return replace(plan, late=True, maxnreg=late[key])
    cap = _WALKED_CAPS.get(kind, {}).get((plan.bt, plan.warps)) if walked and _is_f32(dtype) else None
    return plan if cap is None else replace(plan, maxnreg=cap)


def _retrace(n: int, t: int, num_actions: int, dtype: torch.dtype) -> Plan:
    """Env-major rows of Retrace."""
    ap = pow2(num_actions)
    few = ap <= _RETRACE_GROUPED_MAX_AP
    scale = _RETRACE_ACTIONS if few else _RETRACE_MANY_ACTIONS
    base = replace(tile(n, t, block=max(_RETRACE_MIN_BLOCK, BLOCK * scale // ap)), warps=8)
    pieces = ap >= _RETRACE_PIECES_MIN_AP
    plan = replace(_split(n, t, base, "retrace", dtype), pieces=pieces)
    if few and base.bt >= 16:
        form = _grouped_form(base, dtype)
    elif few and base.bt <= ENV_GROUPS_MAX_BT:
        form = Form.ENV_GROUPS
    else:
        form = Form.PLAIN
    if form is not Form.ENV_GROUPS:
        single = plan.split is Split.SINGLE
        if (
            single and (_is_f32(dtype) or dtype.itemsize == 2) and ap == _RETRACE_ACTIONS and plan.warps == 8
            and plan.bn * plan.bt == 1024 and _chunks(plan, t) > 1
        ):  # fmt: skip
            plan = replace(plan, maxnreg=_RETRACE_SINGLE_CAP)
        whole = form is not Form.PLAIN and _whole("retrace", plan, t, dtype)
        return replace(plan, form=form, whole=whole, row_div=row_div(t))
    exact = t == plan.bt and plan.split is Split.SINGLE
    return replace(
        plan, form=form, exact_t=exact, shift=exact, pi_tile=exact and not pieces, row_div=1 if exact else row_div(t)
    )


def _time_major(kind: str, n: int, t: int, dtype: torch.dtype | None, block: int = 0, warps: int = 0) -> Plan:
    """Time-major rows: blocks of envs walking short chunks; splits take the look-back over blocks of envs
    (not float64: its aggregates do not fit a tagged word) where it measured faster."""
    block = block or _TM_BLOCK
    bt = min(_TM_BT, max(4, pow2(t)), max(4, block // _TM_MIN_ENVS))
    bn = min(max(_TM_MIN_ENVS, block // bt), max(_TM_MIN_ENVS, pow2(n)))
    if kind == "forward":
        form = Form.PLAIN
    else:
        form = Form.ENV_GROUPS if bt <= ENV_GROUPS_MAX_BT else Form.GROUPS4
    plan = Plan(bn, bt, warps or _TM_WARPS, form)
    n_chunks = cdiv(t, bt)
    nk, cpb = _time_blocks(cdiv(n, bn), n_chunks)
    if nk == 1:
        return plan
    blocks = cdiv(n, bn) * n_chunks
    min_split = _TM_LOOKBACK_MIN_SPLIT.get(kind, {}).get(dtype.itemsize, 0) if dtype is not None else 0
    if dtype is not None and dtype.itemsize in (2, 4) and blocks <= _TM_FEW_BLOCKS:
        plan = replace(plan, warps=_TM_FEW_WARPS.get(kind, plan.warps))
        min_split = 0 if kind in _TM_FEW_LOOKBACK else min_split
    if dtype is not None and dtype != torch.float64 and nk >= min_split:
        plan = replace(plan, split=Split.LOOKBACK, window=_window(n_chunks, _TM_WINDOW))
        cap = _TM_LOOKBACK_CAPS.get((kind, dtype.itemsize)) if blocks >= _TM_CAP_MIN_BLOCKS else None
        return replace(plan, epochs=blocks <= EPOCH_MAX_BLOCKS, maxnreg=cap)
    return replace(plan, split=Split.TWO_PASS, chunks_per_block=cpb)


def _fit_time_major(plan: Plan, kind: str, n: int, t: int, dtype: torch.dtype) -> Plan:
    """A time-major plan fitted to its call: the env divisor (the env block where _TM_ENV_BLOCKS takes it),
    ``whole`` (rows of whole chunks drop the time mask, without which the predicated loads of 1-byte flags
    serialised in some kernels) and the warps of single-pass plans (_TM_SINGLE_WARPS)."""
    sizes = _TM_ENV_BLOCKS.get(kind, ((), ()))[plan.split is not Split.SINGLE]
    if dtype.itemsize in sizes and n % plan.bn == 0:
        env_div = plan.bn
    else:
        env_div = _env_div(n, kind, plan.split is Split.LOOKBACK)
    warps = _TM_SINGLE_WARPS.get((kind, dtype.itemsize), plan.warps) if plan.split is Split.SINGLE else plan.warps
    return replace(plan, env_div=env_div, whole=t % plan.bt == 0, warps=warps)


def _retrace_time_major(n: int, t: int, num_actions: int, dtype: torch.dtype | None) -> Plan:
    ap = pow2(num_actions)
    few = ap <= _RETRACE_GROUPED_MAX_AP
    scale = _RETRACE_ACTIONS if few else _RETRACE_MANY_ACTIONS
    block = max(_RETRACE_MIN_BLOCK, _TM_RETRACE_BLOCK * scale // max(ap, _RETRACE_ACTIONS))
    plan = _time_major("retrace", n, t, dtype, block, _TM_RETRACE_WARPS)
    form = Form.ENV_GROUPS if few and plan.form is Form.ENV_GROUPS else Form.DESCENDING
    return replace(plan, form=form, pieces=ap >= _RETRACE_PIECES_MIN_AP)


def choose(kind: str, n: int, t: int, dtype: torch.dtype, *, time_major: bool = False, num_actions: int = 0) -> Plan:
    """The plan of a call of fused kernel ``kind`` (one of :data:`KINDS`) on ``n`` rows of ``t`` steps of
    ``dtype`` (``time_major``: rows read from a (T, N) buffer; ``num_actions``: Retrace's A)."""
    if kind not in KINDS:
        raise ValueError(f"choose: kind must be one of {KINDS} (a new op names an existing kind), got {kind!r}")
    if time_major:
        if kind == "retrace":
            plan = _retrace_time_major(n, t, num_actions, dtype)
        else:
            plan = _time_major(kind, n, t, dtype)
        return _fit_time_major(plan, kind, n, t, dtype)
    if kind == "retrace":
        return _retrace(n, t, num_actions, dtype)
    return _scan(kind, n, t, dtype)


def reads_time_major_in_place(n: int, t: int, num_actions: int = 0, dtype: torch.dtype | None = None) -> bool:
    """Whether time-major rows of (n, t) are read in place (else validation copies them contiguous): splits of
    at most _TM_MAX_SPLIT two-pass blocks, and longer rows that the look-back serves with whole env blocks."""
    if num_actions:
        plan = _retrace_time_major(n, t, num_actions, None)
    else:
        plan = _time_major("gae", n, t, None)
    if plan.split is Split.SINGLE or cdiv(_chunks(plan, t), plan.chunks_per_block) <= _TM_MAX_SPLIT:
        return True
    lookback = dtype is not None and dtype != torch.float64 and n >= _TM_MIN_ENVS
    return lookback and _chunks(plan, t) <= _TM_MAX_LOOKBACK


# ---------------------------------------------------------------------------------------------- token scans
# The token scans of rl_triton.llm (masked GAE and REINFORCE++ over (B, T) rows of tokens, llm/_kernels.py): one
# kernel at every length, its tile an ENV_GROUPS one of a whole block ([BN, G, 4], groups of 4 tokens numbered
# latest-first), rows longer than a block split in time by their own look-back (core.publish_and_wait) or two
# passes. docs/llm.md, "Kernels".

TOKEN_KINDS = ("gae", "reinforce_pp")
TOKEN_MIN_BLOCK = 16  # the shortest tile of the token scans (short rows are padded to it as well)
TOKEN_MAX_BLOCK = 8192  # one program's tile of a row split in time
TOKEN_TILE = 2048  # tokens per program of rows of one block (several rows a program)
TOKEN_SPLITS = (Split.TWO_PASS, Split.LOOKBACK)
# A form given by name: Form's names, and "grouped", what the token scans called their form before sharing Form.
_TOKEN_FORM_NAMES = {**{f.name.lower(): f for f in Form}, "grouped": Form.ENV_GROUPS}
_SPLIT_VALUES = {s.value: s for s in Split}


@dataclass(frozen=True)
class TokenPlan:
    """One launch configuration of the token scans. ``form`` and ``split`` may be given as strings (a Form's name
    or ``"grouped"``, a Split's value: ``TokenPlan(split="two_pass")``); an invalid plan raises ValueError saying
    why."""

    block: int = 4096  # tokens per block: rows of at most this many are one block, longer ones are split
    # The one tile form: plain tiles scanned with time descending (no vector loads) or with reverse=True scans
    # (lane-reversing shuffles of every element) were no faster on an H200, and the reverse one did not compile
    # for every shape.
    form: Form = Form.ENV_GROUPS
    # LOOKBACK: one launch, blocks launched latest-first publish their map behind an epoch-tagged flag and wait
    # for the later blocks' (inputs read once); CUDA graph captures take the two passes instead (a replay would
    # reuse the captured epoch). TWO_PASS: each block stores its map, then each folds the later blocks' and
    # rescans (inputs read twice).
    split: Split = Split.LOOKBACK
    # Warps per program of the scan; None: one per 256 tokens of the tile (8 tokens a thread), 4 to 16.
    warps: int | None = None

    def __post_init__(self):
        if isinstance(self.form, str):
            object.__setattr__(self, "form", _TOKEN_FORM_NAMES.get(self.form.lower(), self.form))
        if isinstance(self.split, str):
            object.__setattr__(self, "split", _SPLIT_VALUES.get(self.split, self.split))
        check_token(self)


def check_token(plan: TokenPlan) -> TokenPlan:
    """``plan`` itself when the token scans can launch it; TypeError for anything but a :class:`TokenPlan`,
    ValueError saying why for an invalid one."""
    if not isinstance(plan, TokenPlan):
        raise TypeError(f"plan must be a rl_triton.llm.plans.TokenPlan, got {type(plan).__name__}")
    block = plan.block
    if isinstance(block, bool) or not isinstance(block, int) or block & (block - 1) or block <= 0:
        raise ValueError(f"TokenPlan: block must be a power of two (tokens per program of a split row), got {block!r}")
    if not TOKEN_MIN_BLOCK <= block <= TOKEN_MAX_BLOCK:
        raise ValueError(f"TokenPlan: block must lie in [{TOKEN_MIN_BLOCK}, {TOKEN_MAX_BLOCK}], got {block}")
    w = plan.warps
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w & (w - 1) or not 1 <= w <= 32):
        raise ValueError(f"TokenPlan: warps must be None or a power of two in [1, 32], got {w!r}")
    if plan.form is not Form.ENV_GROUPS:
        raise ValueError(
            f"TokenPlan: form must be a Form of the token scans (ENV_GROUPS, 'grouped'), got {plan.form!r}"
        )
    if plan.split not in TOKEN_SPLITS:
        raise ValueError(
            f"TokenPlan: split must be a Split of the token scans (two_pass, lookback), got {plan.split!r}"
        )
    return plan


TOKEN_DEFAULT = TokenPlan()
# GAE's two-value state runs faster with fewer, fuller threads: 4 warps a program (32 tokens a thread in a
# 4096-token block) rather than one warp per 256 tokens. REINFORCE++'s one-value state does not (docs/llm.md).
TOKEN_GAE = TokenPlan(warps=4)


def choose_token(b: int, t: int, dtype: torch.dtype, estimator: str = "gae") -> TokenPlan:
    """The plan of a token scan of ``b`` rows of ``t`` tokens of ``dtype`` for ``estimator`` (one of
    :data:`TOKEN_KINDS`): blocks of 4096 tokens for every shape, rows longer than that carried by the one-launch
    look-back (two launches inside a CUDA graph capture); GAE on 2- and 4-byte floats in 4 warps a program. The
    measurements behind the choice: docs/llm.md, "Kernels"."""
    if estimator not in TOKEN_KINDS:
        raise ValueError(f"estimator must be 'gae' or 'reinforce_pp', got {estimator!r}")
    return TOKEN_GAE if estimator == "gae" and dtype != torch.float64 else TOKEN_DEFAULT


def token_tile(b: int, t: int, block: int) -> tuple[int, int, int]:
    """(rows per program, tokens per block, blocks per row) of a token scan of ``b`` rows of ``t >= 1`` tokens in
    blocks of ``block``: a row of at most ``block`` tokens is one block padded to a power of two, several rows a
    program; a longer row is split into blocks of ``block``, one program each."""
    if t <= block:
        bt = max(TOKEN_MIN_BLOCK, pow2(t))
        return max(1, min(pow2(b), TOKEN_TILE // bt)), bt, 1
    return 1, block, cdiv(t, block)
