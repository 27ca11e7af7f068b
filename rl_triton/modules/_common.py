"""Shared machinery of the TorchRL-facing modules.

* :func:`to_rows` / :func:`from_rows` bring a ``[..., T, ...]`` tensor to the ``(N, T)`` layout of
  :mod:`rl_triton.functional` (time last, every other dim flattened into N) and back. Moving the time
  dim is skipped when it is already last, and ``reshape`` returns a view whenever the strides allow
  it (always for time-last tensors and for a trailing singleton feature dim such as ``[*B, T, 1]``).
* :class:`CachedScalars` keeps Python-float copies of 0-d tensor buffers (``gamma``, ``lmbda``,
  ...), so that a forward pass on CUDA passes plain floats to the kernels instead of calling
  ``.item()`` (a host sync) every time.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Sequence

import torch
from tensordict import TensorDict
from tensordict.utils import unravel_key

# --------------------------------------------------------------------------------------------
# layout


def to_rows(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` with dim ``dim`` (non-negative) moved last and the others flattened: ``(N, T)``. The
    common ``[*B, T, 1]`` layout only drops its trailing singleton (one view op instead of two)."""
    if dim == x.ndim - 2 and x.shape[-1] == 1:
        x = x.squeeze(-1)
    elif dim != x.ndim - 1:
        x = x.movedim(dim, -1)
    if x.ndim == 2:
        return x
    return x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def to_rows_actions(x: torch.Tensor, dim: int) -> torch.Tensor:
    """``x`` of shape ``[..., T, ..., A]`` with time at ``dim``: ``(N, T, A)`` (actions stay last)."""
    if dim != x.ndim - 2:
        x = x.movedim(dim, -2)
    return x.reshape(math.prod(x.shape[:-2]), x.shape[-2], x.shape[-1])


def from_rows(y: torch.Tensor, shape: Sequence[int], dim: int) -> torch.Tensor:
    """Inverse of :func:`to_rows` for an original tensor of shape ``shape``."""
    shape = tuple(shape)
    if rows_shape(shape, dim) is not None:  # rows made by a reshape alone
        return y.reshape(shape)
    moved = shape[:dim] + shape[dim + 1 :] + (shape[dim],)
    return y.reshape(moved).movedim(-1, dim)


def rows_shape(shape: Sequence[int], dim: int) -> tuple[int, int] | None:
    """The ``(N, T)`` shape :func:`to_rows` gives a tensor of shape ``shape`` by reshaping alone (time
    last, or ``[..., T, 1]`` with time at ``dim``); None when the time dim must be moved first."""
    nd = len(shape)
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


def in_unit(*values: float | None) -> bool:
    """All values are known and in [0, 1] (the range rl_triton accepts for gamma and lambda). A plain
    loop: the estimators' fast paths call this on every step (a generator costs ~3x as much)."""
    for v in values:
        if v is None or not 0.0 <= v <= 1.0:
            return False
    return True


def non_negative(*values: float | None) -> bool:
    return all(v is not None and v >= 0.0 for v in values)


# --------------------------------------------------------------------------------------------
# scalar buffers without host syncs


def _version(t: torch.Tensor):
    try:
        return t._version
    except RuntimeError:  # inference tensors do not track versions
        return None


def _read(t: torch.Tensor) -> float | None:
    """The value of a one-element real tensor that needs no gradient, else None (reads it: a sync
    on an accelerator)."""
    if t.numel() != 1 or t.requires_grad or t.is_complex() or t.dtype == torch.bool:
        return None
    return float(t.item())


def _exact(value, dtype: torch.dtype) -> float | None:
    """The float a Python number becomes once stored in a CPU tensor of ``dtype`` (no sync)."""
    try:
        return float(torch.tensor(value, dtype=dtype).item())
    except (TypeError, ValueError, RuntimeError):
        return None


class CachedScalars:
    """Mixin for ``nn.Module`` subclasses that keep hyper-parameters in 0-d tensor buffers.

    :meth:`_scalar` returns the buffer's value as a Python float. It is read once and cached with
    the buffer object and its version counter, so it is read again only when the buffer is
    replaced or modified in place (e.g. ``load_state_dict``). Values are primed from the
    constructor arguments (:meth:`_prime_scalars`) and carried across ``module.to(...)``
    (:meth:`_apply`), so a module that lives on CUDA never needs ``.item()`` on a CUDA tensor
    unless its buffers are changed behind its back. ``None`` means the buffer is not a scalar (or
    needs a gradient): callers then fall back to TorchRL's own code.
    """

    _SCALAR_BUFFERS: tuple[str, ...] = ()

    def _scalar_cache(self) -> dict:
        cache = self.__dict__.get("_rlt_scalar_cache")
        if cache is None:
            cache = self.__dict__["_rlt_scalar_cache"] = {}
        return cache

    def _scalar(self, name: str) -> float | None:
        buf = self._buffers.get(name)
        if buf is None:
            return None
        cache = self.__dict__.get("_rlt_scalar_cache")
        hit = None if cache is None else cache.get(name)
        version = _version(buf)
        if hit is not None and hit[0] is buf and hit[1] == version:
            return hit[2]
        value = _read(buf)
        self._scalar_cache()[name] = (buf, version, value)
        return value

    def _known_scalar(self, name: str) -> float | None:
        """Like :meth:`_scalar` but never syncs: None unless cached or the buffer is on the CPU."""
        buf = self._buffers.get(name)
        if buf is None:
            return None
        hit = self._scalar_cache().get(name)
        if hit is not None and hit[0] is buf and hit[1] == _version(buf):
            return hit[2]
        if buf.device.type == "cpu":
            return self._scalar(name)
        return None

    def _prime_scalars(self, **arguments) -> None:
        """Caches the buffers' values from the constructor arguments they were made from."""
        cache = self._scalar_cache()
        for name, arg in arguments.items():
            buf = self._buffers.get(name)
            if buf is None or buf.numel() != 1 or buf.requires_grad:
                continue
            if isinstance(arg, torch.Tensor) or buf.device.type == "cpu":
                value = _read(buf) if buf.device.type == "cpu" else _read(arg.detach().reshape(()).to(buf.dtype))
            else:
                value = _exact(arg, buf.dtype)
            if value is not None:
                cache[name] = (buf, _version(buf), value)

    def _apply(self, fn, recurse=True):
        known = {}
        for name in self._SCALAR_BUFFERS:
            buf = self._buffers.get(name)
            if buf is not None:
                value = self._known_scalar(name)
                if value is not None:
                    known[name] = (buf.dtype, value)
        out = super()._apply(fn, recurse)
        cache = self._scalar_cache()
        for name, (dtype, value) in known.items():
            buf = self._buffers.get(name)
            if buf is None:
                continue
            if buf.dtype != dtype:
                try:
                    value = float(torch.tensor(value, dtype=dtype).to(buf.dtype).item())
                except (TypeError, RuntimeError):
                    continue
            cache[name] = (buf, _version(buf), value)
        return out


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
# TensorDict access on the estimators' fast paths


def key_path(key) -> tuple[str, ...] | None:
    """A tensordict key as a tuple of strings (``"a"`` -> ``("a",)``), or None if it is not a key."""
    try:
        key = unravel_key(key)
    except Exception:  # noqa: BLE001 - not a NestedKey (e.g. a list): no fast path for it
        return None
    return (key,) if isinstance(key, str) else key


def _probe_td_internals() -> bool:
    """Whether ``TensorDict._get_tuple(path, default)`` returns what ``get(path, default)`` returns
    and ``TensorDict._set_str(key, value, inplace=False, validated=True)`` stores ``value`` as
    ``set(key, value)`` does for a value that passes ``set``'s checks, lock included. Checked on a
    small TensorDict: these are tensordict internals, so any other behaviour (or their absence in
    another tensordict version) sends the fast paths to the public ``get``/``set``."""
    try:
        a, b, c = torch.zeros(2, 1), torch.ones(2), torch.full((2, 3), 2.0)
        td = TensorDict({"a": a, "next": {"b": b}}, batch_size=[2])
        get = td._get_tuple
        if get(("a",), None) is not a or get(("next", "b"), None) is not b:
            return False
        if get(("c",), None) is not None or get(("next", "c"), None) is not None or get(("c", "b"), None) is not None:
            return False
        td._set_str("c", c, inplace=False, validated=True)
        td._set_str("a", b, inplace=False, validated=True)
        if td.get("c") is not c or td.get("a") is not b or set(td.keys()) != {"a", "c", "next"}:
            return False
        td.lock_()
        try:
            td._set_str("d", c, inplace=False, validated=True)
        except RuntimeError:
            pass
        else:
            return False
        return set(td.keys()) == {"a", "c", "next"}
    except Exception:  # noqa: BLE001 - any failure means "do not use them"
        return False


_TD_INTERNALS: list = []


def td_internals() -> bool:
    """:func:`_probe_td_internals`, run once per process."""
    if not _TD_INTERNALS:
        _TD_INTERNALS.append(_probe_td_internals())
    return _TD_INTERNALS[0]


def td_set(td, key, value, internals: bool) -> None:
    """``td.set(key, value)`` for a ``TensorDict`` ``td`` and a tensor ``value`` shaped and placed
    like an entry of ``td`` (its shape starts with the batch size and it lives on ``td``'s device, so
    ``set``'s checks pass): a plain string key goes to ``_set_str`` when ``internals``."""
    if internals and type(key) is str:
        td._set_str(key, value, inplace=False, validated=True)
    else:
        td.set(key, value)


_PATHS: dict = {}  # key -> key_path(key), for td_get


def td_get(td, key):
    """``td.get(key, None)``; for a ``TensorDict`` whose internals passed :func:`td_internals`, read
    with ``_get_tuple`` (the same lookup, without ``get``'s key unravelling and argument handling)."""
    if type(td) is TensorDict and td_internals():
        try:
            path = _PATHS.get(key)
        except TypeError:  # not hashable, so not a key: get() decides what happens
            return td.get(key, None)
        if path is None:
            path = key_path(key)
            if path is None:
                return td.get(key, None)
            if len(_PATHS) < 4096:
                _PATHS[key] = path
        return td._get_tuple(path, None)
    return td.get(key, None)


class KeyPaths:
    """The tensordict entries an estimator's fast path reads, derived from its ``tensor_keys`` (a
    dataclass instance) and re-derived whenever a key changes (``set_keys`` replaces the instance;
    assigning a field changes its ``__dict__``).

    Each field ``name`` has a root entry (the key itself) and a next entry (``("next", key)``);
    :meth:`fetch` reads a list of them from a tensordict at once.
    """

    __slots__ = ("snapshot", "keys", "paths", "plans")

    def __init__(self, tensor_keys):
        fields = getattr(tensor_keys, "__dict__", None)
        self.snapshot = None if fields is None else dict(fields)
        if fields is None:
            fields = {f.name: getattr(tensor_keys, f.name) for f in dataclasses.fields(tensor_keys)}
        self.keys = dict(fields)
        self.plans = {}  # entries -> fetch plan (see _plan)
        # (False, name) -> the root entry's path; (True, name) -> the next entry's path
        self.paths = {}
        for name, key in fields.items():
            path = key_path(key)
            self.paths[False, name] = path
            self.paths[True, name] = None if path is None else ("next", *path)

    @classmethod
    def of(cls, module) -> KeyPaths:
        """``module``'s paths, cached on the module while its keys are unchanged."""
        keys = module.tensor_keys
        cached = module.__dict__.get("_rlt_key_paths")
        if cached is not None and cached.snapshot is not None and cached.snapshot == getattr(keys, "__dict__", None):
            return cached
        paths = module.__dict__["_rlt_key_paths"] = cls(keys)
        return paths

    def fetch(self, td, entries: tuple, internals: bool) -> list | None:
        """``[td.get(path, None) for each entry]`` where an entry is ``(in_next, field name)`` or a
        literal path tuple; None if a field's key is not a valid key. With ``internals`` (a
        ``TensorDict`` whose accessors passed :func:`td_internals`), one-level entries are read with
        ``_get_str`` and the ``"next"`` sub-tensordict is looked up once."""
        plan = self.plans.get(entries)
        if plan is None:
            plan = self.plans[entries] = self._plan(entries)
        if plan is None:
            return None
        if not internals:
            get = td.get
            return [get(path, None) for _, _, path in plan]
        get_str = td._get_str
        sub = get_str("next", None)
        sub_str = sub._get_str if type(sub) is TensorDict else None
        out = []
        for where, key, path in plan:
            if where == 0:
                out.append(get_str(key, None))
            elif where == 1 and sub_str is not None:
                out.append(sub_str(key, None))
            else:
                out.append(td._get_tuple(path, None))
        return out

    def _plan(self, entries: tuple) -> tuple | None:
        """Per entry ``(where, key, path)``: where 0 = a root string key, 1 = a string key under
        ``"next"``, 2 = any other path (``key`` unused); None if an entry's key is not valid."""
        plan = []
        for entry in entries:
            path = self.paths[entry] if type(entry[0]) is bool else entry
            if path is None:
                return None
            if len(path) == 1:
                plan.append((0, path[0], path))
            elif len(path) == 2 and path[0] == "next":
                plan.append((1, path[1], path))
            else:
                plan.append((2, None, path))
        return tuple(plan)
