"""Layout helpers, class decorators and the missing-entry error of the TorchRL-facing modules.

* :func:`to_rows` / :func:`from_rows` bring a ``[..., T, ...]`` tensor to the ``(N, T)`` layout of
  :mod:`rl_triton.functional` (time last, every other dim flattened into N) and back. Moving the time
  dim is skipped when it is already last, and ``reshape`` returns a view whenever the strides allow
  it (always for time-last tensors and for a trailing singleton feature dim such as ``[*B, T, 1]``).
  A negative ``dim`` counts from the end of each tensor, as TorchRL's functionals count it (an
  estimator called on a tensordict with ``batch_size []`` gets time dim -1).
* :func:`expose_inherited_keys` / :func:`copy_signature`: class and ``__init__`` decorators that keep
  TorchRL's ``set_keys`` and signatures working on the subclasses.
* :class:`MissingEntryError` / :func:`missing_entry`: the error for an absent tensordict entry.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Sequence

import torch
from torch.compiler import is_compiling

from .._discounts import values_in_unit

# --------------------------------------------------------------------------------------------
# layout


def axis(dim: int, ndim: int) -> int:
    """``dim`` as a non-negative dim of a tensor with ``ndim`` dims (negative: from the end)."""
    if not -ndim <= dim < ndim:
        raise IndexError(f"time dim {dim} is out of range for a tensor of {ndim} dims")
    return dim + ndim if dim < 0 else dim


def to_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` with dim ``dim`` moved last and the others flattened: ``(N, T)``. The common
    ``[*B, T, 1]`` layout only drops its trailing singleton (one view op instead of two)."""
    dim = axis(dim, x.ndim)
    if dim == x.ndim - 2 and x.shape[-1] == 1:
        x = x.squeeze(-1)
    elif dim != x.ndim - 1:
        x = x.movedim(dim, -1)
    if x.ndim == 2:
        return x
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def to_rows_actions(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` of shape ``[..., T, ..., A]`` with time at ``dim`` (of the dims before ``A``): ``(N, T, A)``."""
    dim = axis(dim, x.ndim - 1)
    if dim != x.ndim - 2:
        x = x.movedim(dim, -2)
    return x.reshape(math.prod(x.shape[:-2]), x.shape[-2], x.shape[-1])


def from_rows(y: torch.Tensor, shape: Sequence[int], dim: int) -> torch.Tensor:
    """Inverse of :func:`to_rows` for an original tensor of shape ``shape``."""
    shape = tuple(shape)
    dim = axis(dim, len(shape))
    if rows_shape(shape, dim) is not None:  # rows made by a reshape alone
        return y.reshape(shape)
    moved = shape[:dim] + shape[dim + 1 :] + (shape[dim],)
    return y.reshape(moved).movedim(-1, dim)


def rows_shape(shape: Sequence[int], dim: int) -> tuple[int, int] | None:
    """The ``(N, T)`` shape :func:`to_rows` gives a tensor of shape ``shape`` by reshaping alone (time
    last, or ``[..., T, 1]`` with time at ``dim``); None when the time dim must be moved first."""
    nd = len(shape)
    dim = axis(dim, nd)
    if dim == nd - 2 and shape[-1] == 1:
        return math.prod(shape[:-2]), shape[-2]
    if dim == nd - 1:
        return math.prod(shape[:-1]), shape[-1]
    return None


def common_float_dtype(*tensors: torch.Tensor) -> torch.dtype:
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def same_shapes(*tensors: torch.Tensor | None) -> bool:
    """All given and of one shape (else the caller defers to TorchRL, which raises its own error)."""
    if any(t is None for t in tensors):
        return False
    return len({tuple(t.shape) for t in tensors}) == 1


def as_float(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x if x.dtype == dtype else x.to(dtype)


def discount_rows(
    g: torch.Tensor, shape: Sequence[int], dim: int | None, dtype: torch.dtype | None = None
) -> torch.Tensor | None:
    """A tensor ``gamma``/``lmbda`` as TorchRL applies it to per-step tensors of shape ``shape``
    (broadcast against them, so entry ``[..., t, ...]`` is the discount of step t): expanded to ``shape``
    (a view) and, with a time ``dim``, brought to the ``(N, T)`` rows of :func:`to_rows`. None (the caller
    keeps TorchRL's path) when it requires grad (TorchRL differentiates it, rl_triton does not), does not
    broadcast to ``shape``, would promote the entries' float ``dtype`` (TorchRL's outputs would then take
    the discount's dtype), or is a CPU tensor with values outside [0, 1] (checked on the CPU only: a GPU
    check would need a host sync)."""
    shape = torch.Size(shape)
    if g.requires_grad or not g.is_floating_point():
        return None
    if dtype is not None and torch.promote_types(g.dtype, dtype) != dtype:
        return None
    try:
        if torch.broadcast_shapes(g.shape, shape) != shape:
            return None
    except RuntimeError:
        return None
    # (under torch.compile the function called checks a CPU tensor at run time: a check here would break the graph)
    if not is_compiling() and not values_in_unit(g):
        return None
    full = g.expand(shape)
    return full if dim is None else to_rows(full, dim)


def non_negative(*values: float | None) -> bool:
    return all(v is not None and v >= 0.0 for v in values)


# --------------------------------------------------------------------------------------------
# decorators


def expose_inherited_keys(keys_cls):
    """Class decorator for an ``_AcceptedKeys`` dataclass that extends TorchRL's: TorchRL's
    ``set_keys`` accepts only names found in the class's own ``__dict__``, so inherited fields are
    copied there (with their defaults) to stay settable."""
    for f in dataclasses.fields(keys_cls):
        if f.name not in keys_cls.__dict__:
            setattr(keys_cls, f.name, f.default)
    return keys_cls


def copy_signature(cls_init):
    """Decorator giving a ``(self, **kwargs)`` ``__init__`` the signature of ``cls_init``."""

    def deco(fn):
        fn.__signature__ = inspect.signature(cls_init)
        return fn

    return deco


# --------------------------------------------------------------------------------------------
# tensordict entries


class MissingEntryError(KeyError, ValueError):
    """A tensordict entry that an estimator needs is absent. A ``KeyError`` (a missing key) and a
    ``ValueError`` (what TorchRL's GAE raises for a missing value), so either ``except`` catches it."""

    __str__ = ValueError.__str__  # the message as written, not KeyError's repr of it


def missing_entry(estimator, key, role: str, field: str | None = None, hint: str = "") -> MissingEntryError:
    """The error for an absent ``key``, naming it and the estimator: ``role`` says what the entry holds,
    ``field`` the ``set_keys`` name that renames it."""
    rename = f"; set_keys({field}=...) renames it" if field else ""
    return MissingEntryError(f"{type(estimator).__name__}: the tensordict has no entry {key!r} ({role}{rename}){hint}")
