"""Launchers: choose tile sizes, split hyper-parameters, allocate outputs and start the kernels."""

from __future__ import annotations

import contextlib
import functools
import warnings

import numpy as np
import torch
import triton
import triton.language as tl

from .. import _config
from . import core, fused

# Tile shapes: BN envs per program, BT time steps per chunk. Size classes of T only (two), so a
# new rollout length recompiles at most once. Chosen from a sweep of the GAE kernel on an H200
# (BN in 2..16, BT in 32..256, 1..8 warps; NOTES.md, "Measurements"): many small programs win,
# because each program walks its rows serially and the GPU needs many of them in flight.
#   4096x2048: BN=2 BT=256 4 warps 52.8 us (best seen 48.4 at 1 warp; BN=16 BT=128 was 125 us)
#   16384x256: BN=2 BT=64  4 warps 41.5 us (best seen 39.6)
#   64x512:    BN=2 BT=64  4 warps 26.5 us (best seen 23.7)
# Long rows with few envs need parallelism across time blocks, which this layout leaves room for.
_MAX_BN = 2
_NUM_WARPS = 4


def _tiles(n: int, t: int) -> tuple[int, int]:
    return _MAX_BN, (64 if t <= 512 else 256)


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


def _on_device(device: torch.device):
    if device.type == "cuda" and device.index is not None and device.index != torch.cuda.current_device():
        return torch.cuda.device(device.index)
    return contextlib.nullcontext()


# ----------------------------------------------------------------------------------------------
# Launch fast path. ``kernel[grid](...)`` spends ~20 us of host time per call in Triton's Python
# dispatcher (argument binding, specialisation key, cache lookup), as long as the kernel itself
# at 64x512 (benchmarks/host_overhead.py on the H200). After the first launch of a given
# specialisation we keep Triton's compiled kernel and call its launcher directly. The cache key
# holds everything Triton specialises on for these kernels: the constexprs, the warps, the
# device, each tensor's dtype and 16-byte alignment (ints and floats are do_not_specialize).
# Anything unusual (launch hooks, the interpreter, an older Triton) takes the normal path.

_compiled: dict = {}


def _fast_path_knobs():
    """Triton's ``knobs`` module when the fast path is supported by this Triton, else None."""
    try:
        from triton import knobs
        from triton.compiler.compiler import CompiledKernel
    except ImportError:
        return None
    return knobs if hasattr(CompiledKernel, "packed_metadata") or hasattr(CompiledKernel, "run") else None


_KNOBS = _fast_path_knobs()
_FAST = _KNOBS is not None


def _hooks_active(knobs) -> bool:
    """Triton 3.6 keeps launch hooks in (usually empty) HookChains; older versions use None."""
    for hook in (knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook):
        if hook is not None and getattr(hook, "calls", True):
            return True
    return False


def _launch(kernel, grid: tuple[int, int], device: torch.device, args: tuple, constexprs: dict) -> None:
    """Launches ``kernel`` on ``device`` (made current for the launch)."""
    with _on_device(device):
        if _config.INTERPRET or device.type != "cuda" or not _FAST:
            kernel[grid](*args, **constexprs, num_warps=_NUM_WARPS)
            return
        sig = tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else type(a) for a in args)
        key = (kernel, device.index, _NUM_WARPS, tuple(constexprs.items()), sig)
        entry = _compiled.get(key)
        if entry is None or _hooks_active(_KNOBS):
            ck = kernel[grid](*args, **constexprs, num_warps=_NUM_WARPS)
            if hasattr(ck, "result"):
                ck = ck.result()
            trailing = tuple(constexprs[name] for name in kernel.arg_names[len(args) :])
            _compiled[key] = (ck, trailing, _KNOBS.runtime.launch_enter_hook, _KNOBS.runtime.launch_exit_hook)
            return
        ck, trailing, enter, exit_ = entry
        stream = torch._C._cuda_getCurrentRawStream(device.index)
        ck.run(grid[0], grid[1], 1, stream, ck.function, ck.packed_metadata, None, enter, exit_, *args, *trailing)


# Multi-block scans (kernels/core.py): when the env blocks alone give too few programs for the
# GPU and rows are long, each row is split into time blocks of CPB chunks, scanned in two passes
# with a carry pass over the block aggregates in between. Size classes only: no recompilation.
_TARGET_PROGRAMS = 1024  # H200: 132 SMs, several resident programs each
_MIN_CHUNKS_PER_BLOCK = 4
_MIN_CHUNKS_FOR_SPLIT = 16  # rows shorter than this stay single-pass (three launches cost more)


def _time_blocks(env_programs: int, n_chunks: int) -> tuple[int, int]:
    """(number of time blocks, chunks per block) for one launch."""
    if env_programs * 2 >= _TARGET_PROGRAMS or n_chunks < _MIN_CHUNKS_FOR_SPLIT:
        return 1, n_chunks
    nk = max(1, min(triton.cdiv(_TARGET_PROGRAMS, env_programs), n_chunks // _MIN_CHUNKS_PER_BLOCK))
    cpb = triton.cdiv(n_chunks, nk)
    return triton.cdiv(n_chunks, cpb), cpb


def _scan_launch(kernel, n: int, t_len: int, device, args: tuple, constexprs: dict, init=None) -> None:
    """Launches a fused kernel single-pass or as a multi-block scan (PHASE 1, carry pass, PHASE 2)."""
    env_programs = triton.cdiv(n, constexprs["BN"])
    n_chunks = triton.cdiv(t_len, constexprs["BT"])
    nk, cpb = _time_blocks(env_programs, n_chunks)
    dummy = args[0]
    if nk == 1:
        _launch(kernel, (env_programs, 1), device, (*args, dummy, dummy, 1, n_chunks), {**constexprs, "PHASE": 0})
        return
    acc_dtype = torch.float64 if constexprs["ACC"] == tl.float64 else torch.float32
    agg_a = torch.empty((n, nk), dtype=acc_dtype, device=device)
    agg_b = torch.empty_like(agg_a)
    _launch(kernel, (env_programs, nk), device, (*args, agg_a, agg_b, nk, cpb), {**constexprs, "PHASE": 1})
    state = linear_scan(agg_a, agg_b, None if init is None else init.to(acc_dtype), False)
    _launch(kernel, (env_programs, nk), device, (*args, agg_a, state, nk, cpb), {**constexprs, "PHASE": 2})


def _dummy(t: dict, key: str, fallback: torch.Tensor) -> torch.Tensor:
    """Optional inputs that are absent are passed as some valid pointer the kernel never reads."""
    x = t.get(key)
    return fallback if x is None else x


def gae(p, gamma: float, lambda_: float, next_all: bool = False) -> torch.Tensor:
    t = p.tensors
    out = p.new_output()
    bn, bt = _tiles(p.num_envs, p.seq_len)
    r = t["rewards"]
    _scan_launch(
        fused.gae_kernel, p.num_envs, p.seq_len, p.device,
        (r, t["values"], t["terminateds"], _dummy(t, "truncateds", r), _dummy(t, "bootstrap_values", r),
        _dummy(t, "last_value", r), out, p.num_envs, p.seq_len, *hp(gamma), *hp(lambda_),),
        dict(HAS_TRUNC=t.get("truncateds") is not None, HAS_BOOT=t.get("bootstrap_values") is not None,
        HAS_LAST=t.get("last_value") is not None, NEXT_ALL=next_all, ACC=_acc(p.dtype), BN=bn, BT=bt),
    )  # fmt: skip
    return out


def vtrace(p, gamma: float, rho_bar: float, c_bar: float, next_all: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    t = p.tensors
    vs, adv = p.new_output(), p.new_output()
    bn, bt = _tiles(p.num_envs, p.seq_len)
    r = t["rewards"]
    _scan_launch(
        fused.vtrace_kernel, p.num_envs, p.seq_len, p.device,
        (t["log_pi_target"], t["log_pi_behavior"], t["values"], r, t["terminateds"], _dummy(t, "truncateds", r),
        _dummy(t, "bootstrap_values", r), _dummy(t, "last_value", r), vs, adv, p.num_envs, p.seq_len,
        *hp(gamma), *hp(rho_bar), *hp(c_bar),),
        dict(HAS_TRUNC=t.get("truncateds") is not None, HAS_BOOT=t.get("bootstrap_values") is not None,
        HAS_LAST=t.get("last_value") is not None, NEXT_ALL=next_all, ACC=_acc(p.dtype), BN=bn, BT=bt),
    )  # fmt: skip
    return vs, adv


def retrace(p, gamma: float, lambda_: float, c_bar: float, rho_bar: float) -> tuple[torch.Tensor, torch.Tensor]:
    t = p.tensors
    qt, adv = p.new_output(), p.new_output()
    bn, bt = _tiles(p.num_envs, p.seq_len)
    probs = t["action_probs_target"]
    _scan_launch(
        fused.retrace_kernel, p.num_envs, p.seq_len, p.device,
        (probs, _dummy(t, "next_action_probs_target", probs), t["action_probs_behavior"], t["q_values"],
        t["next_q_values_all"], t["actions"], t["rewards"], t["terminateds"], _dummy(t, "truncateds", probs),
        qt, adv, p.num_envs, p.seq_len, p.num_actions,
        *hp(gamma), *hp(lambda_), *hp(c_bar), *hp(rho_bar),),
        dict(HAS_TRUNC=t.get("truncateds") is not None, ACC=_acc(p.dtype), BN=bn, BT=bt),
    )  # fmt: skip
    return qt, adv


def returns(p, gamma: float, lambda_: float) -> torch.Tensor:
    t = p.tensors
    out = p.new_output()
    bn, bt = _tiles(p.num_envs, p.seq_len)
    r = t["rewards"]
    _scan_launch(
        fused.returns_kernel, p.num_envs, p.seq_len, p.device,
        (r, _dummy(t, "next_values", r), t["terminateds"], _dummy(t, "truncateds", r),
        _dummy(t, "bootstrap_values", r), out, p.num_envs, p.seq_len, *hp(gamma), *hp(lambda_),),
        dict(HAS_NV=t.get("next_values") is not None, HAS_TRUNC=t.get("truncateds") is not None,
        HAS_BOOT=t.get("bootstrap_values") is not None, ACC=_acc(p.dtype), BN=bn, BT=bt),
    )  # fmt: skip
    return out


def forward_trace(p, scale: float, starts_at: bool) -> torch.Tensor:
    t = p.tensors
    out = p.new_output()
    bn, bt = _tiles(p.num_envs, p.seq_len)
    x = t["inputs"]
    _scan_launch(
        fused.forward_trace_kernel, p.num_envs, p.seq_len, p.device,
        (x, t["dones"], _dummy(t, "seed_values", x), out, p.num_envs, p.seq_len, *hp(scale),),
        dict(STARTS_AT=starts_at, HAS_SEED=t.get("seed_values") is not None, ACC=_acc(p.dtype), BN=bn, BT=bt),
        init=t.get("seed_values"),
    )  # fmt: skip
    return out


def linear_scan(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool) -> torch.Tensor:
    """Raw (non-differentiable) scan for :class:`rl_triton.scan.LinearScan` on the kernel path."""
    n, t_len = b.shape
    x = torch.empty_like(b)
    if b.numel() == 0:
        return x
    bn, bt = _tiles(n, t_len)
    _launch(
        core.linear_scan_kernel, (triton.cdiv(n, bn), 1), b.device,
        (a, b, b if init is None else init, x, n, t_len),
        dict(REVERSE=reverse, HAS_INIT=init is not None, ACC=_acc(b.dtype), BN=bn, BT=bt),
    )  # fmt: skip
    return x
