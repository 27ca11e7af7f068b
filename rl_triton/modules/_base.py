"""The base of the rl_triton estimators: what they share. Each estimator family's file (``td.py``, ``gae.py``,
``vtrace.py``, ``retrace.py``) adds its numbers and ends in one :mod:`rl_triton.functional` call.

* :class:`CachedScalars` keeps Python-float copies of 0-d tensor buffers (``gamma``, ``lmbda``, ...), so that a
  forward pass on CUDA passes plain floats to the kernels instead of calling ``.item()`` (a host sync) every time.
  Under torch.compile ``gamma`` and ``lmbda`` go as the buffers.
* :class:`RLTritonEstimator` (mixed in before TorchRL's estimator class): the values (stored, or from the value
  network as TorchRL calls it), the signals, the discounts as rl_triton takes them, advantage standardisation, the
  errors for a missing entry and for a tensordict without batch dims, and the fast path of ``est(tensordict)``
  with the hooks each estimator fills in.

The estimators that TorchRL has subclass TorchRL 0.14's class of the same name and keep everything but the
numeric core: constructor, defaults, ``_AcceptedKeys``/``set_keys``, ``in_keys``/``out_keys``, the value-network
calls (``params``/``target_params``, ``shifted``, chunking, vmap), ``skip_existing``, ``differentiable``, reward
standardisation, ``group_key`` and the keyword call form all come from TorchRL. The recursion over time is
:mod:`rl_triton.functional` on an ``(N, T)`` view of the data: the time dim is moved last (only when it is not
already) and every other dim flattened into N, which is a view for the usual ``[*B, T]`` and ``[*B, T, 1]``
layouts.

Per-step discounts: a ``gamma``/``lmbda`` buffer with more than one element that broadcasts against the
per-step entries (``[*B, T, 1]`` per step, ``[*B, 1, 1]`` per env, ...), and ``gamma ** steps_to_next_obs``
(TorchRL's discount with a ``steps_to_next_obs`` entry), go to rl_triton as per-step ``(N, T)`` tensors:
entry ``[..., t, ...]`` is the discount of step t, as TorchRL reads a tensor discount.

Fallbacks: whenever a call holds something rl_triton cannot express, that call runs TorchRL's own
functional instead (same result, TorchRL's speed): a ``gamma``/``lmbda`` that requires grad (TorchRL
differentiates it, rl_triton does not), one that does not broadcast against the entries, one outside
[0, 1] (tensors: checked on the CPU only), or per-step tensors whose shapes differ (TorchRL then raises
its own error).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch
from tensordict import TensorDict
from torch.compiler import is_compiling
from torchrl.objectives.utils import hold_out_net
from torchrl.objectives.value.advantages import _standardize_by_group

from .._discounts import in_unit
from ._common import as_float, common_float_dtype, discount_rows, from_rows, missing_entry, rows_shape, to_rows

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

    def _scalar(self, name: str) -> float | torch.Tensor | None:
        if is_compiling():
            return self._traced_scalar(name)
        buf = self._buffers.get(name)
        if buf is None:
            return None
        cache = self.__dict__.get("_rlt_scalar_cache")
        hit = None if cache is None else cache.get(name)
        try:  # _version, inline (the estimators' fast paths read their scalars on every call)
            version = buf._version
        except RuntimeError:
            version = None
        if hit is not None and hit[0] is buf and hit[1] == version:
            return hit[2]
        value = _read(buf)
        self._scalar_cache()[name] = (buf, version, value)
        return value

    def _scalars(self, *names: str) -> tuple:
        """:meth:`_scalar` of each of ``names``, from one call (compiled after a graph break, one frame rather
        than one per name: each name would recompile it)."""
        return tuple([self._scalar(name) for name in names])

    def _traced_scalar(self, name: str) -> float | torch.Tensor | None:
        """:meth:`_scalar` while torch.compile traces: ``gamma`` and ``lmbda``, which rl_triton's functions take
        as 0-d tensors, are the buffer itself (read by the compiled op at run time: reading it here would break
        the graph, and a new value in the buffer would recompile); other scalars (clipping thresholds) are the
        cached float, a constant of the graph."""
        buf = self._buffers.get(name)
        if buf is None or buf.numel() != 1 or buf.requires_grad:
            return None
        if name in ("gamma", "lmbda"):
            return buf.reshape(())
        cache = self.__dict__.get("_rlt_scalar_cache")
        hit = None if cache is None else cache.get(name)
        return None if hit is None or hit[0] is not buf else hit[2]

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


# --------------------------------------------------------------------------------------------
# helpers of the estimators

# What the entries hold, for the error that names a missing one (by tensor_keys field)
ROLES = {
    "value": "the state value V(s)",
    "reward": "the reward",
    "done": "the done flag",
    "terminated": "the terminated flag",
    "sample_log_prob": "the behaviour policy's log-probability of the stored action",
    "action": "the stored action, which the target policy scores",
}
_STOCK: dict = {}
ABSENT = object()  # _fast_or_general: no time_dim argument; _ROWS: not computed yet
_ROWS: dict = {}  # rows_shape by (shape, time dim), for the fast paths


def no_batch_dims(tensordict) -> RuntimeError:
    """The error for a tensordict without batch dims (an estimator needs a time dim)."""
    return RuntimeError(
        f"Expected input tensordict to have at least one dimension, got tensordict.batch_size = {tensordict.batch_size}"
    )


def no_params() -> RuntimeError:
    """The error for a functional (stateless) estimator called without ``params``."""
    return RuntimeError("Expected params to be passed to advantage module but got none.")


def _stock(cls, names: tuple) -> bool:
    """Whether ``cls`` inherits, for every method in ``names``, the version of the nearest class
    that declares ``_FAST_HOOKS`` (cached per class): a subclass that overrides one of the steps the
    fast path skips keeps the general path."""
    ok = _STOCK.get(cls)
    if ok is None:
        owner = next(c for c in cls.__mro__ if "_FAST_HOOKS" in vars(c))
        ok = _STOCK[cls] = all(getattr(cls, name) is getattr(owner, name) for name in names)
    return ok


def on_rows(fn, floats, flags, dim: int, n_out: int, **kwargs):
    """Runs ``fn(*floats, *flags, **kwargs)`` on ``(N, T)`` views (time ``dim`` moved last) and
    returns its outputs in the layout of ``floats[0]``. All tensors must share one shape."""
    shape = floats[0].shape
    dtype = common_float_dtype(*floats)
    rows = [to_rows(as_float(x, dtype), dim) for x in floats] + [to_rows(f, dim) for f in flags]
    out = fn(*rows, **kwargs)
    if n_out == 1:
        return from_rows(out, shape, dim)
    return tuple(from_rows(o, shape, dim) for o in out)


def in_shape_of(like: torch.Tensor, outs: tuple) -> tuple:
    """``outs`` of a ``rows=`` call (:func:`rl_triton._validation.prepare`) in ``like``'s shape. Calls
    that can be cached return them in it already; the others (non-contiguous inputs) as ``(N, T)``."""
    shape = like.shape
    a, b = outs  # (advantage, value_target) pairs: unpacked, not a generator (this runs on every fast call)
    return (a if a.shape == shape else a.reshape(shape)), (b if b.shape == shape else b.reshape(shape))


def buffer_on(buf: torch.Tensor, device: torch.device) -> torch.Tensor:
    return buf if buf.device == device else buf.to(device)


# --------------------------------------------------------------------------------------------
# the base class


class RLTritonEstimator(CachedScalars):
    """What the rl_triton estimators share (mixed in before the TorchRL base class)."""

    #: TorchRL replaces NaN ``("next", obs)`` entries by the root ones before calling the value
    #: network, but only after ``isnan(...).any()``, a host sync on an accelerator. When True,
    #: tensors off the CPU get the same replacement without the check (one ``where`` per floating
    #: input key, same values); CPU tensors keep TorchRL's code. Off by default: the replacement
    #: works on a shallow copy of the tensordict, so the value network's outputs
    #: (``state_value``, ``("next", "state_value")``) would not reach the caller's tensordict as
    #: they do with TorchRL.
    sync_free_nan_check: bool = False

    @staticmethod
    def _sync_free_sanitize(data, in_keys):
        """TorchRL's ``_sanitize_next_obs_nan`` without the ``isnan(...).any()`` check off the CPU; it stands for
        TorchRL's on instances with ``sync_free_nan_check`` set (:meth:`_values`), and TorchRL's own runs on
        the others without a frame of ours around it (under torch.compile each frame on the stack at the
        graph break of TorchRL's check counts as one more break)."""
        copied = False
        for key in in_keys:
            root = data.get(key, default=None)
            if root is None or not root.is_floating_point():
                continue
            next_key = ("next", *key) if isinstance(key, tuple) else ("next", key)
            nxt = data.get(next_key, default=None)
            if nxt is None or nxt.shape != root.shape:
                continue
            if nxt.device.type == "cpu":
                if not torch.isnan(nxt).any():
                    continue
            if not copied:
                data = data.copy()
                copied = True
            data.set(next_key, torch.where(torch.isnan(nxt), root, nxt))
        return data

    # ---------------------------------------------------------------- inputs

    def _values(self, tensordict, params, target_params, *, always_hold: bool = False):
        """Value and next value, from the value network (TorchRL's ``_call_value_nets``) or from
        the tensordict (both required there); records ``"shifted_valid"`` like TorchRL. (GAE's and
        V-trace's forwards spell this out, :meth:`_net_call` and the call: a frame fewer under torch.compile.)"""
        if self.value_network is not None:
            held, call = self._net_call(tensordict, params, target_params, always_hold)
            with hold_out_net(self.value_network) if held else nullcontext():
                value, next_value, valid = self._call_value_nets(**call)
                if valid is not None:
                    tensordict.set("shifted_valid", valid)
            return value, next_value
        return self._stored_values(tensordict)

    def _stored_values(self, tensordict):
        key = self.tensor_keys.value
        return self._entry(tensordict, key, "value"), self._entry(tensordict, ("next", key), "value")

    def _net_call(self, tensordict, params, target_params, always_hold: bool) -> tuple[bool, dict]:
        """(whether the value network is held out, the arguments of ``_call_value_nets``), as TorchRL forms them."""
        if self.sync_free_nan_check != ("_sanitize_next_obs_nan" in self.__dict__):  # the flag changed
            if self.sync_free_nan_check:
                self.__dict__["_sanitize_next_obs_nan"] = self._sync_free_sanitize
            else:
                del self.__dict__["_sanitize_next_obs_nan"]
        if params is not None:
            params = params.detach()
            if target_params is None:
                target_params = params.clone(False)
        held = always_hold or (params is None and target_params is None)
        # TorchRL's vmap_randomness sets "different" on its first compiled read, a change of the module that would
        # recompile the next call: the same value, without the write
        vmap = self.vmap_randomness if self._vmap_randomness is not None or not is_compiling() else "different"
        call = {
            "data": tensordict, "params": params, "next_params": target_params, "single_call": self.shifted,
            "value_key": self.tensor_keys.value, "detach_next": True, "vmap_randomness": vmap,
        }  # fmt: skip
        return held, call

    def _entry(self, tensordict, key, field: str, role: str | None = None, hint: str | None = None):
        """``tensordict[key]``, or an error naming the key and this estimator: ``field`` is the
        ``tensor_keys`` name of the entry (``key`` may be it under ``"next"``), ``role`` what it holds."""
        value = tensordict.get(key, None)
        if value is None:
            if hint is None:
                hint = ", and no value network was given" if field == "value" else ""
            raise missing_entry(self, key, role or ROLES.get(field, field), field, hint)
        return value

    def _signals(self, data):
        """Reward, done and terminated under ``"next"`` (terminated defaults to done, as in TorchRL)."""
        keys = self.tensor_keys
        reward = self._entry(data, ("next", keys.reward), "reward")
        done = self._entry(data, ("next", keys.done), "done")
        terminated = data.get(("next", keys.terminated), default=done)
        return reward, done, terminated

    def _steps_to_next_obs(self, tensordict):
        return tensordict.get(self.tensor_keys.steps_to_next_obs, None)

    # ---------------------------------------------------------------- discounts

    def _torchrl_gamma(self, reward, steps):
        """The discount exactly as TorchRL forms it (fallback paths, and ``gamma ** steps_to_next_obs``)."""
        gamma = buffer_on(self.gamma, reward.device)
        if steps is not None:
            gamma = gamma ** steps.view_as(reward)
        return gamma

    def _discounts(self, names, like, time_dim, steps=None, steps_reward=None) -> tuple | None:
        """The discount buffers ``names`` (``"gamma"``, ``"lmbda"``) as rl_triton takes them for per-step
        tensors shaped like ``like`` with time at ``time_dim``: a float for a scalar buffer in [0, 1]; for a
        tensor buffer, or gamma with a ``steps_to_next_obs`` entry ``steps`` (``gamma ** steps``, as TorchRL
        forms it after ``steps_reward``), its per-step ``(N, T)`` rows (:func:`discount_rows`; ``time_dim``
        None: expanded to ``like``'s shape). None when one of them cannot go (TorchRL's path then)."""
        out = []
        for name in names:
            buf = self._buffers.get(name)
            if buf is not None and buf.requires_grad:  # checked before any move: a copy made under no_grad has lost it
                return None
            if name == "gamma" and steps is not None:
                value = discount_rows(self._torchrl_gamma(steps_reward, steps), like.shape, time_dim, like.dtype)
            else:
                value = self._scalar(name)
                if value is None:
                    if buf is not None:
                        value = discount_rows(buffer_on(buf, like.device), like.shape, time_dim, like.dtype)
                elif not in_unit(value):  # (a tensor: traced, checked by the op)
                    value = None
            if value is None:
                return None
            out.append(value)
        return tuple(out)

    # ---------------------------------------------------------------- outputs

    def _standardized(self, x, tensordict, eps: float, *, centre_first: bool = False):
        """``x`` standardised over the batch, or within its ``group_key`` groups, as TorchRL does. With
        ``centre_first`` the scale is the std of the centred ``x`` (TorchRL's TD estimators on the rewards), else
        of ``x`` itself (TorchRL's V-trace on the advantage): the two can differ in the last bit."""
        groups = self._group_ids(tensordict)
        if groups is not None:
            return _standardize_by_group(x, groups, eps=eps)
        if centre_first:
            x = x - x.mean()
            return x / x.std().clamp_min(eps)
        return (x - x.mean()) / x.std().clamp_min(eps)

    # ---------------------------------------------------------------- the fast path
    #
    # ``est(tensordict)`` without a value network, on a TensorDict whose entries are plain tensors of
    # one shape, runs the numbers directly: no TorchRL decorators (their effect is reproduced: the
    # grad mode; skip_existing only concerns value-network calls) and no shifted-tensordict copies,
    # which would take several times the host time of the rest of the call. Entries are read with
    # tensordict's public items() (a dict of a tensordict's own entries is cheaper than two gets) or get
    # (nested keys), and written with its public set. Anything else (a missing entry included) returns
    # None before writing, and the general, decorated path runs and raises TorchRL's or our errors.
    # Each estimator says when the fast path applies (_fast_scalars) and gives its numbers
    # (_fast_targets); both paths call the same rl_triton functions on the same tensors.

    #: whether _fast_targets needs the (N, T) rows of a reshape (time last or [..., T, 1])
    _FAST_ROWS = True
    #: what a subclass must not override for the fast path to stand for its forward
    _FAST_HOOKS: tuple = ()

    def _fast_scalars(self) -> tuple | None:
        """The scalars the fast path needs, or None when it does not apply."""
        raise NotImplementedError

    def _fast_targets(self, tensordict, value, next_value, reward, done, terminated, rows, scalars) -> tuple:
        """``(advantage, value_target)`` in ``value``'s shape."""
        raise NotImplementedError

    def _fast_or_general(self, args, kwargs, params, target_params, time_dim=ABSENT):
        """``forward``'s dispatch: ``est(tensordict)`` on a ``TensorDict`` without a value network
        tries :meth:`_fast_forward` (None: not the common case); every other call, and those,
        TorchRL's decorated forward (:meth:`_forward`). ``time_dim``: GAE's keyword argument of both
        (passed on when given; not a ``**extra`` dict, which would cost each call one)."""
        if (
            len(args) == 1
            and not kwargs
            and self.value_network is None
            and type(args[0]) is TensorDict
            and not is_compiling()  # its caches and float scalars are for eager calls: compiled, the general path
        ):
            out = self._fast_forward(args[0]) if time_dim is ABSENT else self._fast_forward(args[0], time_dim)
            if out is not None:
                return out
        if time_dim is ABSENT:
            return self._forward(*args, params=params, target_params=target_params, **kwargs)
        return self._forward(*args, params=params, target_params=target_params, time_dim=time_dim, **kwargs)

    def _fast_forward(self, tensordict, time_dim=None):
        """:meth:`_forward`'s outputs for the common case (see :meth:`_fast_inputs`), written into
        ``tensordict``; None (nothing read past the check, nothing written) otherwise."""
        stock = _STOCK.get(type(self))
        if not (stock or (stock is None and _stock(type(self), self._FAST_HOOKS))):
            return None
        scalars = self._fast_scalars()
        if scalars is None:
            return None
        got = self._fast_inputs(tensordict, time_dim)
        if got is None:
            return None
        value, next_value, reward, done, terminated, rows = got
        # TorchRL's _self_set_grad_enabled for the calls that bypass it (_grad_mode_differs asked only when the
        # modes differ: its answer is False otherwise)
        if torch.is_grad_enabled() != self.differentiable and self._grad_mode_differs(value, next_value, reward):
            with torch.set_grad_enabled(self.differentiable):
                advantage, value_target = self._fast_targets(
                    tensordict, value, next_value, reward, done, terminated, rows, scalars
                )
        else:
            advantage, value_target = self._fast_targets(
                tensordict, value, next_value, reward, done, terminated, rows, scalars
            )
        keys = self.tensor_keys
        tensordict.set(keys.advantage, advantage)
        tensordict.set(keys.value_target, value_target)
        return tensordict

    def _fast_inputs(self, tensordict, time_dim):
        """The common case: ``tensordict`` has batch dims, its value, next value, reward, done and
        terminated entries (``tensor_keys``) are plain tensors of one shape, the three float ones of
        one dtype, and it holds no ``steps_to_next_obs`` and no ``shifted_valid`` entry. Returns
        ``(value, next_value, reward, done, terminated, rows)``, ``rows`` being the ``(N, T)`` shape
        :func:`to_rows` gives by a reshape (None unless ``_FAST_ROWS``), or None."""
        if not tensordict.batch_size:
            return None
        keys = self.tensor_keys
        # the entries of each level as a dict: get's per-call key handling for str keys, once per level
        root = dict(tensordict.items())
        steps = keys.steps_to_next_obs
        if "shifted_valid" in root or (
            steps in root if type(steps) is str else tensordict.get(steps, None) is not None
        ):  # fmt: skip
            return None
        key = keys.value
        value = root.get(key) if type(key) is str else tensordict.get(key, None)
        nxt = root.get("next")
        if type(value) is not torch.Tensor or type(nxt) is not TensorDict:
            return None
        entries, get = dict(nxt.items()), nxt.get
        next_value = entries.get(key) if type(key) is str else get(key, None)
        key = keys.reward
        reward = entries.get(key) if type(key) is str else get(key, None)
        key = keys.done
        done = entries.get(key) if type(key) is str else get(key, None)
        key = keys.terminated
        terminated = entries.get(key, done) if type(key) is str else get(key, done)
        Tensor = torch.Tensor
        if (
            type(next_value) is not Tensor
            or type(reward) is not Tensor
            or type(done) is not Tensor
            or type(terminated) is not Tensor
        ):
            return None
        shape, dtype = value.shape, value.dtype
        if (
            next_value.shape != shape
            or reward.shape != shape
            or done.shape != shape
            or terminated.shape != shape
            or next_value.dtype != dtype
            or reward.dtype != dtype
        ):
            return None
        rows = None
        if self._FAST_ROWS:
            dim = self._get_time_dim(time_dim, tensordict)
            rows = _ROWS.get((shape, dim), ABSENT)
            if rows is ABSENT:  # the same few shapes every call: rows_shape once each
                rows = rows_shape(shape, dim)
                if len(_ROWS) >= 256:
                    _ROWS.clear()
                _ROWS[shape, dim] = rows
            if rows is None:
                return None
        return value, next_value, reward, done, terminated, rows

    def _grad_mode_differs(self, *tensors) -> bool:
        """Whether ops on ``tensors`` must run under ``torch.set_grad_enabled(self.differentiable)``
        (TorchRL's ``_self_set_grad_enabled``): only when the mode differs and one of them requires
        grad; otherwise no op records a graph in either mode."""
        if torch.is_grad_enabled() == self.differentiable:
            return False
        for t in tensors:
            if t.requires_grad:
                return True
        return False
