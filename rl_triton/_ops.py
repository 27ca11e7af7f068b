"""``torch.library`` custom ops, so that ``torch.compile(fullgraph=True)`` of code calling the
public functions compiles without graph breaks.

Eager calls never come here: each public function runs its own validation and kernels directly
(the fastest path). While Dynamo traces (``torch.compiler.is_compiling()``), the public function
instead emits one opaque op, ``rl_triton::call`` (:func:`emit`), carrying the function name, its
tensor arguments, its float hyper-parameters and its string options; at run time the op calls the
eager function. ``gamma`` and ``lambda_``, which may be floats or tensors (per-env or per-step), have a
float slot and a tensor slot each: a tensor goes in the tensor slot (never differentiated), a number in the
float slot. The check is the first statement of each public function, not a wrapper around it:
a wrapper's ``*args, **kwargs`` would cost every eager call host time (docs/performance.md).

Gradients go through a second opaque op, ``rl_triton::call_backward``, which re-runs
the eager function under autograd (the same path eager backward uses), so AOTAutograd never
traces our Python.
"""

import inspect
import threading
from collections.abc import Callable, Sequence
from typing import Optional

import torch

# name -> (eager function, tensor argument names, float argument names, str argument names,
#          argument whose per-step shape and dtype the outputs take, number of outputs,
#          names of the float-or-tensor arguments: gamma, lambda_; their tensor slots follow the tensors')
_REGISTRY: dict = {}
# The op's fixed slots (custom-op autograd tracks top-level tensor arguments only, so tensors cannot go in a list):
# compute_retrace uses the most tensor slots, 11 (9 tensors, and gamma and lambda_), and 4 floats. Room to spare,
# so that a new function needs no edit here; one over the limits fails at registration (:func:`compilable`).
_MAX_TENSORS = 16
_MAX_FLOATS = 8
_SIGNATURES: dict = {}
# the public functions' first statement: ``if is_compiling() and tracing(): return emit(...)`` (bound once: an
# attribute lookup less per call; Dynamo folds it to True by identity all the same)
is_compiling = torch.compiler.is_compiling


class _Local(threading.local):
    eager = 0  # op implementations (_eager) running a public function in this thread


_LOCAL = _Local()


def tracing() -> bool:
    """Whether a public function, torch.compile compiling, emits the op: not when the op's own implementation
    calls it (:func:`_eager`; is_compiling() holds for a whole compile session, in every thread)."""
    return not _LOCAL.eager


def _argument_kinds(sig: inspect.Signature) -> tuple[tuple, tuple, tuple, tuple]:
    """(tensor, float, str, float-or-tensor) parameter names of a public function, from its annotations
    (strings under ``from __future__ import annotations``). A float-or-tensor one (``float | torch.Tensor``)
    is among the floats too."""
    kinds: dict[str, list] = {"tensor": [], "float": [], "str": [], "plan": [], "either": []}
    for name, param in sig.parameters.items():
        ann = param.annotation if isinstance(param.annotation, str) else getattr(param.annotation, "__name__", "")
        kind = "tensor" if "Tensor" in ann else "float" if ann == "float" else "str" if ann == "str" else None
        if kind == "tensor" and ann.startswith("float"):
            kinds["either"].append(name)
            kind = "float"
        kind = "plan" if "Plan" in ann else kind  # launch plans stay eager: the op carries none
        if kind is None:
            raise TypeError(f"compilable: cannot map parameter {name!r} ({ann!r}) of a public function")
        kinds[kind].append(name)
    return tuple(kinds["tensor"]), tuple(kinds["float"]), tuple(kinds["str"]), tuple(kinds["either"])


def compilable(*, like: str, n_out: int) -> Callable:
    """Decorator registering a public function for ``rl_triton::call`` (it returns the function itself).
    ``like`` names the argument whose shape and dtype the ``n_out`` outputs have. The function starts with
    ``if is_compiling() and tracing(): return emit(name, <its arguments>)``."""

    def wrap(fn):
        name = fn.__name__
        sig = inspect.signature(fn)
        tensors, floats, strings, either = _argument_kinds(sig)
        if len(tensors) + len(either) > _MAX_TENSORS or len(floats) > _MAX_FLOATS or len(strings) > 1:
            raise TypeError(
                f"compilable: {name} takes {len(tensors) + len(either)} tensor slots (tensors, and one per "
                f"float-or-tensor argument), {len(floats)} floats and {len(strings)} strings; rl_triton::call "
                f"carries {_MAX_TENSORS}, {_MAX_FLOATS} and 1 (_ops._MAX_TENSORS, _MAX_FLOATS)"
            )
        _REGISTRY[name] = (fn, tensors, floats, strings, like, n_out, either)
        _SIGNATURES[name] = sig
        return fn

    return wrap


def emit(name: str, /, *args, **kwargs):
    """Public function ``name`` called with ``args`` and ``kwargs``, as the ``rl_triton::call`` op (traced)."""
    _, tensors, floats, strings, _, n_out, either = _REGISTRY[name]
    bound = _SIGNATURES[name].bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    if a.get("plan") is not None:
        raise TypeError(f"{name}: plan= is not supported under torch.compile")
    option = a[strings[0]] if strings else ""
    # a tensor gamma/lambda_ (0-d included: no .item() while tracing) in its tensor slot, detached (never
    # differentiated), 0.0 in its float slot
    slots = [a[k].detach() if isinstance(a[k], torch.Tensor) else None for k in either]
    values = [0.0 if isinstance(a[k], torch.Tensor) else float(a[k]) for k in floats]
    out = call(name, [a[k] for k in tensors] + slots, values, option)
    return out[0] if n_out == 1 else tuple(out)


def emit_ordered(name: str, tensors: Sequence, floats: dict):
    """:func:`emit` for a caller holding the tensor arguments in order and the float ones by name: no
    ``Signature.bind``, on which Dynamo breaks the graph once the traced code has mutated a dict."""
    _, _, f_names, _, _, n_out, either = _REGISTRY[name]
    slots = [floats[k].detach() if isinstance(floats[k], torch.Tensor) else None for k in either]
    values = [0.0 if isinstance(floats[k], torch.Tensor) else float(floats[k]) for k in f_names]
    out = call(name, list(tensors) + slots, values, "")
    return out[0] if n_out == 1 else tuple(out)


def _eager(name: str, tensors: Sequence, floats: Sequence[float], option: str):
    """Runs public function ``name``: ``tensors`` fill its tensor arguments, then the tensor slots of its
    float-or-tensor ones (None: the float slot's number)."""
    fn, t_names, f_names, s_names, _, n_out, either = _REGISTRY[name]
    n = len(t_names)
    kwargs = {**dict(zip(t_names, tensors[:n], strict=True)), **dict(zip(f_names, floats, strict=True))}
    for k, t in zip(either, tensors[n:], strict=True):
        if t is not None:
            kwargs[k] = t
    if s_names:
        kwargs[s_names[0]] = option
    _LOCAL.eager += 1  # the function runs eagerly even inside a compile session (tracing())
    try:
        out = fn(**kwargs)
    finally:
        _LOCAL.eager -= 1
    return [out] if n_out == 1 else list(out)


def _pad(tensors: Sequence) -> list:
    return list(tensors) + [None] * (_MAX_TENSORS - len(tensors))


def _pad_floats(floats: Sequence[float]) -> list:
    return list(floats) + [0.0] * (_MAX_FLOATS - len(floats))


def call(name: str, tensors: Sequence, floats: Sequence[float], option: str) -> list[torch.Tensor]:
    """Runs public function ``name`` through the ``rl_triton::call`` op (tensors and floats padded to its fixed
    slots)."""
    return _call(name, *_pad(tensors), *_pad_floats(floats), option)


# (name, t0 .. t15, f0 .. f7, option): the schema written out from the limits above
_SCHEMA = (
    "(str name, "
    + "".join(f"Tensor? t{i}, " for i in range(_MAX_TENSORS))
    + "".join(f"float f{i}, " for i in range(_MAX_FLOATS))
    + "str option) -> Tensor[]"
)


def _call_impl(name: str, *slots) -> list[torch.Tensor]:
    _, t_names, f_names, *_, either = _REGISTRY[name]
    tensors = slots[: len(t_names) + len(either)]
    floats = slots[_MAX_TENSORS : _MAX_TENSORS + len(f_names)]
    return [o.contiguous() for o in _eager(name, tensors, floats, slots[-1])]


_call = torch.library.custom_op("rl_triton::call", _call_impl, mutates_args=(), schema=_SCHEMA)


@_call.register_fake
def _(name, *slots):
    fn, t_names, _, _, like, n_out, _ = _REGISTRY[name]
    ref = slots[t_names.index(like)]
    # contiguous, as _call makes its outputs (empty_like alone would keep the strides of a transposed input)
    return [torch.empty_like(ref, memory_format=torch.contiguous_format) for _ in range(n_out)]


def _autograd_dispatch():
    """A custom op's implementation runs below the autograd dispatch keys, so autograd records
    nothing there even under ``enable_grad``. The backward op re-runs the eager function under
    autograd, so it puts those keys back for its own duration."""
    keys = torch._C.DispatchKey
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for name in ("AutogradFunctionality", "AutogradOther", "AutogradNestedTensor", "ADInplaceOrView", "AutogradCPU",
                 "AutogradCUDA"):  # fmt: skip
        if hasattr(keys, name):
            exclude = exclude.remove(getattr(keys, name))
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


@torch.library.custom_op("rl_triton::call_backward", mutates_args=())
def call_backward(
    name: str,
    tensors: Sequence[Optional[torch.Tensor]],  # noqa: UP045
    floats: Sequence[float],
    option: str,
    grads: Sequence[Optional[torch.Tensor]],  # noqa: UP045
    needs: Sequence[bool],
) -> list[torch.Tensor]:
    with _autograd_dispatch(), torch.enable_grad():
        leaves = [t.detach().requires_grad_(True) if need else t for t, need in zip(tensors, needs, strict=True)]
        outs = _eager(name, leaves, floats, option)
        pairs = [(o, g) for o, g in zip(outs, grads, strict=True) if g is not None and o.requires_grad]
        wanted = [x for x, need in zip(leaves, needs, strict=True) if need]
        found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
    return [torch.zeros_like(x) if g is None else g for x, g in zip(wanted, found, strict=True)]


@call_backward.register_fake
def _(name, tensors, floats, option, grads, needs):
    return [torch.empty_like(t) for t, need in zip(tensors, needs, strict=True) if need]


def _setup_context(ctx, inputs, output):
    name, *rest = inputs
    _, t_names, f_names, *_, either = _REGISTRY[name]
    n = len(t_names) + len(either)  # the tensor slots of gamma/lambda_ too (detached: nothing to differentiate)
    tensors = rest[:n]
    floats = rest[_MAX_TENSORS : _MAX_TENSORS + len(f_names)]
    option = rest[-1]
    ctx.name, ctx.floats, ctx.option, ctx.n = name, floats, option, n
    ctx.present = [t is not None for t in tensors]
    ctx.needs = [t is not None and t.requires_grad for t in tensors]
    ctx.save_for_backward(*[t for t in tensors if t is not None])


def _backward(ctx, grads):
    saved = iter(ctx.saved_tensors)
    tensors = [next(saved) if present else None for present in ctx.present]
    none = (None,) * (_MAX_TENSORS - ctx.n)
    if not any(ctx.needs):
        return (None, *([None] * ctx.n), *none, *([None] * (_MAX_FLOATS + 1)))
    found = iter(call_backward(ctx.name, tensors, ctx.floats, ctx.option, list(grads), ctx.needs))
    return (None, *[next(found) if need else None for need in ctx.needs], *none, *([None] * (_MAX_FLOATS + 1)))


_call.register_autograd(_backward, setup_context=_setup_context)
