"""Launchers: turn a :class:`~.plans.Plan` into grids and constexprs, allocate outputs and scratch, and start
the kernels.

Everything a call launches apart from its tensors and float hyper-parameters (plan, grids, constexprs, and
after the first launch Triton's compiled kernel) depends only on the call signature that the validation
cache keys on, so it is computed once per signature into a :class:`_Launch` kept next to that cache entry
(``Prepared.plans``); later calls only build the argument tuple and launch. A plan passed explicitly
(``plan=``) is launched as given, and cached under the signature and the plan.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from .. import _config
from ..ops.utils import acc
from . import core, plans
from .plans import Form, Phase, Plan, Split

# The launch fast path: ``kernel[grid](...)`` spends most of a call's host time in Triton's dispatcher
# (docs/performance.md). A cached
# _Launch keeps the compiled kernel of its first launch and calls Triton's generated C launcher directly,
# which is valid because the call signature fixes everything Triton specialises on (constexprs, warps,
# device, dtypes, 16-byte alignment, the ints' 1 / multiple-of-16 classes; floats are do_not_specialize).
# Launch hooks, the interpreter, uncached signatures or an unrecognised Triton take the normal path.


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


def _direct(ck, kernel, grid: tuple, n_args: int, constexprs: dict):
    """A function ``(stream, args)`` launching compiled kernel ``ck`` on ``grid`` without Triton's
    dispatcher (hooks inactive: the caller checks)."""
    if hasattr(ck, "result"):  # some Triton versions return a future from kernel[grid](...)
        ck = ck.result()
    trailing = tuple(constexprs[name] for name in kernel.arg_names[n_args:])
    run, function, packed = ck.run, ck.function, ck.packed_metadata
    gx, gy = grid
    raw = getattr(run, "launch", None)
    if (
        _DIRECT
        and raw is not None
        and getattr(run, "global_scratch_size", 1) == 0
        and getattr(run, "profile_scratch_size", 1) == 0
    ):
        coop, pdl = run.launch_cooperative_grid, run.launch_pdl

        def go(stream, args):
            raw(gx, gy, 1, stream, function, coop, pdl, None, None, packed, None, None, None, *args, *trailing)

        return go

    def go(stream, args):
        run(gx, gy, 1, stream, function, packed, None, None, None, *args, *trailing)

    return go


class _Step(NamedTuple):
    """One kernel launch of a plan."""

    grid: tuple
    constexprs: dict
    warps: int


class _Single(NamedTuple):
    """Scratch of a single pass: none (a dummy pointer, three times, and these two ints)."""

    nk: int  # 1 time block
    cpb: int  # its chunks


class _Lookback(NamedTuple):
    """Scratch of a look-back: block and window aggregates and a flag buffer (core.lookback), or for blocks of
    ``bn`` time-major envs one buffer of tagged words (core.lookback_envs)."""

    rows: int  # env programs
    nk: int  # time blocks per row
    acc: torch.dtype
    epochs: bool
    bn: int


class _TwoPass(NamedTuple):
    """Scratch of two passes: the [N, NK] block aggregates."""

    n: int
    nk: int
    cpb: int
    acc: torch.dtype


class _Launch:
    """The launches of one plan on one call signature; ``scratch`` (:class:`_Single`, :class:`_Lookback`,
    :class:`_TwoPass`, or None for the raw scan) says which scratch arguments are appended to the kernel's."""

    __slots__ = ("kernel", "device", "index", "launches", "scratch", "single", "fast", "cached", "flags")

    def __init__(self, kernel, device: torch.device, launches: list, scratch: tuple, cached: bool):
        self.kernel, self.device, self.launches, self.scratch = kernel, device, launches, scratch
        self.index = device.index  # read once, not per launch (host time: docs/performance.md)
        self.single = scratch if isinstance(scratch, _Single) else None  # run's fast branch
        self.cached = cached  # reused by later calls: worth keeping the compiled kernels
        self.fast = [None] * len(launches)
        self.flags = {}  # look-back flag buffers by stream (_lookback_flags)


# Register caps are Triton's `maxnreg` option, which its AMD backend rejects.
_CAPS = torch.version.hip is None


def _cap_option(maxnreg: int | None) -> dict:
    return {"maxnreg": maxnreg} if maxnreg and _CAPS else {}


# The plan constexprs each kernel takes (those not among its parameters are left out).
_PLAN_CONSTEXPRS = ("FORM", "EXACT_T", "TDIV", "TM", "WHOLE", "PIECES", "SHIFT", "PI_TILE")


def check_plan(plan: Plan, kind: str, n: int, t: int, dtype: torch.dtype, time_major: bool) -> None:
    """Raises ValueError for a plan the kernels of ``kind`` cannot run on ``n`` rows of ``t`` steps of ``dtype``."""

    def bad(why: str):
        raise ValueError(f"plan {plan} cannot launch {kind} on {n} rows of {t} steps: {why}")

    if plan.chunks_per_block < 1 or plan.window < 1 or plan.warps < 1:
        bad("chunks_per_block, window and warps must be positive")
    if time_major and (plan.env_div < 1 or n % plan.env_div):
        bad(f"env_div={plan.env_div} does not divide the {n} envs")
    if time_major and plan.split is Split.LOOKBACK and plan.bn > 1:  # the look-back over blocks of envs
        if dtype == torch.float64:
            bad("the look-back over blocks of time-major envs publishes float32 aggregates: not float64")
        if kind == "returns_nv" and plan.warps == 8:
            # the window's loads take word 2 * (tid % 16) | tid // 2, not 2 * (tid % 16): a misaligned-address fault
            bad("Triton 3.6 miscompiles the look-back of these programs in 8 warps (docs/performance.md)")

    if plan.bn < 1 or plan.bt < 4 or plan.bt & (plan.bt - 1) or plan.bn & (plan.bn - 1):
        bad("bn must be a power of two and bt a power of two >= 4")
    if kind == "forward" and plan.form is not Form.PLAIN:
        bad("the forward scans take plain tiles")
    if plan.form is Form.ENV_GROUPS and plan.bt > plans.ENV_GROUPS_MAX_BT:
        bad(f"env-major groups serve chunks of at most {plans.ENV_GROUPS_MAX_BT} steps")
    if plan.form in (Form.GROUPS4, Form.GROUPS8) and plan.bt < plan.form.group:
        bad("a chunk holds at least one group")
    if plan.exact_t and (t != plan.bt or plan.split is not Split.SINGLE):
        bad("exact_t needs single-pass rows of exactly bt steps")
    if plan.whole and t % plan.bt:
        bad("whole needs rows of whole chunks")
    if plan.shift and not (plan.exact_t and plan.form is Form.ENV_GROUPS):
        bad("shift needs exact env-major rows")
    if plan.late and plan.split is Split.LOOKBACK:
        bad("late needs a single pass or two passes (look-back blocks publish their aggregate)")
    if plan.split is Split.LOOKBACK and plan.bn != 1 and not time_major:
        bad("the look-back takes one env per program on env-major rows")
    if plan.row_div > 1 and t % plan.row_div:
        bad(f"T is not a multiple of row_div={plan.row_div}")
    n_chunks = plans.cdiv(t, plan.bt)
    if plan.split is Split.LOOKBACK and (plan.window & (plan.window - 1) or plan.window**2 < n_chunks):
        bad(f"the look-back window must be a power of two whose square covers the row's {n_chunks} blocks")
    if plan.split is Split.TWO_PASS and plans.cdiv(n_chunks, plan.chunks_per_block) > plans.MAX_BLOCKS:
        bad(f"two passes fold at most {plans.MAX_BLOCKS} blocks per row")
    if plan.split is Split.TWO_PASS and plan.maxnreg:
        bad("two passes take no register cap (maxnreg caps single-pass and look-back launches)")


def _build(kernel, plan: Plan, p, constexprs: dict, cached: bool) -> _Launch:
    """The launches of ``plan`` for call ``p`` (``constexprs``: the kernel's own flags): single pass, the
    look-back (with or without epochs) or two passes (aggregates, then the rescan)."""
    n, t = p.num_envs, p.seq_len
    env_div = plan.env_div if p.time_major else 0
    given = dict(
        FORM=int(plan.form), EXACT_T=plan.exact_t, TDIV=plan.row_div, TM=env_div, WHOLE=plan.whole,
        PIECES=plan.pieces, SHIFT=plan.shift, PI_TILE=plan.pi_tile, LATE=plan.late,
    )  # fmt: skip
    names = kernel.arg_names
    # the kernel's own flags win (Retrace's PI_TILE is off where next-step probabilities are given)
    constexprs = {**{k: v for k, v in given.items() if k in names}, **constexprs, "BN": plan.bn, "BT": plan.bt}
    env_programs = plans.cdiv(n, plan.bn)
    n_chunks = plans.cdiv(t, plan.bt)
    if plan.split is Split.SINGLE:
        extra = {"PHASE": int(Phase.SINGLE), "ONE": n_chunks == 1, "NKP": 1, **_cap_option(plan.maxnreg)}
        launch = _Step((env_programs, 1), {**constexprs, **extra}, plan.warps)
        return _Launch(kernel, p.device, [launch], _Single(1, n_chunks), cached)
    acc = torch.float64 if p.dtype == torch.float64 else torch.float32
    if plan.split is Split.LOOKBACK:
        phase = Phase.LOOKBACK_EPOCHS if plan.epochs else Phase.LOOKBACK
        extra = {"PHASE": int(phase), "ONE": True, "NKP": plan.window, **_cap_option(plan.maxnreg)}
        launch = _Step((env_programs * n_chunks, 1), {**constexprs, **extra}, plan.warps)
        scratch = _Lookback(env_programs, n_chunks, acc, plan.epochs, plan.bn)
        return _Launch(kernel, p.device, [launch], scratch, cached)
    cpb = plan.chunks_per_block
    nk = plans.cdiv(n_chunks, cpb)
    launches = [
        _Step(
            (env_programs, nk), {**constexprs, "PHASE": int(phase), "ONE": cpb == 1, "NKP": plans.pow2(nk)}, plan.warps
        )
        for phase in (Phase.AGGREGATES, Phase.RESCAN)
    ]
    return _Launch(kernel, p.device, launches, _TwoPass(n, nk, cpb, acc), cached)


def start(p, kind: str, kernel, key: tuple, constexprs, args: tuple, plan: Plan | None) -> None:
    """Launches ``kernel`` for call ``p`` under ``plan``, or the chosen plan of the call's signature (cached
    in ``p.plans`` under ``key``; ``constexprs()``: the kernel's own flags)."""
    if plan is not None:
        key = (*key, plan)
    launch = p.plans.get(key) if p.plans is not None else None
    if launch is None:
        if plan is None:
            n, t = p.num_envs, p.seq_len
            plan = plans.choose(kind, n, t, p.dtype, time_major=p.time_major, num_actions=p.num_actions or 0)
        else:
            check_plan(plan, kind, p.num_envs, p.seq_len, p.dtype, p.time_major)
        launch = _build(kernel, plan, p, constexprs(), p.plans is not None)
        if p.plans is not None:
            p.plans[key] = launch
    run(launch, args)


def _scratch(launch: _Launch, args: tuple) -> tuple:
    """Per launch, the scratch arguments appended to ``args`` (multi-block aggregates and flags)."""
    split = launch.scratch
    if isinstance(split, _Single):
        dummy = args[0]
        return ((dummy, dummy, dummy, *split),)
    device = args[0].device
    if isinstance(split, _Lookback):
        # [2, N, NK] block and window aggregates and a flag buffer; time-major blocks keep tagged words there
        n, nk, w = split.rows, split.nk, split.bn
        size = core.flag_buffer_size(n, nk, split.epochs) if w == 1 else core.tm_flag_buffer_size(n, nk, w)
        flags = _lookback_flags(launch, device, size) if split.epochs else _zero_flags(device, size)
        if w > 1:
            return ((flags, flags, flags, nk, 1),)
        agg_a = torch.empty((2, n, nk), dtype=split.acc, device=device)
        return ((agg_a, torch.empty_like(agg_a), flags, nk, 1),)
    agg_a = torch.empty((split.n, split.nk), dtype=split.acc, device=device)
    extra = (agg_a, torch.empty_like(agg_a), agg_a, split.nk, split.cpb)
    return (extra, extra)


# The look-back's flag buffers. With epochs (LOOKBACK_EPOCHS) each row's flags are tagged with an epoch that the kernel
# reads and advances, so flags left by earlier calls read as unpublished and a buffer is zeroed once, when
# allocated, not per call. Epochs are per row, so a buffer serves one layout: each cached launch keeps its own,
# one per stream (calls on two streams may overlap). A call captured in a CUDA graph takes its own slice of a
# zeroed arena and keeps it for the life of the process (replays of different graphs may run concurrently);
# the arena is allocated, zeroed and waited for by a call that is not being captured. A capture that finds no
# arena, or too little left, and uncached calls zero fresh flags (one fill kernel more per call).
_ARENA_SIZE = 1 << 18  # int32 elements (1 MiB)
_ARENAS: dict = {}  # device index -> [zeroed int32 tensor, elements handed out]
_LEASED: list = []  # every arena that handed out a slice to a graph: graphs outlive any reference of ours


def _lookback_flags(launch: _Launch, device: torch.device, size: int) -> torch.Tensor:
    """An int32 flag buffer of ``size`` elements for a look-back launch on ``device``'s current stream."""
    stream = 0
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        if torch.cuda.is_current_stream_capturing():
            return _lease(device, index, size)
        stream = torch._C._cuda_getCurrentRawStream(index)
        arena = _ARENAS.get(index)
        if arena is None or arena[0].numel() - arena[1] < size:
            _ARENAS[index] = [_zeroed(device, max(_ARENA_SIZE, 2 * size)), 0]
    if not launch.cached:
        return _zero_flags(device, size)
    buf = launch.flags.get(stream)
    if buf is None:
        buf = launch.flags[stream] = _zero_flags(device, size)
    return buf


def _zero_flags(device: torch.device, size: int) -> torch.Tensor:
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


def run(launch: _Launch, args: tuple) -> None:
    """Starts every launch of ``launch`` with the kernel arguments ``args`` (scratch appended)."""
    single = launch.single
    if single is not None:  # _scratch's single-pass arguments, without its dispatch
        dummy = args[0]
        _launch(launch, 0, (*args, dummy, dummy, dummy, *single))
        return
    for i, extra in enumerate(_scratch(launch, args)):
        _launch(launch, i, (*args, *extra))


_RUNTIME = _KNOBS.runtime if _FAST else None
_get_device = getattr(torch._C, "_cuda_getDevice", None)
_get_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _launch(launch: _Launch, i: int, args: tuple) -> None:
    go = launch.fast[i]
    if go is not None:
        # _hooks_active, inline (this runs on every launch)
        enter, leave = _RUNTIME.launch_enter_hook, _RUNTIME.launch_exit_hook
        if (enter is None or not getattr(enter, "calls", True)) and (
            leave is None or not getattr(leave, "calls", True)
        ):
            current = _get_device()
            index = launch.index
            if index is None or index == current:
                go(_get_stream(current), args)
            else:
                with torch.cuda.device(index):
                    go(_get_stream(index), args)
            return
    grid, constexprs, warps = launch.launches[i]
    device = launch.device
    with _on_device(device):
        ck = launch.kernel[grid](*args, **constexprs, num_warps=warps)
    if launch.cached and _FAST and not _config.INTERPRET and device.type == "cuda" and not _hooks_active(_KNOBS):
        launch.fast[i] = _direct(ck, launch.kernel, grid, len(args), constexprs)
        COMPILED[(launch.kernel, warps, tuple(constexprs.items()))] = ck


# Every compiled kernel the fast path keeps, by (kernel, warps, constexprs): the tuning tool's register report.
COMPILED: dict = {}


def _int_class(x: int) -> tuple:
    """What Triton specialises an int argument on (1, multiples of 16, 64-bit)."""
    return x == 1, x % 16 == 0, not -(2**31) <= x < 2**31


def _disc_key(x) -> tuple | None:
    """What a tensor gamma/lambda_ adds to a launch's compiled signature (dtype, 16-byte alignment, the
    strides' int classes), so that its cached launch is only reused where Triton would reuse the kernel;
    None for a float."""
    if not isinstance(x, torch.Tensor):
        return None
    s_n, s_t = x.stride()
    return x.dtype, x.data_ptr() % 16 == 0, _int_class(s_n), _int_class(s_t)


def launch_key(key: tuple, *discounts) -> tuple:
    """The launch key of a call: ``key`` for float discounts (the key the fast paths look up), else ``key``
    extended by each discount's :func:`_disc_key`. A float and a tensor call of one signature share a cache
    entry, so the float key must never hold a tensor kernel."""
    if all(type(x) is float or not isinstance(x, torch.Tensor) for x in discounts):
        return key
    return (*key, *(_disc_key(x) for x in discounts))


# Launches of the raw scan (autograd's backward), by its own signature; bounded like the validation cache.
_SCAN_LAUNCHES: dict = {}


def linear_scan(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool) -> torch.Tensor:
    """Raw (non-differentiable) scan for :class:`rl_triton.scan.LinearScan` on the kernel path."""
    n, t_len = b.shape
    x = torch.empty_like(b)
    if b.numel() == 0:
        return x
    inputs = (a, b) if init is None else (a, b, init)
    key = (b.shape, b.dtype, b.device, reverse, *((u.dtype, u.is_contiguous(), u.data_ptr() % 16 == 0) for u in inputs))
    launch = _SCAN_LAUNCHES.get(key)
    if launch is None:
        tile = plans.tile(n, t_len)
        constexprs = dict(REVERSE=reverse, HAS_INIT=init is not None, ACC=acc(b.dtype), BN=tile.bn, BT=tile.bt)
        launch = _Launch(
            core.linear_scan_kernel, b.device, [_Step((plans.cdiv(n, tile.bn), 1), constexprs, tile.warps)], None, True
        )
        if len(_SCAN_LAUNCHES) >= 512:
            _SCAN_LAUNCHES.clear()
        _SCAN_LAUNCHES[key] = launch
    _launch(launch, 0, (a, b, b if init is None else init, x, n, t_len))
    return x
