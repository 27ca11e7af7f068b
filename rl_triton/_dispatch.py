"""The generic call path of the public functions (:func:`call`, driven by an algorithm's
:class:`rl_triton.ops.utils.Op`), backend choice, and the bridge between the fused kernels and autograd."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch

from . import _config
from ._discounts import TensorDiscount, fast_hyper, hyper, per_step
from ._validation import _CACHE, _UNKNOWN, Entry, Prepared, check_data, check_probabilities, prepare, signature
from .scan import linear_scan, torch_scan

if TYPE_CHECKING:
    from .ops.utils import Op

BACKENDS = ("auto", "torch", "triton")
_backend: contextvars.ContextVar[str] = contextvars.ContextVar("rl_triton_backend", default="auto")


@contextlib.contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Context manager choosing how calls inside it run.

    ``"auto"`` (the default): CUDA tensors run the Triton kernels; CPU tensors run the PyTorch
    path, or the kernels in Triton's interpreter when ``TRITON_INTERPRET=1`` was set before
    import. ``"torch"``: the PyTorch path on any device. ``"triton"``: the kernels (CPU tensors
    need ``TRITON_INTERPRET=1``).

    >>> import torch, rl_triton
    >>> with rl_triton.use_backend("torch"):
    ...     adv = rl_triton.compute_gae(torch.ones(4), torch.zeros(4), torch.zeros(4), gamma=0.9, lambda_=1.0)
    """
    if name not in BACKENDS:
        raise ValueError(f"use_backend: name must be one of {BACKENDS}, got {name!r}")
    token = _backend.set(name)
    try:
        yield
    finally:
        _backend.reset(token)


def current_backend() -> str:
    return _backend.get()


def use_kernels(device: torch.device, device_type: str | None = None) -> bool:
    """Whether a call on ``device`` runs the kernels (``device_type``: ``device.type`` when the caller
    has it at hand)."""
    if device_type is None:
        device_type = device.type
    if torch.compiler.is_compiling():
        return _traced_use_kernels(device_type)
    choice = _backend.get()
    if choice == "torch":
        return False
    if device_type == "cuda":
        return True
    if device_type == "cpu" and _config.INTERPRET:
        return True
    if choice == "triton":
        raise RuntimeError(
            f"rl_triton: backend 'triton' was requested for tensors on {device}; the kernels run on CUDA "
            "tensors, or on CPU tensors when TRITON_INTERPRET=1 is set before importing rl_triton"
        )
    return False


@torch.compiler.assume_constant_result
def _backend_when_compiled() -> str:
    return _backend.get()  # Dynamo cannot read a ContextVar: read once, a constant of the compiled code


def _traced_use_kernels(device_type: str) -> bool:
    """:func:`use_kernels` in code that torch.compile traces (the functions of :mod:`rl_triton.llm`; the others
    are opaque ops): always the PyTorch path, which Inductor compiles (the token-level launchers keep host-side
    state, flag buffers and a capture check, that Dynamo cannot trace). Backend "triton" on CPU tensors raises:
    Triton's interpreter cannot be traced either, and that backend asks for the kernels."""
    if device_type != "cuda" and _backend_when_compiled() == "triton":
        raise RuntimeError(
            "rl_triton: backend 'triton' cannot run CPU tensors under torch.compile (Triton's interpreter cannot "
            "be traced); use backend 'auto' or 'torch' there, which run the PyTorch path"
        )
    return False


_grad_enabled = torch.is_grad_enabled


def launchable(e: Entry | None, tensors: tuple, diff_at: tuple[int, ...]) -> bool:
    """Whether a call whose validation cache entry is ``e`` (None: a miss) can go straight to the launch:
    :func:`run` would launch the kernel on the entry's tensors as they are (the kernel path, no autograd
    to record, a ``direct`` entry) and no data checks are on (``RL_TRITON_CORRECTNESS_WARNINGS``).
    ``diff_at``: the positions in ``tensors`` of the differentiable inputs."""
    if e is None or not e.direct or _config.CORRECTNESS_WARNINGS:
        return False
    device_type = e.device_type
    if device_type != "cuda" and not (device_type == "cpu" and _config.INTERPRET):
        return False  # the PyTorch path, or use_kernels' error for backend "triton"
    if _backend.get() == "torch":
        return False
    if _grad_enabled():
        for i in diff_at:
            t = tensors[i]
            if t is not None and t.requires_grad:
                return False
    return True


TorchAlgo = Callable[..., tuple]


def _kernel_scan(a, b, init, reverse):
    return linear_scan(a, b, init, reverse, (_LAUNCH or _launcher()).linear_scan)


def _torch_scan(a, b, init, reverse):
    return linear_scan(a, b, init, reverse, torch_scan)


def run(
    p: Prepared,
    algo: TorchAlgo,
    scalars: dict,
    kernel: Callable[[], tuple],
    differentiable: tuple[str, ...],
    n_out: int,
) -> tuple[torch.Tensor, ...]:
    """Runs one validated call on the chosen backend and returns its outputs (2-D, or in the callers'
    shape for a ``shaped`` call: see :func:`rl_triton._validation.prepare`'s ``rows``)."""
    if p.empty:
        return tuple(p.new_output() for _ in range(n_out))
    kernels = use_kernels(p.device, p.device_type or None)
    grad = kernels and _needs_grad(p.tensors, differentiable)
    if p.time_major and (grad or not kernels):
        # the PyTorch forms (and autograd's backward) take contiguous rows; the kernel reads the
        # time-major ones in place (the same values)
        return run(p.contiguous(), algo, scalars, kernel, differentiable, n_out)
    if p.shaped and (grad or not kernels):
        # the PyTorch forms (and autograd's backward) need the (N, T) views
        shape, rows = p.like.shape, (p.num_envs, p.seq_len)

        def rows_kernel():
            return tuple(o.reshape(rows) for o in kernel())

        return tuple(o.reshape(shape) for o in run(p.as_rows(), algo, scalars, rows_kernel, differentiable, n_out))
    if not kernels:
        outs = algo(p.tensors, scalars, p.acc_dtype, _torch_scan)
        return tuple(o.to(p.dtype) for o in outs)
    if grad:
        tensors = p.tensors
        names = [n for n in differentiable if tensors.get(n) is not None]
        return _KernelWithGrad.apply(p, algo, scalars, kernel, names, *[tensors[n] for n in names])
    return kernel()


def _needs_grad(tensors: dict, differentiable: tuple[str, ...]) -> bool:
    """Whether autograd must record the call: grad mode on and a differentiable input requiring grad."""
    if not torch.is_grad_enabled():
        return False
    for n in differentiable:
        t = tensors.get(n)
        if t is not None and t.requires_grad:
            return True
    return False


class _KernelWithGrad(torch.autograd.Function):
    """Forward: the fused kernel. Backward: the PyTorch prologue/epilogue re-run under autograd,
    with the recurrence and its adjoint computed by the scan kernel."""

    @staticmethod
    def forward(ctx, p, algo, scalars, kernel, names, *tensors):
        ctx.save_for_backward(*tensors)
        ctx.meta = (p, algo, scalars, names)
        return kernel()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grads):
        p, algo, scalars, names = ctx.meta
        needs = ctx.needs_input_grad[5:]
        with torch.enable_grad():
            inputs = dict(p.tensors)
            leaves = []
            for name, x, need in zip(names, ctx.saved_tensors, needs, strict=True):
                x = x.detach().requires_grad_(need)
                inputs[name] = x
                if need:
                    leaves.append(x)
            outs = [o.to(p.dtype) for o in algo(inputs, scalars, p.acc_dtype, _kernel_scan)]
            pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None]
            found = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)
        found = iter(found)
        return (None,) * 5 + tuple(next(found) if need else None for need in needs)


# The public functions' call path. Each public function hands its tensors (in the validation cache key's order)
# and hyper-parameters to :func:`call`. A call without ``plan`` whose cache entry needs nothing but the launch
# (:func:`launchable`) and keeps it (under ``op.at``, filed by :func:`_kernel`) checks the hyper-parameters,
# allocates the outputs and launches: Prepared, the closures and the launchers' lookups are what a validated
# signature would spend on them every time (host time: docs/performance.md). Anything else takes
# :func:`_prepared`, with the key already built.


_LAUNCH = None


def _launcher():
    """:mod:`rl_triton.kernels.launch`, imported by the first kernel call (it imports Triton), then a global."""
    global _LAUNCH
    from .kernels import launch

    _LAUNCH = launch
    return launch


def call(op: Op, tensors: tuple, plan, hypers: tuple, rows=None):
    """Runs ``op`` on ``tensors`` (the key's order; ``rows``: prepare's) with ``hypers`` (``op.hypers``' order);
    returns its output, or its two outputs."""
    key = signature(op.fn, op.required, rows, tensors)
    if plan is None:
        e = _CACHE.get(key)
        if launchable(e, tensors, op.diff_at):
            kept = e.plans.get(op.at)
            if kept is not None:
                checked = hypers if op.plain(hypers) else _fast_hypers(op, hypers)
                if checked is not None:
                    like = tensors[e.like_at]
                    out = torch.empty_like(like)
                    # a kept launch was built by _kernel, which imported the launcher
                    if op.two:
                        second = torch.empty_like(like)
                        _LAUNCH.run(kept, op.args(*tensors, out, second, e.num_envs, e.seq_len, *checked))
                        return out, second
                    _LAUNCH.run(kept, op.args(*tensors, out, out, e.num_envs, e.seq_len, *checked))
                    return out
    return _prepared(op, key, tensors, plan, hypers, rows)


def _fast_hypers(op: Op, hypers: tuple) -> tuple | None:
    """The hyper-parameters checked as :func:`_prepared` checks them, or None for a tensor gamma/lambda_ (the
    fast path launches floats only)."""
    try:
        return tuple(fast_hyper(op.fn, name, x, hi) for name, x, hi in zip(op.hypers, hypers, op.limits, strict=True))
    except TensorDiscount:
        return None


def _prepared(op: Op, key, tensors: tuple, plan, hypers: tuple, rows):
    """The validated call: hyper-parameters, tensors (:func:`prepare`), per-step discounts, data checks, then
    :func:`run` on the chosen backend."""
    s = {name: hyper(op.fn, name, x, hi) for name, x, hi in zip(op.hypers, hypers, op.limits, strict=True)}
    s.update(op.consts)
    given: dict = {"step": {}, "flag": {}, "env": {}, "action": {}, "actions": {}}
    for name, role, x in zip(op.names, op.roles, tensors, strict=True):
        given[role][name] = x
    actions = next(iter(given["actions"].items()), None)
    if actions is not None and key not in _CACHE:
        key = _UNKNOWN  # the cache never keeps CPU actions (_validation.cacheable_actions): prepare decides
    p = prepare(
        op.fn, steps=given["step"], flags=given["flag"], per_env=given["env"], per_action=given["action"],
        actions=actions, required=op.required, rows=rows, key=key,
    )  # fmt: skip
    for name in op.discounts:
        if type(s[name]) is not float:
            per_step(p, s)  # a per-env or per-step gamma or lambda_
            break
    if op.data is not None:
        term, trunc, boot = op.data
        check_data(p, term=term, trunc=trunc, boot=boot)
    if op.probabilities is not None:
        check_probabilities(p, *op.probabilities)
    if op.rename is not None:
        p.tensors[op.rename[1]] = p.tensors.pop(op.rename[0])

    def kernel():
        return _kernel(op, p, s, plan)

    outs = run(p, op.reference, s, kernel, op.differentiable, 2 if op.two else 1)
    return (p.finish(outs[0]), p.finish(outs[1])) if op.two else p.finish(outs[0])


def _kernel(op: Op, p: Prepared, s: dict, plan) -> tuple:
    """Launches ``op``'s kernel for the validated call ``p`` (``s``: its hyper-parameters, a gamma/lambda_ tensor
    as its (N, T) view), filing the launch under ``op.at`` (extended for tensor discounts: launch.launch_key)."""
    launch = _LAUNCH or _launcher()
    t = p.tensors
    out = p.new_output()
    second = p.new_output() if op.two else out
    hypers = [s[name] for name in op.hypers]
    args = op.args(*[t.get(name) for name in op.kernel_names], out, second, p.num_envs, p.seq_len, *hypers)
    key = launch.launch_key(op.at, *[s[name] for name in op.discounts])
    launch.start(p, op.kind(t), op.kernel, key, lambda: op.constexprs(p, s, op.two), args, plan)
    return (out, second) if op.two else (out,)
