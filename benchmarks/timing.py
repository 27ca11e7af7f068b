"""Timers. On CUDA: ``triton.testing.do_bench`` (median, L2 flushed between runs) of a CUDA-graph
replay for kernel time (GPU time without the host's launch time),
CUDA events around one whole call (median after warm-up) for full-call time, and a
device-to-device ``copy_`` as the bandwidth ceiling. On the CPU everything is the ``time.perf_counter`` median
of whole calls after warm-up: the PyTorch path as a user calls it (under the Triton interpreter, the numbers mean
nothing)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Budget:
    """How long to measure: do_bench's warm-up/rep (ms) and the full-call loop's limits."""

    bench_warmup_ms: float
    bench_rep_ms: float
    call_warmup: int
    call_reps: int
    call_budget_s: float  # stop the full-call loop after this long (but run at least MIN_REPS)


QUICK = Budget(bench_warmup_ms=5, bench_rep_ms=20, call_warmup=3, call_reps=30, call_budget_s=0.25)
FULL = Budget(bench_warmup_ms=25, bench_rep_ms=100, call_warmup=10, call_reps=100, call_budget_s=1.5)
CPU = Budget(bench_warmup_ms=0, bench_rep_ms=0, call_warmup=2, call_reps=15, call_budget_s=0.5)
MIN_REPS = 3


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def call_once_s(fn: Callable[[], object], device: torch.device) -> float:
    """Wall time of one synchronised call, in seconds (used to size the loops)."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def full_call_us(
    call: Callable[[object], object],
    device: torch.device,
    budget: Budget,
    setup: Callable[[], object] | None = None,
) -> float:
    """Median time of one whole call ``call(setup())`` (``setup`` runs outside the timed region),
    after warm-up. CUDA events on the GPU, ``perf_counter`` on the CPU."""
    setup = setup or (lambda: None)
    one = call_once_s(lambda: call(setup()), device)
    warmup = max(1, min(budget.call_warmup, int(0.2 * budget.call_budget_s / max(one, 1e-9))))
    reps = max(MIN_REPS, min(budget.call_reps, int(budget.call_budget_s / max(one, 1e-9))))
    for _ in range(warmup):
        call(setup())
    sync(device)
    times = []
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(reps):
            arg = setup()
            start.record()
            call(arg)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
    else:
        for _ in range(reps):
            arg = setup()
            t0 = time.perf_counter()
            call(arg)
            times.append((time.perf_counter() - t0) * 1e6)
    return _median(times)


def _graph_of(fn: Callable[[], object], device: torch.device):
    """``fn`` captured in a CUDA graph (after one warm-up call on a side stream), or None when it
    cannot be captured (a host sync, a CPU tensor, ...)."""
    try:
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            fn()
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        sync(device)
        return graph
    except Exception:  # noqa: BLE001 - any capture failure means "time it without a graph"
        sync(device)
        return None


def kernel_us(fn: Callable[[], object], device: torch.device, budget: Budget, graph: bool = False) -> float:
    """``triton.testing.do_bench`` median in µs on CUDA (L2 flushed before each run); the
    perf_counter median of a few calls on the CPU.

    With ``graph``, ``fn`` is captured once in a CUDA graph and do_bench times the graph's replay:
    the GPU time of everything ``fn`` launches, without the host time of issuing it (the replay
    is queued behind do_bench's L2 flush, so the GPU never waits for the host). Functions that
    cannot be captured are timed directly."""
    if device.type == "cuda":
        import triton.testing

        g = _graph_of(fn, device) if graph else None
        target = fn if g is None else g.replay
        ms = triton.testing.do_bench(
            target, warmup=budget.bench_warmup_ms, rep=budget.bench_rep_ms, return_mode="median"
        )
        return float(ms) * 1e3
    return full_call_us(lambda _: fn(), device, budget)


def copy_gbps(nbytes: int, device: torch.device, budget: Budget) -> float:
    """GB/s (bytes read + written per second) of a device-to-device copy that moves ``nbytes`` in
    total (``nbytes / 2`` read, ``nbytes / 2`` written), timed like a kernel: the faster of
    ``copy_`` (a memcpy node in the graph) and an elementwise kernel writing ``src * 1``. On the H200
    the memcpy alone ran at either ~4.2 or ~2.6 TB/s for the same size in the same process, which would
    make fractions measured against the slow one look ~1.5x better than they are; the elementwise copy is
    the steady one."""
    numel = max(1, nbytes // 8)  # float32 elements: 4 bytes read + 4 written each
    src = torch.empty(numel, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    us = min(
        kernel_us(lambda: dst.copy_(src), device, budget, graph=True),
        kernel_us(lambda: torch.mul(src, 1.0, out=dst), device, budget, graph=True),
    )
    return 8 * numel / (us * 1e-6) / 1e9
