"""Launchers: choose tile sizes, split hyper-parameters, allocate outputs and start the kernels."""

from __future__ import annotations

import contextlib
import functools
import sys
import types
import warnings
from typing import NamedTuple

import numpy as np
import torch
import triton.language as tl

from .. import _config
from . import core, fused

# Tile shapes: BN envs per program, BT time steps per chunk, W warps. Rows up to _MAX_BT steps are
# one chunk (the program loads the whole row at once, so all its loads are in flight together);
# longer rows are walked in chunks of _MAX_BT. Short rows are packed _BLOCK // BT to a program, so
# no program is mostly masked. Power-of-two size classes of T (and of N below the block size)
# only, so a new rollout length recompiles at most once per class. Chosen from sweeps of every
# kernel on an H200 (benchmarks/tile_sweep.py, results in benchmarks/results/tile_sweep_*_h200.json;
# NOTES.md, "Performance"): 1024-element programs won or tied at every shape and kernel swept with
# chunks walked in a loop; 4 warps for rows of >= 512 steps, 8 for shorter ones (fewer registers per
# thread for the wide tiles of short rows; V-trace and Retrace spill at 2048-element programs with 4
# warps). The fused scan kernels make longer rows one chunk instead (below).
_MAX_BT = 1024
_BLOCK = 1024
_WARPS_LONG = 4  # BT >= 512
_WARPS_SHORT = 8
# Rows of up to a few _MAX_BT steps are one chunk for the fused scan kernels (scan_tiles): such a
# row runs loop-free (ONE), which measured much faster than walking it in 1024-step chunks (H200,
# 4096x2048: GAE 0.87 of copy vs 0.78, V-trace 0.97 vs 0.69, discounted 0.95 vs 0.73, TD(lambda) 0.94
# vs 0.83, traces 0.95 vs 0.84, benchmarks/results/tile_sweep_bigchunk_h200.json; 8192x4096 in one
# 4096-step chunk: V-trace 0.93 vs 0.72, discounted 0.91 vs 0.76, traces 0.98 vs 0.89, GAE 0.84 vs
# 0.86, tile_sweep_4096_h200.json). Per kernel: (longest one-chunk row in units of _MAX_BT, elements
# per thread, most warps); _ONE_CHUNK_FACTOR caps the first (1: chunks of _MAX_BT only, as the
# forced multi-block tests want). V-trace and TD(lambda) with next values hold more live inputs and
# want 8 elements per thread (4096x2048: 0.97 and 0.94 with 8 warps, 0.80 and 0.88 with 4); TD(lambda)
# lost with 16 warps at 4096 steps (0.69) and reached 0.97 with 8 (tile_sweep_4096_lambda_h200.json),
# hence its cap of 8. GAE stays at 2048: 0.84 in one 4096-step chunk against 0.86 walked.
_SCAN_POLICY = {
    "gae": (2, 16, 8),
    "vtrace": (4, 8, 16),
    "returns": (4, 16, 8),
    "returns_nv": (4, 8, 8),
    "forward": (4, 16, 8),
}
# 2-byte floats: GAE's rows of 4096 steps are one chunk too (8192x4096 bfloat16: 74 us, 0.82 of copy,
# vs 90 us walked in 1024-step chunks; float32 keeps walking them, above; tile_sweep_bf16_8192_h200.json).
_SCAN_POLICY_16BIT = {"gae": (4, 16, 8)}
_ONE_CHUNK_FACTOR = 4
# Retrace: steps per program scaled by _RETRACE_ACTIONS / (actions rounded up to a power of two),
# at least _RETRACE_MIN_BLOCK; by _RETRACE_MANY_ACTIONS beyond _RETRACE_GROUPED_MAX_AP (padded) actions.
_RETRACE_ACTIONS = 4
_RETRACE_MANY_ACTIONS = 8
_RETRACE_MIN_BLOCK = 128
_RETRACE_GROUPED_MAX_AP = 8  # grouped tiles up to this many (padded) actions, plain beyond
# Action tiles per binary digit of A (kernel constexpr PIECES: 18 = 16 + 2, no padded lanes) from this
# many padded actions on, else one tile padded to a power of two; env-major groups for rows of <=
# _ENV_MAJOR_MAX_BT steps (few actions). See retrace_tiles.
_RETRACE_PIECES_MIN_AP = 16
_RETRACE_ENV_MAJOR = True
# Env-major rows (retrace_layout; kernel constexprs of fused.retrace_kernel): the row length as a
# constexpr where T == BT (EXACT_T: rows of 4 or 8 steps, which Triton does not know 16-byte aligned,
# T not being a multiple of 16, so every [N, T] load was one element per thread and every split of
# the env-major groups went through shared memory: 33 bar.sync and 120-128 registers per thread in the
# sm_90 code, against 1 and 46); on those rows, c_{t+1} and q_{t+1} shifted in registers instead of
# loaded again at t + 1 (SHIFT), and pi(a_t | s_t) picked out of the weights tile instead of
# gathered, where the weights are the target probabilities (PI_TILE). Measured on the H200
# (tile_sweep_retrace_short_h200.json, kernel us at 1,048,576x8 / 32,768x8, 1024-step programs of 8
# warps): 238.4 (0.53 of copy) / 14.9 with none of them, EXACT_T 169.7 / 13.6, with PI_TILE 155.0 / 12.5, with
# SHIFT 141.2 / 12.0, all three 139.7 (0.90) / 12.0 (0.74); the previous commit's kernel 254.4 (0.49),
# the three 138.6 (0.91) in tile_sweep_retrace_short_confirm_h200.json (1,048,576x4: 105.7 -> 71.9,
# 0.63 -> 0.93). The sweeps' forms without the three placed the action tiles before the gather of
# pi(a_t | s_t) (238.4 us there); without them the kernel is now the previous commit's. Other
# programs for the three: 1024 steps of 4 warps (a whole row per thread, no bar.sync) 145.5 / 11.8,
# 2048 of 8 143.8 / 11.9, 512 of 4 137.7 / 11.7, 512 of 2 146.1 / 12.1, 4096 of 8 151.1 / 13.9:
# within ~3% of the default, which stays. Action tiles loaded as row segments (4 lanes per 64
# contiguous bytes instead of one step's 16 bytes per lane) lost: 164.7 / 13.0 with the three (their
# layout conversions went through shared memory: 25 bar.sync, 140 registers). On rows of T < BT
# (1,048,576x5, 175.7 us without) SHIFT and PI_TILE lost: 192.4 with both, 223.4 and 182.1 alone, so
# they serve exact rows only. _RETRACE_ENV_MAJOR_BLOCK / _WARPS: sweep overrides of the steps per
# program (at _RETRACE_ACTIONS actions) and warps of env-major rows (None: _BLOCK, _WARPS_SHORT).
_RETRACE_EXACT_T = True
_RETRACE_SHIFT = True
_RETRACE_PI_TILE = True
_RETRACE_ENV_MAJOR_BLOCK: int | None = None
_RETRACE_ENV_MAJOR_WARPS: int | None = None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(x: int) -> int:
    """The smallest power of two >= x (1 for x <= 1). Host-side arithmetic stays in plain Python:
    Triton 3.6's ``triton.cdiv`` / ``next_power_of_2`` are constexpr functions costing ~2 us a call."""
    return 1 << (x - 1).bit_length() if x > 1 else 1


class Tiles(NamedTuple):
    bn: int
    bt: int
    warps: int


def _tiles(n: int, t: int, block: int | None = None) -> Tiles:
    block = _BLOCK if block is None else block
    bt = min(_MAX_BT, block, max(4, _pow2(max(t, 1))))
    bn = max(1, min(block // bt, _pow2(max(n, 1))))
    return Tiles(bn, bt, _WARPS_LONG if bt >= 512 else _WARPS_SHORT)


def _scan_policy(kind: str, dtype: torch.dtype | None) -> tuple:
    if dtype is not None and dtype.itemsize == 2 and kind in _SCAN_POLICY_16BIT:
        return _SCAN_POLICY_16BIT[kind]
    return _SCAN_POLICY[kind]


def _chunk_warps(kind: str, bt: int, dtype: torch.dtype | None = None) -> int:
    """Warps of a one-env program of ``bt`` steps: the kernel's elements per thread, at least
    _WARPS_LONG, at most its cap."""
    _factor, per_thread, max_warps = _scan_policy(kind, dtype)
    return min(max_warps, max(_WARPS_LONG, bt // (32 * per_thread)))


def scan_tiles(kind: str, n: int, t: int, dtype: torch.dtype | None = None) -> Tiles:
    """Single-pass tiles of the fused scan kernel ``kind`` (a key of _SCAN_POLICY) on inputs of
    ``dtype``: those of :func:`_tiles`, except that a row of up to the kernel's one-chunk limit is one
    chunk, with warps for its elements per thread (at least _WARPS_LONG, at most its cap)."""
    factor = _scan_policy(kind, dtype)[0]
    bt = max(4, _pow2(max(t, 1)))
    if bt <= _MAX_BT or bt > min(factor, _ONE_CHUNK_FACTOR) * _MAX_BT:
        return _tiles(n, t)
    return Tiles(1, bt, _chunk_warps(kind, bt, dtype))


# Tile forms of the reverse recurrences of GAE, V-trace and the returns (kernels/core.py), chosen
# from measurements on the H200 (benchmarks/tile_sweep.py --grouped; NOTES.md, "Performance"):
# * group-major [G, BN, S] grouped tiles for chunks of >= 16 steps: they avoid Triton's reverse=True
#   scan (GAE 4096x2048: 0.77 of copy vs 0.62 plain; 262144x32: 0.94 vs 0.72; discounted returns
#   65536x128: 0.95 vs 0.68);
# * env-major [BN, G, 4] grouped tiles for chunks of <= 8 steps, where a thread holds a whole row
#   and the scan across groups stays in registers (1,048,576x8, previous session: GAE 0.61, V-trace
#   0.68, discounted 0.63, TD(lambda) 0.68; group-major measured 0.39-0.52 there, plain 0.52-0.57).
# Forward recurrences have no reverse scan to avoid and use plain tiles; Retrace chooses in
# retrace_tiles().
_GROUPED_MIN_BT = 16
_ENV_MAJOR_MAX_BT = 8
_GROUP_16BIT = 8
# Env-major rows of exactly BT steps (4 or 8) in one pass (scan_form; the constexpr EXACT_T of fused.py's gae_kernel,
# vtrace_kernel and returns_kernel), as Retrace's (_RETRACE_EXACT_T): the row length as a constexpr. Triton
# specialises T on multiples of 16 only, so with T a runtime 8 it did not know rows 16-byte aligned: every [N, T] load
# was one element per thread and the env-major groups were split and joined through shared memory (sm_90 code of rows
# of 8 steps in 1024-step programs of 8 warps, the benchmarks' float32 calls: GAE 7 bar.sync, 18 scalar loads, 40
# registers; V-trace 9, 26, 56; discounted returns 7, 8, 38; TD(lambda) 7, 12, 40; with EXACT_T 1 bar.sync, 16-byte
# vector loads and 28, 40, 22, 28 registers; with 4 warps, a whole row per thread, no bar.sync at all). Measured on
# the H200 (tile_sweep_exact_t_h200.json, rows of run 'explore'; kernel us without -> with EXACT_T, fraction of copy;
# float32 at 1,048,576x8 / 32,768x8 / 1,048,576x4): GAE 41.4 (0.76) -> 34.7 (0.91) / 7.1 -> 6.7 / 34.9 (0.56) -> 20.6
# (0.94); V-trace 65.5 (0.86) -> 57.3 (0.98; 63.6 with 8 warps) / 8.0 -> 7.6 / 34.5 (0.90) -> 32.3 (0.96); discounted
# returns 33.7 (0.70) -> 25.8 (0.92) / 6.7 -> 6.1 / 17.8 (0.83) -> 14.9 (0.99); TD(lambda) 41.7 (0.74) -> 33.2 (0.93)
# / 7.6 -> 6.3 / 22.8 (0.81) -> 19.3 (0.96). bfloat16 at 1,048,576x8, without -> 8 warps / 4 warps: GAE 42.0 -> 22.5 /
# 22.0, V-trace 47.0 -> 34.1 / 33.2, discounted 31.4 -> 17.7 / 15.9, TD(lambda) 36.8 -> 21.7 / 20.8 (at 1,048,576x4,
# where 8 warps give a row per thread already: 25.1 -> 14.0, 28.6 -> 20.3, 17.1 -> 10.7, 20.0 -> 13.2; 14.2, 21.1,
# 10.7, 13.3 with 4). Hence rows of 8 steps take _EXACT_T_ROW_WARPS warps, a whole row per thread (of a 2-byte dtype:
# one 16-byte load), in the kernels of _EXACT_T_ROW_KINDS and for 2-byte dtypes; GAE's and the returns' float32 rows
# keep 8 warps (with 4: GAE 35.3 us, discounted 25.7, TD(lambda) 34.5). Other programs lost or tied (float32
# 1,048,576x8, GAE / V-trace / discounted / TD(lambda): 2048 steps of 8 warps 35.7 / 57.6 / 25.7 / 34.5; 512 of 2 35.2
# / 57.4 / 25.8 / 34.6; 2048 of 4 36.2 / 61.4 / 29.1 / 34.5). Measured and dropped: values_{t+1} of GAE and V-trace
# shifted in registers (fused._env_next) instead of loaded again at t + 1, as Retrace's SHIFT: GAE 35.2 vs 34.7 us
# with 8 warps, 35.7 vs 35.3 with 4; V-trace 63.3 vs 63.6 with 8, 58.7 vs 57.3 with 4; bfloat16 V-trace 39.4 vs 34.1
# with 8 (with 8 warps a row's two groups sit on two warps, and the shift went through shared memory: 5 bar.sync
# instead of 1); only 32,768x8 gained a few tenths of a us (V-trace 7.2 vs 7.6 with 4 warps). The final code (run
# 'confirm'), without -> with EXACT_T at 1,048,576x8, float32 / bfloat16: GAE 41.6 -> 34.8 (0.91 of copy) / 42.2 ->
# 22.1 (0.88), V-trace 65.4 -> 57.5 (0.98) / 47.2 -> 33.4 (0.94), discounted 33.8 -> 25.8 (0.92) / 31.8 -> 16.2
# (0.96), TD(lambda) 41.9 -> 33.2 (0.93) / 36.9 -> 20.8 (0.93); the same bits in every row. _EXACT_T_BLOCK /
# _EXACT_T_WARPS: sweep overrides of the steps per program and the warps of those rows (None: _tiles' steps, the warps
# above).
_EXACT_T = True
_EXACT_T_ROW_WARPS = 4
_EXACT_T_ROW_KINDS = ("vtrace",)
_EXACT_T_BLOCK: int | None = None
_EXACT_T_WARPS: int | None = None
# Longer rows of exactly one chunk (T == BT) in programs of one env take EXACT_T as well, in the kernels of
# _EXACT_T_ONE_CHUNK: with the row length a constexpr and a constant env mask (core.env_block), every mask of the chunk
# folds away (sm_90 code of GAE at 4096x2048: 728 -> 576 instructions). Rows of such a T (a power of two, 1024-4096
# steps: the chunk sizes) are a size class of their own. Measured on the H200 (exact_one_chunk_h200.json; kernel us
# without -> with, fraction of copy; the same bits): GAE 4096x2048 35.1 -> 32.4 (0.87 -> 0.94), bfloat16 8192x4096
# 73.4 -> 65.7 (0.83 -> 0.93), 8192x2048 39.5 -> 35.2; discounted returns 8192x4096 82.2 -> 77.5, bfloat16 53.7 ->
# 49.7; TD(lambda) 8192x4096 110.0 -> 107.3, 4096x2048 32.1 -> 32.3; rows of 1024 steps within 0.2 us. V-trace is left
# out: bfloat16 8192x4096 156.5 -> 185.4, float32 216.7 -> 218.2 (a first run, printed only; 4096x2048 57.6 -> 56.6).
_EXACT_T_ONE_CHUNK = ("gae", "returns", "returns_nv")
# Single-pass rows of several whole chunks (T a multiple of BT) in programs of one env, in the kernels and element
# sizes of _WHOLE_CHUNKS (Retrace: grouped tiles of few actions only): the WHOLE constexpr drops the time mask
# (core.chunk) and makes the env mask a constant (core.env_block); 7-11% fewer sm_90 instructions in the walked
# 1024-step chunks. Measured on the H200 (whole_chunks_h200.json; kernel us without -> with, the same bits):
# discounted returns 1024x8192 32.6 -> 27.2, TD(lambda) bfloat16 1024x8192 27.9 -> 24.4; Retrace (A = 4) bfloat16
# 8192x4096 367.6 -> 344.9, 4096x2048 102.6 -> 98.8, float32 533.5 -> 533.9 and 144.5 -> 144.9. Left out, slower:
# GAE float32 8192x4096 123.4 -> 139.6 (bfloat16 4096x8192 95.0 -> 93.5), V-trace 1024x8192 78.6 -> 80.7, Retrace with
# 18 actions (plain tiles) 4096x2048 367.9 -> 502.2.
_WHOLE_CHUNKS: dict = {"returns": (4, 2), "returns_nv": (4, 2), "retrace": (2,)}  # kind -> element sizes

# Rows whose length is a multiple of 4 or 8 but not of 16 (T = 20, 100, 1000, ...): the fused kernels
# take TDIV = 8 or 4 (core.row_length), from which Triton can prove 4- or 8-step rows 16-byte (or 32-byte)
# aligned; it specialises T on multiples of 16 only. _ROW_DIVISOR = False: never (sweeps). Rows of exactly
# 4 or 8 steps take EXACT_T instead. Each divisor is a size class of its own (one more compilation).
# Measured on the H200 (tile_sweep_row_divisor_h200.json, float32 kernel us without -> with): V-trace
# 4096x1000 73.6 -> 31.2 (0.41 -> 0.96 of copy), Retrace 120.0 -> 70.2, GAE 26.2 -> 19.8; 262,144x12 GAE
# 28.7 -> 16.8, discounted 20.3 -> 13.1; 65,536x20 and 16,384x100 likewise (NOTES.md, item Y).
_ROW_DIVISOR = True


def _row_divisor(t: int, exact: bool = False) -> int:
    """The TDIV constexpr of the fused kernels for rows of ``t`` steps (1: nothing to add to what
    Triton's own specialisation knows)."""
    if not _ROW_DIVISOR or exact or t % 16 == 0:
        return 1
    return 8 if t % 8 == 0 else 4 if t % 4 == 0 else 1


def _grouped(tiles: Tiles) -> bool:
    """Whether group-major grouped tiles serve this chunk length."""
    return tiles.bt >= _GROUPED_MIN_BT


def _group_major(tiles: Tiles, dtype: torch.dtype) -> int:
    """Steps per group of group-major tiles: _GROUP_16BIT for 2-byte floats (8 steps: 16-byte vector
    loads, as 4 float32 steps give) when every thread holds at least a whole group (else the group's
    split and join cross threads, through shared memory; read from the PTX), 4 otherwise."""
    per_thread = tiles.bn * tiles.bt // (32 * tiles.warps)
    if dtype.itemsize == 2 and tiles.bt >= _GROUP_16BIT and per_thread >= _GROUP_16BIT:
        return _GROUP_16BIT
    return 4


def _group(tiles: Tiles, dtype: torch.dtype) -> int:
    """The kernels' GROUPED constexpr: steps per group of group-major tiles (> 0), -4 for env-major
    groups of 4, 0 for plain tiles."""
    if _grouped(tiles):
        return _group_major(tiles, dtype)
    return -4 if tiles.bt <= _ENV_MAJOR_MAX_BT else 0


@functools.lru_cache(maxsize=256)
def hp(x: float) -> tuple[float, float]:
    """``x`` as float32 ``(hi, lo)`` with ``hi + lo`` equal to ``x`` to ~1e-15 relative."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow to inf is fine: hi carries it
        hi = float(np.float32(x))
        lo = float(np.float32(x - hi)) if np.isfinite(hi) else 0.0
    return hi, lo


def _acc(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


# ----------------------------------------------------------------------------------------------
# Launch plans and the launch fast path.
#
# Everything a call launches apart from its tensors and float hyper-parameters -- tiles, constexprs,
# grids, the multi-block split, and after the first launch Triton's compiled kernel -- depends only
# on the call signature that the validation cache keys on (function, shapes, dtypes, device, which
# optional inputs are given, each input's 16-byte alignment) and on the launcher's options. So it
# is computed once per signature into a _Plan, kept next to the validation cache entry
# (``Prepared.plans``), and later calls only build the argument tuple and launch.
#
# The launch itself: ``kernel[grid](...)`` spends ~20 us of host time per call in Triton's Python
# dispatcher (argument binding, specialisation key, cache lookup; benchmarks/host_overhead.py on the
# H200's host). A plan keeps the compiled kernel of its first launch and calls Triton's generated C
# launcher directly. That is valid because the plan's signature fixes everything Triton specialises
# on for these kernels: constexprs, warps, device, tensor dtypes and 16-byte alignment (outputs and
# scratch are fresh allocations), and the ints (shapes: 1 / multiple of 16); floats are
# do_not_specialize. Launch hooks, the interpreter, uncached signatures (non-contiguous inputs) or
# a Triton whose launcher we do not recognise take Triton's normal path.


def _on_device(device: torch.device):
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device.index)
    return contextlib.nullcontext()


def _fast_path_knobs():
    """Triton's ``knobs`` module when the fast path is supported by this Triton, else None."""
    try:
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return None
    return knobs if hasattr(CompiledKernel, "packed_metadata") or hasattr(CompiledKernel, "run") else None


def _direct_launch_format() -> bool:
    """Whether the CUDA launcher's positional arguments are those of Triton 3.6 (grid x 3, stream,
    function, cooperative, PDL, global and profile scratch, packed metadata, launch metadata, enter
    and exit hooks, then the kernel's arguments), so its C function can be called directly."""
    try:
        from triton.backends.nvidia import driver
    except ImportError:
        return False
    return getattr(driver, "_BASE_ARGS_FORMAT", None) == "iiiKKppOOOOOO"


_KNOBS = _fast_path_knobs()
_FAST = _KNOBS is not None
_DIRECT = _FAST and _direct_launch_format()


def _hooks_active(knobs) -> bool:
    """Triton 3.6 keeps launch hooks in (usually empty) HookChains; older versions use None."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _direct(ck, kernel, n_args: int, constexprs: dict):
    """A function ``(grid, stream, args)`` launching compiled kernel ``ck`` without Triton's
    dispatcher (hooks inactive: the caller checks)."""
    if hasattr(ck, "result"):  # some Triton versions return a future from kernel[grid](...)
        ck = ck.result()
    trailing = tuple(constexprs[name] for name in kernel.arg_names[n_args:])
    run, function, packed = ck.run, ck.function, ck.packed_metadata
    raw = getattr(run, "launch", None)
    if (
        _DIRECT
        and raw is not None
        and getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
    ):
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl

        def go(grid, stream, args):
            raw(grid[0], grid[1], 1, stream, function, coop, pdl, None, None, packed, None, None, None, *args,
                *trailing)  # fmt: skip

        return go

    def go(grid, stream, args):
        run(grid[0], grid[1], 1, stream, function, packed, None, None, None, *args, *trailing)

    return go


class _Plan:
    """The launches of one call signature (see above). ``split`` says which scratch arguments the
    multi-block forms append to the kernel's arguments: (0, chunks per block) single pass,
    (3, N, blocks, acc dtype, epoch flags) one-pass look-back (flags: _scratch), (1, N, blocks, chunks
    per block, acc dtype) two passes."""

    __slots__ = ("kernel", "device", "launches", "split", "fast", "cached", "flags")

    def __init__(self, kernel, device: torch.device, launches: list, split: tuple, cached: bool):
        self.kernel, self.device, self.launches, self.split = kernel, device, launches, split
        self.cached = cached  # reused by later calls: worth keeping the compiled kernels
        self.fast = [None] * len(launches)
        self.flags = {}  # look-back flag buffers by stream (_lookback_flags)


def _cached_plan(plans: dict | None, options: tuple, build) -> _Plan:
    """The plan stored under ``options`` in ``plans`` (a validation cache entry's; None when the
    signature is not cached), built by ``build(cached)`` the first time."""
    if plans is None:
        return build(False)
    plan = plans.get(options)
    if plan is None:
        plan = plans[options] = build(True)
    return plan


def _scratch(plan: _Plan, args: tuple) -> tuple:
    """Per launch, the scratch arguments appended to ``args`` (multi-block aggregates and flags)."""
    split = plan.split
    kind = split[0]
    if kind == 0:
        dummy = args[0]
        return ((dummy, dummy, dummy, 1, split[1]),)
    if kind == 3:
        # one chunk per time block; [2, N, NK] block and window aggregates, a flag buffer (core.EPOCH_LINE):
        # kept from call to call with epochs (PHASE 5), else zeroed for each call
        # time-major blocks of w envs: tagged words in the flag buffer (core.lookback_envs), no aggregates
        _, n, nk, acc, epochs, w = split
        device = args[0].device
        size = core.flag_buffer_size(n, nk, epochs) if w == 1 else core.tm_flag_buffer_size(n, nk, w)
        flags = _lookback_flags(plan, device, size) if epochs else _zero_flags(device, size)
        if w > 1:
            return ((flags, flags, flags, nk, 1),)
        agg_a = torch.empty((2, n, nk), dtype=acc, device=device)
        return ((agg_a, torch.empty_like(agg_a), flags, nk, 1),)
    _, n, nk, cpb, acc = split
    agg_a = torch.empty((n, nk), dtype=acc, device=args[0].device)
    extra = (agg_a, torch.empty_like(agg_a), agg_a, nk, cpb)
    return (extra, extra)


# The look-back's flag buffers (core.lookback). In PHASE 5 each row's flags are tagged with an epoch
# that the kernel reads from the buffer and advances by 2 when the row is done, so flags left by earlier
# calls read as unpublished and a buffer is zeroed once, when allocated, instead of by a fill kernel per
# call (~1.3 us of GPU time in a CUDA graph, measured on the H200). Launches of more than
# _EPOCH_MAX_BLOCKS blocks keep zeroed flags (PHASE 4): there the epoch cost more than the fill saved.
# H200, CUDA-graph replays, kernel us without -> with epochs (NOTES.md "Performance", item Z;
# benchmarks/results/lookback_epochs*_h200.json): 1x1,048,576 (256-1024 blocks) GAE 14.4 -> 13.0,
# discounted 13.7 -> 12.4, TD(lambda) 14.9 -> 13.8, V-trace 21.6 -> 20.7, Retrace 36.8 -> 34.6; with
# epochs at every size, 8192-16384 blocks: discounted 1x16,777,216 79.8 -> 81.0, traces 80.3 -> 81.2,
# V-trace 16x1,048,576 177.6 -> 177.9, GAE 1x16,777,216 96.4 -> 95.0. The epochs are
# per row, so a buffer serves one layout (rows, blocks per row): each plan keeps its own, one per
# stream (calls on one stream run in order; calls on two streams may overlap). A call being captured
# in a CUDA graph takes its own slice of an arena zeroed beforehand and keeps it for as long as the
# process lives: replays of different graphs may run concurrently, replays of one graph do not. The
# arena is allocated and zeroed, and its zeros waited for once (the graph may replay on a stream not
# ordered after the fill), by a call that is not being captured; a capture that finds no arena, or too
# little of it left, and calls of uncached signatures zero fresh flags as before (correct, one fill
# kernel more per call). Under the interpreter the programs run one after another: stream 0.
_EPOCH_MAX_BLOCKS = 4096
_ARENA_SIZE = 1 << 18  # int32 elements (1 MiB): e.g. 800 captured 1x1,048,576 GAE calls of 256 blocks
_ARENAS: dict = {}  # device index -> [zeroed int32 tensor, elements handed out]
_LEASED: list = []  # every arena that handed out a slice to a graph: graphs outlive any reference of ours


def _lookback_flags(plan: _Plan, device: torch.device, size: int) -> torch.Tensor:
    """An int32 flag buffer of ``size`` elements (core.flag_buffer_size) for a look-back launch of
    ``plan`` on ``device``'s current stream (see above)."""
    stream = 0
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        if torch.cuda.is_current_stream_capturing():
            return _lease(device, index, size)
        stream = torch._C._cuda_getCurrentRawStream(index)
        arena = _ARENAS.get(index)
        if arena is None or arena[0].numel() - arena[1] < size:
            _ARENAS[index] = [_zeroed(device, max(_ARENA_SIZE, 2 * size)), 0]
    if not plan.cached:
        return _zero_flags(device, size)
    buf = plan.flags.get(stream)
    if buf is None:
        buf = plan.flags[stream] = _zero_flags(device, size)
    return buf


def _zero_flags(device: torch.device, size: int) -> torch.Tensor:
    """A zeroed flag buffer (the int32 of core.lookback's flags and epochs)."""
    return torch.zeros(size, dtype=torch.int32, device=device)


def _zeroed(device: torch.device, size: int) -> torch.Tensor:
    """Zeros on ``device``, waited for (an event on the current stream, not a device-wide sync)."""
    buf = _zero_flags(device, size)
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(device))
    done.synchronize()
    return buf


def _lease(device: torch.device, index: int, size: int) -> torch.Tensor:
    """A captured call's own flags: a slice of the device's arena, or fresh zeros (see above)."""
    arena = _ARENAS.get(index)
    size = -(-size // core.EPOCH_LINE) * core.EPOCH_LINE  # whole 128-byte lines
    if arena is None or arena[0].numel() - arena[1] < size:
        return _zero_flags(device, size)
    buf = arena[0][arena[1] : arena[1] + size]
    if arena[1] == 0:
        _LEASED.append(arena[0])
    arena[1] += size
    return buf


def _run(plan: _Plan, args: tuple) -> None:
    """Launches every launch of ``plan`` with the kernel arguments ``args`` (scratch appended)."""
    for i, extra in enumerate(_scratch(plan, args)):
        _launch(plan, i, (*args, *extra))


def _launch(plan: _Plan, i: int, args: tuple) -> None:
    grid, constexprs, warps = plan.launches[i]
    device = plan.device
    go = plan.fast[i]
    if go is not None and not _hooks_active(_KNOBS):
        current = torch._C._cuda_getDevice()
        index = current if device.index is None else device.index
        if index == current:
            go(grid, torch._C._cuda_getCurrentRawStream(index), args)
        else:
            with torch.cuda.device(index):
                go(grid, torch._C._cuda_getCurrentRawStream(index), args)
        return
    with _on_device(device):
        ck = plan.kernel[grid](*args, **constexprs, num_warps=warps)
    if plan.cached and _FAST and not _config.INTERPRET and device.type == "cuda" and not _hooks_active(_KNOBS):
        plan.fast[i] = _direct(ck, plan.kernel, len(args), constexprs)
        _COMPILED[(plan.kernel, warps, tuple(constexprs.items()))] = ck


# Every compiled kernel the fast path keeps, by (kernel, warps, constexprs), for
# benchmarks/tile_sweep.py's register and spill report.
_COMPILED: dict = {}


# Multi-block scans (kernels/core.py): when the env blocks alone give too few programs for the
# GPU (fewer than _TARGET_PROGRAMS / 2) and rows span at least _MIN_CHUNKS_FOR_SPLIT chunks, each
# row is split into time blocks, scanned either in one launch (PHASE 3-5, the look-back: one chunk
# per block, one env per program, inputs read once) or in two (PHASE 1 stores each block's
# aggregate, PHASE 2 folds the aggregates before its block and rescans it; inputs read twice).
# Size classes only: no recompilation.
_TARGET_PROGRAMS = 1024  # H200: 132 SMs, several resident programs each
_MAX_BLOCKS = 1024  # PHASE 2 folds up to this many aggregates per row in registers
_MIN_CHUNKS_PER_BLOCK = 1
_MIN_CHUNKS_FOR_SPLIT = 4  # rows shorter than this stay single-pass
# Per kernel: (chunk of a time block in units of the walked chunk, look-back or two passes, blocks
# per look-back window: core.lookback, raised to sqrt(blocks) where that is more, warps of a block
# longer than a walked chunk: None for _chunk_warps). Measured on the H200 with loop-free blocks
# (benchmarks/results/tile_sweep_long*_h200.json, NOTES.md "Performance"; kernel times for GAE and
# V-trace at 16x1,048,576 and 64x262,144, whose copy baselines in those files are a slow memcpy,
# benchmarks/timing.copy_gbps): the look-back won for every kernel but the forward traces
# (16x1,048,576: GAE 113-119 us vs 121-131 in two passes, V-trace 202-213 vs 229, Retrace
# 0.55-0.57 of copy vs 0.47; traces 0.51 two-pass vs 0.47 look-back, until the register caps below
# turned that round: see _SMALL_SPLIT_POLICY); 2048-step blocks for GAE,
# the returns and TD(lambda) (1x16,777,216: GAE 0.46-0.50 vs 0.43-0.44), 1024 for V-trace and
# Retrace (V-trace 1x16,777,216: 0.49-0.51 vs 0.43-0.47); TD(lambda)'s with 2 warps (16x1,048,576:
# 0.55 vs 0.49 with 4, 1x16,777,216: 0.52 vs 0.49; tile_sweep_long5; until the register caps
# below); windows of 64 blocks for GAE (16x1,048,576: 113 vs 130 us) and TD(lambda) (re-swept with
# blocks numbered by program id, tile_sweep_long7: 64x262,144 0.65 vs 0.61, 1x1,048,576 15.0 vs
# 15.8 us), 256 for the others (V-trace 64x262,144: 187 vs 203 us; 175 vs 192 in long7) but the
# discounted returns, 128 since the caps (1x16,777,216: 80.2-80.3 vs 80.6-81.1 us in three sweeps,
# tile_sweep_returns_window_h200.json; rows of at most 128 blocks are one window either way), which
# lets their cap go down to 64 (below). The same
# sweep found no better block length, window or warps for the others under program ids
# (long7*_h200.json). Last, the register cap of a look-back block (Triton's maxnreg; None: the
# compiler's choice), for float32 inputs: a look-back block holds its chunk in registers while it
# waits for the blocks before it, so its throughput is set by how many blocks fit on an SM, and
# capping GAE's and the discounted returns' 93 registers at 72 (7 blocks of 4 warps per SM instead
# of 5), V-trace's 118 at 80 (6 instead of 4) and Retrace's 136 at 128 (4 instead of 3) paid for
# the few registers spilled around the wait (2-10, 14, 6; stored once before it, loaded once
# after): 16x1,048,576 GAE 105.2 -> 94.9 us, discounted 88.8 -> 79.7 us, V-trace 198.0 -> 178.8 us
# (tile_sweep_nreg_h200.json), Retrace 390.2 -> 359.6 us; the discounted returns' 72 became 64 with
# windows of 128 (16x1,048,576: 76.3-76.5 vs 79.3-80.0 us in three sweeps, 1x16,777,216 80.6-81.1
# vs 80.3-81.2, 64x262,144 71.3 vs 72.5; tile_sweep_returns_window_h200.json; at windows of 256 the
# cap of 64 lost: 84.9 vs 80.7 and 82.8 vs 79.7); TD(lambda) now takes 4-warp blocks
# capped at 80 registers (0-4 spills): 97.6 -> 93.0 us (tile_sweep_nreg2_h200.json); the forward
# traces' look-back blocks, 2048 steps capped at 72, beat their two passes from 4096 blocks on
# (_SMALL_SPLIT_POLICY; uncapped they lost: 1x16,777,216 88.0 vs 87.6 us). Reading the
# chunk twice instead of holding it (72 registers for GAE, no spill) was slower (NOTES.md,
# "Performance", item P).
_SPLIT_POLICY = {
    "gae": (2, True, 64, None, 72),
    "vtrace": (1, True, 256, None, 80),
    "returns": (2, True, 128, None, 64),
    "returns_nv": (2, True, 64, 4, 80),
    "forward": (2, True, 256, None, 72),
    "retrace": (1, True, 256, None, 128),
}
# Small launches: a launch of fewer than _SMALL_BLOCKS[kernel] time blocks, counted at its
# _SPLIT_POLICY block length, takes the kernel's _SMALL_SPLIT_POLICY entry instead (absent: the same
# policy at any size). Such launches are latency-bound rather than limited by blocks per SM
# (1x1,048,576 is 512 blocks of 2048 steps). Measured on the H200 (tile_sweep_small_h200.json,
# tile_sweep_fwd_lookback_h200.json; microseconds, small entry vs main policy):
# - no register caps for GAE, the discounted returns and TD(lambda) (1x1,048,576, two sweeps each:
#   GAE 15.2 / 15.1 vs 15.5 / 15.5, discounted 14.4 / 14.6 vs 14.9 / 14.9, TD(lambda) 14.6 vs 14.9;
#   tile_sweep_nreg*_h200.json; V-trace and Retrace gain from theirs there too: 22.0 / 22.1 vs 21.5
#   / 21.3, 40.5 vs 36.7);
# - GAE in 4096-step blocks and windows of up to 512 blocks, one or two per row (1x1,048,576: 14.0 vs
#   15.2, 1x524,288 11.9 vs 12.3, 1x2,097,152 22.5 vs 23.7; 2x1,048,576 and 4x262,144 within 2%; at
#   2048 blocks the main policy wins: 1x4,194,304 36.6 vs 37.8);
# - TD(lambda) in windows of up to 256 blocks (1x1,048,576 14.5 vs 14.6 with windows of 512 against
#   the main policy's 64, 2x1,048,576 20.8 vs 21.5, 4x262,144 13.5 vs 14.3, 1x2,097,152 21.6 vs 22.1;
#   then 256 against 512 in three sweeps, tile_sweep_small_lambda{,2,3}_h200.json: 1x1,048,576
#   14.7-14.9 vs 15.0-15.1, 2x1,048,576 20.6-20.7 vs 21.1-21.4, 1x2,097,152 21.7-21.9 vs 21.9-22.1,
#   shorter rows the same window either way; 128 was faster on single 1-2M-step rows, 14.4-14.5 and
#   21.1-21.2, but slower at 2x1,048,576 and on 524,288-step rows; 4096-step blocks of 8 warps 14.5
#   at 1x1,048,576 but slower at 2x1,048,576, 4x262,144 and 1x2,097,152);
# - the forward traces in two passes over 1024-step blocks below 4096 blocks (1x1,048,576: 12.5 vs
#   13.6 at best by look-back; 1x4,194,304, 2048 blocks: 26.4 vs 27.5), where from 4096 blocks on the
#   look-back wins (1x8,388,608 44.9 vs 48.9, 32x262,144 38.1 vs 42.6, tile_sweep_small_cross_h200
#   .json; 1x16,777,216: 79.2-80.0 vs 87.6, 16x1,048,576 75.9 vs 79.6, 64x262,144 66.8 vs 75.2).
_SMALL_BLOCKS = {"gae": 2048, "returns": 2048, "returns_nv": 2048, "forward": 4096}
_SMALL_SPLIT_POLICY = {
    "gae": (4, True, 512, None, None),
    "returns": (2, True, 128, None, None),
    "returns_nv": (2, True, 256, 4, None),
    "forward": (1, False, 256, None, None),
}
# Sweep overrides (None: the kernel's policy): the block chunk factor of _SPLIT_POLICY (capped by
# _ONE_CHUNK_FACTOR, as one-chunk rows are), the look-back (True / False: always / never), its
# window, and the warps of blocks longer than a walked chunk (else _chunk_warps).
_SPLIT_FACTOR: int | None = None
_LOOKBACK: bool | None = None
_LOOKBACK_WINDOW: int | None = None
_SPLIT_WARPS: int | None = None
# Rows of one chunk run loop-free (ONE in kernels/core.py); False: the chunk loop (sweeps).
_ONE_CHUNK = True
# Multi-block programs of one chunk run loop-free too (the look-back always, two passes then take
# one chunk per block up to _MAX_BLOCKS blocks); False: blocks of several chunks from
# _TARGET_PROGRAMS, walked in a loop (the form measured before loop-free blocks, for sweeps).
_ONE_CHUNK_BLOCKS = True
# Look-back blocks numbered by program id (PHASE 4: no atomic before the loads; relies on the GPU
# starting the programs of a launch in the order of their ids, as CUB's decoupled look-back scan
# does). True: by an atomic ticket (PHASE 3: every block waited for has started, whatever the order).
# Program ids measured faster for every look-back kernel on the H200 (16x1,048,576: GAE 106.8 vs
# 114.0 us, V-trace 200.2 vs 213.7 us, Retrace 0.63 vs 0.55 of copy, TD(lambda) 0.60 vs 0.55,
# discounted 0.46 vs 0.43; tile_sweep_ticket_h200.json).
_TICKET = False
# Sweep override of _SPLIT_POLICY's register cap of float32 look-back blocks (0: no cap).
_MAXNREG: int | None = None
# Register caps (Triton's maxnreg) of single-pass programs, measured on the H200 (NOTES.md, "Performance", item
# AA; kernel us, compiler's choice -> cap, two or three sweeps each, benchmarks/results/tile_sweep_caps_h200.json):
# - GAE in programs of one 512- or 1024-step chunk, 4 warps (rows of 257-1024 steps): 48. The compiler kept 32
#   (bfloat16) or 40 (float32) registers, 16 or 12 programs per SM; with room for 40-48 it schedules the loads
#   better, at 10-12 programs per SM: 16384x512 bfloat16 22.8-23.1 -> 21.9-22.1, float32 33.9-34.0 -> 32.6; 64x512
#   6.27-6.30 -> 5.82-5.92 (bfloat16 6.05 -> 5.54-5.60); 8192x1024 34.3-34.4 -> 32.5 (bfloat16 23.2 -> 22.2), 2048x1024
#   13.8-13.9 -> 12.7, 64x1024 6.46-6.59 -> 5.92-6.02, 4096x1000 unchanged (20.0-20.1). The other kernels of those
#   forms did not gain beyond 2% (discounted returns lost: bfloat16 16.8 -> 17.6 at 512 steps), nor did caps in
#   longer programs (GAE 4096x2048 bfloat16 23.6-23.9 -> 26.0-26.2 at 48: spills).
# - Retrace with 3-4 actions in 8-warp programs of 1024 steps (_RETRACE_SINGLE_MAXNREG): 64 instead of 78-79, 4
#   programs per SM instead of 3, 4-6 registers spilled. Rows walked in 1024-step chunks: 4096x2048 bfloat16
#   121.5-121.8 -> 102.7-102.8, 8192x4096 432.5-433.7 -> 367.3-368.3; float32 147.8-148.1 -> 144.7-145.1 and
#   541.3-542.1 -> 534.6-535.2. One 512-step chunk per row, two rows per program (16384x512): bfloat16 86.4 ->
#   82.9-83.2, but float32 130.7-131.0 -> 133.2-133.4, so 2-byte dtypes only there. 56 spilled more and 72 left
#   3 programs per SM: both slower.
# V-trace gained nothing from caps of 64-80 (8192x4096 bfloat16: 156.4-156.8 uncapped, 158.4-158.6 capped).
# Measured with float32 and bfloat16 inputs only: float64 keeps the compiler's choice.
_SINGLE_CAPS = {"gae": {(512, 4): 48, (1024, 4): 48}}
_RETRACE_SINGLE_MAXNREG = 64
# Sweep override of the caps of single-pass launches (0: none).
_SINGLE_MAXNREG: int | None = None


class Layout(NamedTuple):
    """How a fused kernel covers an [N, T] launch: tiles, time blocks per row (1: single pass),
    chunks per block, and whether a multi-block launch is the one-pass look-back, with its window."""

    tiles: Tiles
    nk: int
    cpb: int
    lookback: bool
    window: int = 1
    maxnreg: int | None = None


def _time_blocks(env_programs: int, n_chunks: int) -> tuple[int, int]:
    """(time blocks, chunks per block) of the walked split of rows of ``n_chunks`` chunks."""
    if env_programs * 2 >= _TARGET_PROGRAMS or n_chunks < _MIN_CHUNKS_FOR_SPLIT:
        return 1, n_chunks
    nk = min(_cdiv(_TARGET_PROGRAMS, env_programs), n_chunks // _MIN_CHUNKS_PER_BLOCK, _MAX_BLOCKS)
    cpb = _cdiv(n_chunks, max(1, nk))
    return _cdiv(n_chunks, cpb), cpb


def _lookback_window(n_chunks: int, window: int) -> int:
    """The look-back's window for rows of ``n_chunks`` one-chunk blocks: ``window`` (at most the blocks rounded up
    to a power of 2), doubled until ``window`` windows cover the row (core.lookback folds at most that many)."""
    window = min(_pow2(n_chunks), window)
    while window * window < n_chunks:
        window *= 2
    return window


def _layout(
    n: int, t_len: int, tiles: Tiles, split_key: str, warps_for=None, dtype: torch.dtype | None = None
) -> Layout:
    """The layout of a launch whose single-pass tiles are ``tiles``; ``split_key`` names the kernel's
    _SPLIT_POLICY entry and ``warps_for(bt)`` the warps of a one-env time block of ``bt`` steps
    (None: blocks keep the single-pass tiles); ``dtype`` the inputs' (None: float32)."""
    n_chunks = _cdiv(t_len, tiles.bt)
    nk, cpb = _time_blocks(_cdiv(n, tiles.bn), n_chunks)
    if nk == 1:
        return Layout(tiles, 1, cpb, False)
    policy = _SPLIT_POLICY[split_key]
    if n * _cdiv(t_len, tiles.bt * policy[0]) < _SMALL_BLOCKS.get(split_key, 0):
        policy = _SMALL_SPLIT_POLICY[split_key]
    factor, lookback, window, block_warps, maxnreg = policy
    factor = min(factor if _SPLIT_FACTOR is None else _SPLIT_FACTOR, _ONE_CHUNK_FACTOR)
    lookback = lookback if _LOOKBACK is None else _LOOKBACK
    window = window if _LOOKBACK_WINDOW is None else _LOOKBACK_WINDOW
    if warps_for is not None and (factor > 1 or tiles.bn == 1):
        bt = tiles.bt * factor
        if _SPLIT_WARPS is not None:
            warps = _SPLIT_WARPS
        else:  # the policy's block warps apply to its longer blocks, not to walked chunks
            warps = block_warps if block_warps is not None and factor > 1 else warps_for(bt)
        tiles, n_chunks = Tiles(1, bt, warps), _cdiv(t_len, bt)
        if n_chunks == 1:
            return Layout(tiles, 1, 1, False)
    if lookback and tiles.bn == 1:
        window = _lookback_window(n_chunks, window)
        if _MAXNREG is not None:
            maxnreg = _MAXNREG or None
        if dtype not in (None, torch.float32):  # the caps were measured with float32 inputs only
            maxnreg = None
        return Layout(tiles, n_chunks, 1, True, window, maxnreg)
    if _ONE_CHUNK_BLOCKS:
        cpb = _cdiv(n_chunks, _MAX_BLOCKS)
        return Layout(tiles, _cdiv(n_chunks, cpb), cpb, False)
    nk, cpb = _time_blocks(_cdiv(n, tiles.bn), n_chunks)
    return Layout(tiles, nk, cpb, False)


def _capped_dtype(dtype: torch.dtype | None) -> bool:
    """Whether single-pass register caps (_SINGLE_CAPS) apply to inputs of ``dtype`` (None: float32)."""
    return dtype is None or dtype == torch.float32 or dtype.itemsize == 2


def scan_layout(kind: str, n: int, t: int, dtype: torch.dtype | None = None) -> Layout:
    """The layout of fused scan kernel ``kind`` (a key of _SCAN_POLICY and _SPLIT_POLICY)."""
    warps_for = functools.partial(_chunk_warps, kind, dtype=dtype)
    layout = _layout(n, t, scan_tiles(kind, n, t, dtype), kind, warps_for, dtype)
    if layout.nk == 1 and layout.cpb == 1 and _capped_dtype(dtype):  # single pass, one chunk per row
        layout = layout._replace(maxnreg=_SINGLE_CAPS.get(kind, {}).get((layout.tiles.bt, layout.tiles.warps)))
    return layout


class ScanForm(NamedTuple):
    layout: Layout
    group: int  # the GROUPED constexpr (kernels/core.py)
    exact_t: bool = False  # the EXACT_T constexpr of kernels/fused.py
    whole: bool = False  # the WHOLE constexpr (_WHOLE_CHUNKS)


def _whole(kind: str, layout: Layout, t: int, dtype: torch.dtype) -> bool:
    """The WHOLE constexpr of a launch of ``layout`` (see _WHOLE_CHUNKS)."""
    tiles = layout.tiles
    walked = layout.nk == 1 and layout.cpb > 1 and tiles.bn == 1 and t % tiles.bt == 0
    return walked and dtype.itemsize in _WHOLE_CHUNKS.get(kind, ())


def scan_form(kind: str, n: int, t: int, dtype: torch.dtype) -> ScanForm:
    """Layout and tile form of fused scan kernel ``kind`` (GAE, V-trace, the returns), with EXACT_T for
    single-pass env-major rows of T == BT steps (4 or 8; _EXACT_T; and 1024-4096 in programs of one env,
    _EXACT_T_ONE_CHUNK) and WHOLE for single-pass rows of several whole chunks (_WHOLE_CHUNKS)."""
    layout = scan_layout(kind, n, t, dtype)
    group = _group(layout.tiles, dtype)
    if not (_EXACT_T and group == -4 and layout.nk == 1 and t == layout.tiles.bt <= _ENV_MAJOR_MAX_BT):
        one_chunk = layout.nk == 1 and layout.cpb == 1 and layout.tiles.bn == 1 and t == layout.tiles.bt
        exact = one_chunk and t > _ENV_MAJOR_MAX_BT and kind in _EXACT_T_ONE_CHUNK
        return ScanForm(layout, group, exact, _whole(kind, layout, t, dtype))
    warps = _EXACT_T_WARPS
    if warps is None:
        rows = t == _ENV_MAJOR_MAX_BT and (kind in _EXACT_T_ROW_KINDS or dtype.itemsize == 2)
        warps = _EXACT_T_ROW_WARPS if rows else layout.tiles.warps
    tiles = _tiles(n, t, block=_EXACT_T_BLOCK)._replace(warps=warps)
    if tiles != layout.tiles:
        layout = _layout(n, t, tiles, kind, None, dtype)
        assert layout.nk == 1 and layout.tiles.bt == t
    return ScanForm(layout, group, True)


# Time-major rows (Prepared.time_major; kernels/core.py, time_stride): consecutive steps of a row are N elements
# apart and consecutive envs adjacent, so a program takes a block of envs (_TM_MIN_ENVS at least: whole 128-byte
# lines of float32 at each step) and walks time in chunks of at most _TM_BT steps; rows of at most
# _ENV_MAJOR_MAX_BT steps take env-major groups (a thread holds its env's whole row), longer ones group-major
# tiles (GAE, V-trace, the returns) or plain ones (the forward scans). Rows split into time blocks as
# contiguous rows do when the env blocks are too few to fill the GPU (the two-pass split: PHASE 1 and 2;
# the look-back takes one env per program). _TM_BT, _TM_BLOCK (elements per chunk), _TM_WARPS and
# _TM_GROUP: the policy (sweep overrides). _TM_NDIV: the env-count divisor the kernels may assume (core.env_count;
# 8 lets float32 loads along the envs vectorise; the returns and the forward scans were faster with scalar loads).
# Measured on the H200 (python -m benchmarks.time_major; NOTES.md "Time-major rollout buffers";
# benchmarks/results/time_major*_h200.json), float32 kernel us, copy path -> in place (contiguous inputs): GAE
# 4096x24 13.3 -> 7.3 (5.8), 4096x512 58.6 -> 21.7 (12.6), 4096x2048 217.6 -> 87.0 (35.4); V-trace 4096x2048 360.3
# -> 143.1 (57.8). No variant of the sweeps (blocks of 8-64 envs, chunks of 16-256 steps, 4 or 8 warps, plain
# tiles, scalar loads) won at every shape; the policy is the best overall.
_TM_MIN_ENVS = 32
_TM_BT = 64
_TM_BLOCK = 2048
_TM_WARPS = 4
_TM_GROUP = 4
_TM_NDIV = {"returns": 1, "forward": 1}  # by kernel kind; 8 for the others
_TM_MAX_SPLIT = 128
# Rows that split (two-pass split of more than one time block) take the look-back over blocks of envs
# (core.lookback_envs), one chunk per block in windows of at least _TM_WINDOW, except float64 rows and, for the kinds
# and element sizes in _TM_LOOKBACK_MIN_SPLIT, splits of fewer time blocks than given there. _TM_NDIV_LOOKBACK: _TM_NDIV
# of look-back launches. _TM_MAX_LOOKBACK: the most blocks per row read in place (time_major_in_place). Measured on the
# H200 (python -m benchmarks.time_major; time_major_lookback*_h200.json; float32 kernel us, look-back vs two-pass
# split): GAE 4096x2048 72.9 vs 86.4, 256x8192 25.4 vs 36.9; V-trace 4096x2048 114.9 vs 142.3; Retrace (A = 4) 4096x2048
# 387.0 vs 506.4; TD(lambda) 256x8192 24.5 vs 36.2; the discounted returns 256x8192 22.6 vs 30.5 (with vector loads:
# 27.4 with scalar ones) but 4096x2048 64.7 vs 58.6 and 1024x2048 21.6 vs 18.2 (splits of 8 and 32 blocks); traces
# 256x8192 23.9 vs 34.9, 12% faster to 10% slower at shorter splits. Windows of 64 were slower. bfloat16
# (time_major_bf16_lookback_ab_h200.json): GAE and TD(lambda) as in float32 (4096x2048 64.0 vs 72.5, 62.8 vs 68.2;
# 256x8192 22.5 vs 34.1, 21.7 vs 33.8), but V-trace slower at splits of 8-32 blocks (4096x2048 130.4 vs 104.8, 1024x2048
# 39.6 vs 28.1; 256x8192 40.0 vs 39.9), hence its 2-byte threshold.
_TM_LOOKBACK = True
_TM_WINDOW = 16
_TM_LOOKBACK_MIN_SPLIT = {"returns": {4: 64, 2: 64}, "vtrace": {2: 64}}  # kind -> element size -> blocks
_TM_NDIV_LOOKBACK = {"forward": 1}
_TM_MAX_LOOKBACK = 2048


def time_major_in_place(n: int, t: int, num_actions: int = 0, dtype: torch.dtype | None = None) -> bool:
    """Whether time-major rows of (n, t) (Retrace's with ``num_actions``) of ``dtype`` are read in place (else the
    validation copies them contiguous).

    - Rows that split into at most _TM_MAX_SPLIT time blocks are. Measured on the H200 (time_major_split_h200.json;
      float32 us, in place vs copy path, two-pass split): 128 blocks (32x8192, 256x8192) 13.1-49.6 vs 15.4-102.6.
    - Longer ones where the look-back serves them (not float64) with at least _TM_MIN_ENVS envs and at most
      _TM_MAX_LOOKBACK blocks per row (time_major_lookback_long*_h200.json; in place vs copy path): 32x65536 (1024
      blocks) GAE 28.0 vs 58.7, discounted returns 34.7 vs 38.0, traces 30.0 vs 37.8; 64x131072 (2048) 154.5 vs
      206.3, 135.0 vs 134.0, 118.2 vs 132.2. Copied: 16x262,144 (4096 blocks) 112.8-148.1 vs 54.0-79.9; 16x65536
      (half of each env block masked) 25.8-32.8 vs 20.8-28.3."""
    split = retrace_time_major_form(n, t, num_actions) if num_actions else time_major_form("gae", n, t)
    if split.layout.nk <= _TM_MAX_SPLIT:
        return True
    lookback = _TM_LOOKBACK and dtype is not None and dtype != torch.float64 and n >= _TM_MIN_ENVS
    return lookback and _cdiv(t, split.layout.tiles.bt) <= _TM_MAX_LOOKBACK


def time_major_form(
    kind: str, n: int, t: int, block: int = 0, warps: int = 0, dtype: torch.dtype | None = None
) -> ScanForm:
    """Layout and tile form of fused scan kernel ``kind`` on time-major rows; ``block`` and ``warps``: elements of a
    chunk and warps, if not _TM_BLOCK and _TM_WARPS (Retrace's). Rows that split into time blocks take the
    look-back over blocks of envs (core.lookback_envs; one chunk per block) with _TM_LOOKBACK, unless ``dtype`` is
    float64 (its aggregates do not fit a tagged word), else the two-pass split. ``dtype`` None: the split."""
    block = block or _TM_BLOCK
    bt = min(_TM_BT, max(4, _pow2(t)), max(4, block // _TM_MIN_ENVS))
    bn = min(max(_TM_MIN_ENVS, block // bt), max(_TM_MIN_ENVS, _pow2(n)))
    if kind == "forward":
        group = 0
    elif bt <= _ENV_MAJOR_MAX_BT:
        group = -4
    else:
        group = _TM_GROUP
    tiles = Tiles(bn, bt, warps or _TM_WARPS)
    n_chunks = _cdiv(t, bt)
    nk, cpb = _time_blocks(_cdiv(n, bn), n_chunks)
    if (
        nk > 1
        and _TM_LOOKBACK
        and dtype is not None
        and dtype != torch.float64
        and nk >= _TM_LOOKBACK_MIN_SPLIT.get(kind, {}).get(dtype.itemsize, 0)
    ):
        return ScanForm(Layout(tiles, n_chunks, 1, True, _lookback_window(n_chunks, _TM_WINDOW)), group)
    return ScanForm(Layout(tiles, nk, cpb, False), group)


# Retrace on time-major rows: chunks of _TM_RETRACE_BLOCK steps with up to _RETRACE_ACTIONS actions (each
# [N, T, A] tile holds A times that many elements), proportionally fewer with more actions (at least
# _RETRACE_MIN_BLOCK; past _RETRACE_GROUPED_MAX_AP actions twice that, as retrace_tiles scales), and
# _TM_RETRACE_WARPS warps; few actions take the tile forms of time_major_form, more (from _RETRACE_PIECES_MIN_AP
# on, one tile per binary digit of A) plain tiles. Measured on the H200 (python -m benchmarks.time_major
# --functions retrace; time_major_retrace*_h200.json), float32 kernel us in place vs the copy path: A = 4,
# 4096x24 11.3 vs 27.9, 4096x2048 506.6 vs 758.2; A = 18, 4096x24 17.2 vs 41.0, 4096x2048 866.0 vs 1724.2. Of the
# variants (blocks of 512-2048, 4 warps, plain tiles), none won at every shape.
_TM_RETRACE_BLOCK = 1024
_TM_RETRACE_WARPS = 8
# Time-major Retrace rows take descending plain tiles (GROUPED = -1, kernels/core.py: time descends along the tile,
# so the reverse recurrence is a forward scan, without the lane-reversing shuffles of a reverse one; the loads run
# along the envs either way), except the env-major groups of rows of at most _ENV_MAJOR_MAX_BT steps with few
# actions. None: the tile forms of time_major_form (few actions) or plain tiles (more). Measured on the H200
# (time_major_desc_retrace_h200.json, kernel us, descending vs the previous forms): float32 A = 4 4096x2048 351.4 vs
# 387.6, 1024x2048 101.0 vs 106.7, 4096x512 93.8 vs 99.6, 256x8192 104.8 vs 110.8, 64x512 12.4 vs 13.1, 16384x32 21.8
# vs 23.8, 4096x24 10.6 vs 11.4; A = 18 (plain tiles before) 16384x32 38.7 vs 48.1, 4096x2048 658.1 vs 688.4, 256x8192
# 228.4 vs 228.0; bfloat16 A = 4 16384x32 15.2 vs 19.9, 4096x2048 346.2 vs 344.1. GAE, V-trace and the returns keep
# group-major tiles (time_major_desc_h200.json: V-trace 4096x2048 145.8 vs 115.0, GAE 1024x2048 26.8 vs 24.4).
_TM_RETRACE_GROUP = -1


def retrace_time_major_form(n: int, t: int, num_actions: int, dtype: torch.dtype | None = None) -> RetraceForm:
    """Retrace's layout and tile form on time-major rows (``dtype``: see time_major_form)."""
    ap = _pow2(num_actions)
    few_actions = ap <= _RETRACE_GROUPED_MAX_AP
    scale = _RETRACE_ACTIONS if few_actions else _RETRACE_MANY_ACTIONS
    block = max(_RETRACE_MIN_BLOCK, _TM_RETRACE_BLOCK * scale // max(ap, _RETRACE_ACTIONS))
    form = time_major_form("retrace", n, t, block, _TM_RETRACE_WARPS, dtype)
    if few_actions and form.group == -4:
        group = -4
    elif _TM_RETRACE_GROUP is not None:
        group = _TM_RETRACE_GROUP
    else:
        group = form.group if few_actions else 0
    return RetraceForm(form.layout, group, ap >= _RETRACE_PIECES_MIN_AP)


def _form(kind: str, p) -> ScanForm:
    """The layout and tile form of a call of fused scan kernel ``kind``."""
    if p.time_major:
        return time_major_form(kind, p.num_envs, p.seq_len, dtype=p.dtype)
    return scan_form(kind, p.num_envs, p.seq_len, p.dtype)


def _tm(p, kind: str, lookback: bool = False) -> int:
    """The TM constexpr of a call of fused scan kernel ``kind``: 0 for env-major rows; for time-major ones the
    largest power of 2 up to _TM_NDIV[kind] (_TM_NDIV_LOOKBACK[kind] for the look-back; default 8) that divides
    the env count (core.env_count: with float32 envs in 4s every step starts 16-byte aligned, and loads along the
    envs vectorise)."""
    if not p.time_major:
        return 0
    d = (_TM_NDIV_LOOKBACK if lookback else _TM_NDIV).get(kind, 8)
    while p.num_envs % d:
        d //= 2
    return d


def _tdiv(p, exact: bool = False) -> int:
    """The TDIV constexpr of a call (1 for time-major rows, whose loads run along the envs)."""
    return 1 if p.time_major else _row_divisor(p.seq_len, exact)


# Register caps are Triton's `maxnreg` option, which its NVIDIA backend has and its AMD backend rejects (an
# unrecognised keyword): a PyTorch built for ROCm launches without them.
_CAPS = torch.version.hip is None


def _cap_option(maxnreg: int | None) -> dict:
    """The launch option of a register cap (Triton's, not a constexpr); none for None / 0 or without _CAPS."""
    return {"maxnreg": maxnreg} if maxnreg and _CAPS else {}


def _scan_plan(kernel, n: int, device, constexprs: dict, layout: Layout, cached: bool = False) -> _Plan:
    """The launches of a fused kernel: single pass, one-pass multi-block scan (PHASE 3-5, look-back) or
    two-pass multi-block scan (PHASE 1, then PHASE 2)."""
    tiles, nk, cpb = layout.tiles, layout.nk, layout.cpb
    env_programs = _cdiv(n, tiles.bn)
    constexprs = {**constexprs, "BN": tiles.bn, "BT": tiles.bt}
    if nk == 1:
        one = cpb == 1 and _ONE_CHUNK  # rows of one chunk: loop-free (kernels/core.py, ONE)
        options = _cap_option(layout.maxnreg if _SINGLE_MAXNREG is None else _SINGLE_MAXNREG)
        launch = ((env_programs, 1), {**constexprs, "PHASE": 0, "ONE": one, "NKP": 1, **options}, tiles.warps)
        return _Plan(kernel, device, [launch], (0, cpb), cached)
    acc = torch.float64 if constexprs["ACC"] == tl.float64 else torch.float32
    one = cpb == 1 and _ONE_CHUNK_BLOCKS
    if layout.lookback:  # one env per program (n rows), or blocks of tiles.bn time-major envs (core.lookback_envs)
        blocks = env_programs * nk
        phase = 3 if _TICKET and tiles.bn == 1 else 5 if blocks <= _EPOCH_MAX_BLOCKS else 4
        options = _cap_option(layout.maxnreg)
        launch = ((blocks, 1), {**constexprs, "PHASE": phase, "ONE": one, "NKP": layout.window, **options}, tiles.warps)
        return _Plan(kernel, device, [launch], (3, env_programs, nk, acc, phase == 5, tiles.bn), cached)
    nkp = _pow2(nk)
    launches = [
        ((env_programs, nk), {**constexprs, "PHASE": phase, "ONE": one, "NKP": nkp}, tiles.warps) for phase in (1, 2)
    ]
    return _Plan(kernel, device, launches, (1, n, nk, cpb, acc), cached)


def _dummy(t: dict, key: str, fallback: torch.Tensor) -> torch.Tensor:
    """Optional inputs that are absent are passed as some valid pointer the kernel never reads."""
    x = t.get(key)
    return fallback if x is None else x


def _bootstrapped_plan(kernel, kind: str, p, next_all: bool, cached: bool, **extra) -> _Plan:
    """The plan of GAE's or V-trace's kernel: both take the same optional inputs (truncateds,
    bootstrap values, last value), the next-values form and the tile forms (``extra``: further
    constexprs)."""
    t = p.tensors
    form = _form(kind, p)
    constexprs = dict(
        HAS_TRUNC=t.get("truncateds") is not None, HAS_BOOT=t.get("bootstrap_values") is not None,
        HAS_LAST=t.get("last_value") is not None, NEXT_ALL=next_all, **extra, ACC=_acc(p.dtype),
        GROUPED=form.group, EXACT_T=form.exact_t, TDIV=_tdiv(p, form.exact_t), TM=_tm(p, kind, form.layout.lookback),
        WHOLE=form.whole,
    )  # fmt: skip
    return _scan_plan(kernel, p.num_envs, p.device, constexprs, form.layout, cached=cached)


def gae(p, gamma: float, lambda_: float, next_all: bool = False, target: bool = False):
    """GAE's advantages; with ``target``, ``(advantages, advantages + values)`` from the same
    launch (the value targets, rounded as the separate add would round them)."""
    t = p.tensors
    r = t["rewards"]
    out = p.new_output()
    tgt = p.new_output() if target else out

    def build(cached: bool) -> _Plan:
        return _bootstrapped_plan(fused.gae_kernel, "gae", p, next_all, cached, TARGET=target)

    _run(
        _cached_plan(p.plans, ("gae", next_all, target), build),
        (r, t["values"], t["terminateds"], _dummy(t, "truncateds", r), _dummy(t, "bootstrap_values", r),
        _dummy(t, "last_value", r), out, tgt, p.num_envs, p.seq_len, *hp(gamma), *hp(lambda_)),
    )  # fmt: skip
    return (out, tgt) if target else out


def vtrace(p, gamma: float, rho_bar: float, c_bar: float, next_all: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    t = p.tensors
    r = t["rewards"]
    vs, adv = p.new_output(), p.new_output()

    def build(cached: bool) -> _Plan:
        return _bootstrapped_plan(fused.vtrace_kernel, "vtrace", p, next_all, cached)

    _run(
        _cached_plan(p.plans, ("vtrace", next_all), build),
        (t["log_pi_target"], t["log_pi_behavior"], t["values"], r, t["terminateds"], _dummy(t, "truncateds", r),
        _dummy(t, "bootstrap_values", r), _dummy(t, "last_value", r), vs, adv, p.num_envs, p.seq_len,
        *hp(gamma), *hp(rho_bar), *hp(c_bar)),
    )  # fmt: skip
    return vs, adv


def retrace_tiles(n: int, t: int, num_actions: int) -> tuple[Tiles, bool]:
    """Retrace's tiles and tile form (grouped or not). The [N, T, A] inputs are loaded as [..., AP]
    tiles (AP: the actions rounded up to a power of two) or, from _RETRACE_PIECES_MIN_AP on, as one
    tile per binary digit of A: programs of _BLOCK * _RETRACE_ACTIONS / AP steps (_RETRACE_MANY_ACTIONS
    beyond _RETRACE_GROUPED_MAX_AP) keep the tile size whatever the number of actions. Measured on the
    H200 (benchmarks/tile_sweep.py, NOTES.md): with 4 actions, grouped tiles and 8 warps (4096x2048:
    0.85 of copy; 4 warps 0.66, plain 0.48); with 18 actions, plain tiles, 8 warps and 256-step
    programs in pieces (0.96; one padded tile of 32 actions: 0.53 at best, 128 steps and 4 warps;
    tile_sweep_retrace18_pieces_h200.json)."""
    ap = _pow2(num_actions)
    few_actions = ap <= _RETRACE_GROUPED_MAX_AP
    scale = _RETRACE_ACTIONS if few_actions else _RETRACE_MANY_ACTIONS
    tiles = _tiles(n, t, block=max(_RETRACE_MIN_BLOCK, _BLOCK * scale // ap))
    tiles = tiles._replace(warps=_WARPS_SHORT)
    return tiles, few_actions and _grouped(tiles)


class RetraceForm(NamedTuple):
    layout: Layout
    group: int  # the GROUPED constexpr (kernels/core.py)
    pieces: bool  # the PIECES constexpr (kernels/fused.py)
    exact_t: bool = False  # the env-major constexprs of kernels/fused.py's retrace_kernel
    shift: bool = False
    pi_tile: bool = False  # where no next-step probabilities are given (the launcher checks)
    whole: bool = False  # the WHOLE constexpr (_WHOLE_CHUNKS)


def retrace_layout(n: int, t: int, num_actions: int, dtype: torch.dtype) -> RetraceForm:
    """Retrace's layout and tile form. Env-major groups for short rows of few actions: 1,048,576x8,
    0.49 of copy vs 0.45 plain; 32,768x8, 14.5 vs 14.9 us (tile_sweep_retrace_envmajor_h200.json);
    with their kernel variants since (_RETRACE_EXACT_T ...), 0.90 of copy and 12.0 us."""
    tiles, grouped = retrace_tiles(n, t, num_actions)
    ap = _pow2(num_actions)
    pieces = ap >= _RETRACE_PIECES_MIN_AP
    if grouped:
        group = _group_major(tiles, dtype)
    elif _RETRACE_ENV_MAJOR and ap <= _RETRACE_GROUPED_MAX_AP and tiles.bt <= _ENV_MAJOR_MAX_BT:
        group = -4
    else:
        group = 0
    if group < 0:  # rows of one chunk (T <= BT <= _ENV_MAJOR_MAX_BT), which SHIFT needs
        block = _BLOCK if _RETRACE_ENV_MAJOR_BLOCK is None else _RETRACE_ENV_MAJOR_BLOCK
        warps = _WARPS_SHORT if _RETRACE_ENV_MAJOR_WARPS is None else _RETRACE_ENV_MAJOR_WARPS
        tiles = _tiles(n, t, block=max(_RETRACE_MIN_BLOCK, block * _RETRACE_ACTIONS // ap))._replace(warps=warps)
        assert t <= tiles.bt <= _ENV_MAJOR_MAX_BT
    layout = _layout(n, t, tiles, "retrace", _retrace_block_warps, dtype)
    if group >= 0:
        if (
            layout.nk == 1
            and _capped_dtype(dtype)
            and ap == _RETRACE_ACTIONS
            and layout.tiles.warps == 8
            and layout.tiles.bn * layout.tiles.bt == 1024
            and (layout.cpb > 1 or (dtype.itemsize == 2 and layout.tiles.bt == 512))
        ):
            layout = layout._replace(maxnreg=_RETRACE_SINGLE_MAXNREG)  # see _SINGLE_CAPS
        return RetraceForm(layout, group, pieces, whole=group > 0 and _whole("retrace", layout, t, dtype))
    exact = _RETRACE_EXACT_T and t == tiles.bt and layout.nk == 1  # SHIFT and PI_TILE: exact rows only
    pi_tile = exact and _RETRACE_PI_TILE and not pieces
    return RetraceForm(layout, group, pieces, exact, exact and _RETRACE_SHIFT, pi_tile)


def _retrace_block_warps(bt: int) -> int:
    """Retrace's time blocks take _WARPS_LONG warps whatever the actions (16x1,048,576, A = 4: 0.57 of
    copy with 4 warps, 0.50 with 8; tile_sweep_long*_h200.json)."""
    return _WARPS_LONG


def retrace(p, gamma: float, lambda_: float, c_bar: float, rho_bar: float) -> tuple[torch.Tensor, torch.Tensor]:
    t = p.tensors
    probs = t["action_probs_target"]
    qt, adv = p.new_output(), p.new_output()

    def build(cached: bool) -> _Plan:
        if p.time_major:
            form = retrace_time_major_form(p.num_envs, p.seq_len, p.num_actions, p.dtype)
        else:
            form = retrace_layout(p.num_envs, p.seq_len, p.num_actions, p.dtype)
        constexprs = dict(
            A=p.num_actions, AP=_pow2(p.num_actions), PIECES=form.pieces, HAS_TRUNC=t.get("truncateds") is not None,
            ACC=_acc(p.dtype), GROUPED=form.group, EXACT_T=form.exact_t, SHIFT=form.shift,
            PI_TILE=form.pi_tile and t.get("next_action_probs_target") is None,
            TDIV=_tdiv(p, form.exact_t), TM=_tm(p, "retrace", form.layout.lookback), WHOLE=form.whole,
        )  # fmt: skip
        return _scan_plan(fused.retrace_kernel, p.num_envs, p.device, constexprs, form.layout, cached=cached)

    _run(
        _cached_plan(p.plans, ("retrace",), build),
        (probs, _dummy(t, "next_action_probs_target", probs), t["action_probs_behavior"], t["q_values"],
        t["next_q_values_all"], t["actions"], t["rewards"], t["terminateds"], _dummy(t, "truncateds", probs),
        qt, adv, p.num_envs, p.seq_len, *hp(gamma), *hp(lambda_), *hp(c_bar), *hp(rho_bar)),
    )  # fmt: skip
    return qt, adv


def returns(p, gamma: float, lambda_: float, adv: bool = False):
    """Discounted or TD(lambda) returns; with ``adv``, ``(returns, returns - values)`` from the same
    launch (the advantages, rounded as the separate subtraction would round them)."""
    t = p.tensors
    r = t["rewards"]
    out = p.new_output()
    advantages = p.new_output() if adv else out

    def build(cached: bool) -> _Plan:
        kind = "returns" if t.get("next_values") is None else "returns_nv"
        form = _form(kind, p)
        constexprs = dict(
            HAS_NV=t.get("next_values") is not None, HAS_TRUNC=t.get("truncateds") is not None,
            HAS_BOOT=t.get("bootstrap_values") is not None, ADV=adv, ACC=_acc(p.dtype), GROUPED=form.group,
            EXACT_T=form.exact_t, TDIV=_tdiv(p, form.exact_t), TM=_tm(p, kind, form.layout.lookback),
            WHOLE=form.whole,
        )  # fmt: skip
        return _scan_plan(fused.returns_kernel, p.num_envs, p.device, constexprs, form.layout, cached=cached)

    _run(
        _cached_plan(p.plans, ("returns", adv), build),
        (r, _dummy(t, "next_values", r), t["terminateds"], _dummy(t, "truncateds", r),
        _dummy(t, "bootstrap_values", r), _dummy(t, "values", r), out, advantages, p.num_envs, p.seq_len, *hp(gamma),
        *hp(lambda_)),
    )  # fmt: skip
    return (out, advantages) if adv else out


def forward_trace(p, scale: float, starts_at: bool) -> torch.Tensor:
    t = p.tensors
    x = t["inputs"]
    out = p.new_output()

    def build(cached: bool) -> _Plan:
        layout = _form("forward", p).layout
        constexprs = dict(
            STARTS_AT=starts_at, HAS_SEED=t.get("seed_values") is not None, ACC=_acc(p.dtype),
            TDIV=_tdiv(p), TM=_tm(p, "forward", layout.lookback),
        )  # fmt: skip
        return _scan_plan(fused.forward_trace_kernel, p.num_envs, p.device, constexprs, layout, cached=cached)

    _run(
        _cached_plan(p.plans, ("forward_trace", starts_at), build),
        (x, t["dones"], _dummy(t, "seed_values", x), out, p.num_envs, p.seq_len, *hp(scale)),
    )
    return out


# Plans of the raw scan (autograd's backward), by its own signature; bounded like the validation cache.
_SCAN_PLANS: dict = {}


def linear_scan(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool) -> torch.Tensor:
    """Raw (non-differentiable) scan for :class:`rl_triton.scan.LinearScan` on the kernel path."""
    n, t_len = b.shape
    x = torch.empty_like(b)
    if b.numel() == 0:
        return x
    inputs = (a, b) if init is None else (a, b, init)
    key = (b.shape, b.dtype, b.device, reverse, *((u.dtype, u.is_contiguous(), u.data_ptr() % 16 == 0) for u in inputs))

    def build(cached: bool) -> _Plan:
        tiles = _tiles(n, t_len)
        constexprs = dict(REVERSE=reverse, HAS_INIT=init is not None, ACC=_acc(b.dtype), BN=tiles.bn, BT=tiles.bt)
        launches = [((_cdiv(n, tiles.bn), 1), constexprs, tiles.warps)]
        return _Plan(core.linear_scan_kernel, b.device, launches, (), cached)

    if len(_SCAN_PLANS) >= 512:
        _SCAN_PLANS.clear()
    plan = _cached_plan(_SCAN_PLANS, key, build)
    _launch(plan, 0, (a, b, b if init is None else init, x, n, t_len))
    return x


class _PolicyModule(types.ModuleType):
    """This module's class: setting any of its attributes (the tuning knobs above, which the tests
    and benchmarks/tile_sweep.py change) drops every cached plan, which were computed under the old
    values."""

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        _drop_plans()


def _drop_plans() -> None:
    from .. import _validation

    _validation.clear_cache()
    _SCAN_PLANS.clear()


sys.modules[__name__].__class__ = _PolicyModule
