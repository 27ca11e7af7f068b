"""TorchRL value estimators whose recursion runs in rl_triton.

Each class subclasses TorchRL 0.14's estimator of the same name and keeps everything but the
numeric core: constructor, defaults, ``_AcceptedKeys``/``set_keys``, ``in_keys``/``out_keys``, the
value-network calls (``params``/``target_params``, ``shifted``, chunking, vmap), ``skip_existing``,
``differentiable``, advantage standardisation, ``group_key`` and the keyword call form all come
from TorchRL. The recursion over time is :mod:`rl_triton.functional` on an ``(N, T)`` view of the
data: the time dim is moved last (only when it is not already) and every other dim flattened into
N, which is a view for the usual ``[*B, T]`` and ``[*B, T, 1]`` layouts.

Per-step discounts: ``gamma``/``lmbda`` buffers with more than one element that broadcast against the
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

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from tensordict import TensorDict, is_tensor_collection
from tensordict.nn import CompositeDistribution, dispatch, set_composite_lp_aggregate
from tensordict.utils import NestedKey
from torch.compiler import is_compiling
from torchrl.objectives.utils import _maybe_get_or_select, hold_out_net
from torchrl.objectives.value import advantages as _trl
from torchrl.objectives.value import functional as _trl_fn
from torchrl.objectives.value.advantages import _self_set_grad_enabled, _self_set_skip_existing, set_skip_existing

from .. import functional as F
from ._common import (
    CachedScalars,
    as_float,
    common_float_dtype,
    copy_signature,
    discount_rows,
    expose_inherited_keys,
    from_rows,
    in_unit,
    missing_entry,
    non_negative,
    rows_shape,
    same_shapes,
    to_rows,
)

__all__ = ["GAE", "MultiAgentGAE", "TD0Estimator", "TD1Estimator", "TDLambdaEstimator", "VTrace"]


_TD0_ROW = 64  # row length of the flat TD(0) layout
# What a TD estimator's forward calls that its fast path skips (see _stock)
_TD_HOOKS = (
    "_forward", "_td_forward", "_td_inputs", "value_estimate", "_values", "_signals", "_steps_to_next_obs",
    "_prepare_shifted_tensordict", "_mask_shifted_output", "_fast_forward", "_fast_inputs", "_fast_scalars",
    "_fast_targets", "_grad_mode_differs",
)  # fmt: skip
# What the entries hold, for the error that names a missing one (by tensor_keys field)
_ROLES = {
    "value": "the state value V(s)",
    "reward": "the reward",
    "done": "the done flag",
    "terminated": "the terminated flag",
    "sample_log_prob": "the behaviour policy's log-probability of the stored action",
    "action": "the stored action, which the target policy scores",
}
_STOCK: dict = {}
_ABSENT = object()  # _fast_or_general: no time_dim argument; _ROWS: not computed yet
_ROWS: dict = {}  # rows_shape by (shape, time dim), for the fast paths


def _stock(cls, names: tuple) -> bool:
    """Whether ``cls`` inherits, for every method in ``names``, the version of the nearest class
    that declares ``_FAST_HOOKS`` (cached per class): a subclass that overrides one of the steps the
    fast path skips keeps the general path."""
    ok = _STOCK.get(cls)
    if ok is None:
        owner = next(c for c in cls.__mro__ if "_FAST_HOOKS" in vars(c))
        ok = _STOCK[cls] = all(getattr(cls, name) is getattr(owner, name) for name in names)
    return ok


def _on_rows(fn, floats, flags, dim: int, n_out: int, **kwargs):
    """Runs ``fn(*floats, *flags, **kwargs)`` on ``(N, T)`` views (time ``dim`` moved last) and
    returns its outputs in the layout of ``floats[0]``. All tensors must share one shape."""
    shape = floats[0].shape
    dtype = common_float_dtype(*floats)
    rows = [to_rows(as_float(x, dtype), dim) for x in floats] + [to_rows(f, dim) for f in flags]
    out = fn(*rows, **kwargs)
    if n_out == 1:
        return from_rows(out, shape, dim)
    return tuple(from_rows(o, shape, dim) for o in out)


def _in_shape_of(like: torch.Tensor, outs: tuple) -> tuple:
    """``outs`` of a ``rows=`` call (:func:`rl_triton._validation.prepare`) in ``like``'s shape. Calls
    that can be cached return them in it already; the others (non-contiguous inputs) as ``(N, T)``."""
    shape = like.shape
    a, b = outs  # (advantage, value_target) pairs: unpacked, not a generator (this runs on every fast call)
    return (a if a.shape == shape else a.reshape(shape)), (b if b.shape == shape else b.reshape(shape))


def _buffer_on(buf: torch.Tensor, device: torch.device) -> torch.Tensor:
    return buf if buf.device == device else buf.to(device)


class _RLTritonEstimator(CachedScalars):
    """Helpers shared by the estimators below (mixed in before the TorchRL base class)."""

    #: TorchRL replaces NaN ``("next", obs)`` entries by the root ones before calling the value
    #: network, but only after ``isnan(...).any()``, a host sync on an accelerator. When True,
    #: tensors off the CPU get the same replacement without the check (one ``where`` per floating
    #: input key, same values); CPU tensors keep TorchRL's code. Off by default: the replacement
    #: works on a shallow copy of the tensordict, so the value network's outputs
    #: (``state_value``, ``("next", "state_value")``) would not reach the caller's tensordict as
    #: they do with TorchRL (the CUDA parity tests caught this).
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
            raise missing_entry(self, key, role or _ROLES.get(field, field), field, hint)
        return value

    def _next_state_value(self, tensordict, target_params, next_value, kwargs):
        """V(s') as TorchRL's TD ``value_estimate`` gets it: given, from the value network, or read."""
        if next_value is None:
            next_value = self._next_value(tensordict, target_params, kwargs=kwargs)
            if next_value is None:
                raise missing_entry(self, ("next", self.tensor_keys.value), _ROLES["value"], "value")
        return next_value

    def _td_inputs(self, tensordict, target_params, next_value, time_dim, kwargs, eps: float):
        """What TorchRL's TD(1)/TD(lambda) ``value_estimate`` reads, in its order: rewards
        standardised in place when ``average_rewards`` (``eps`` as TorchRL uses for that class),
        V(s') from the value network unless given, the time dim, and the (shifted) signals."""
        steps = self._steps_to_next_obs(tensordict)
        if self.average_rewards:
            reward = self._entry(tensordict, ("next", self.tensor_keys.reward), "reward")
            self._standardize_rewards(tensordict, reward, eps)
        next_value = self._next_state_value(tensordict, target_params, next_value, kwargs)
        time_dim = self._get_time_dim(time_dim, tensordict)
        valid = tensordict.get("shifted_valid", default=None)
        data_for_value = self._prepare_shifted_tensordict(tensordict, valid, time_dim)
        return (steps, next_value, time_dim, *self._signals(data_for_value))

    def _signals(self, data):
        """Reward, done and terminated under ``"next"`` (terminated defaults to done, as in TorchRL)."""
        keys = self.tensor_keys
        reward = self._entry(data, ("next", keys.reward), "reward")
        done = self._entry(data, ("next", keys.done), "done")
        terminated = data.get(("next", keys.terminated), default=done)
        return reward, done, terminated

    def _steps_to_next_obs(self, tensordict):
        return tensordict.get(self.tensor_keys.steps_to_next_obs, None)

    def _torchrl_gamma(self, reward, steps):
        """The discount exactly as TorchRL forms it (fallback paths, and ``gamma ** steps_to_next_obs``)."""
        gamma = _buffer_on(self.gamma, reward.device)
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
                        value = discount_rows(_buffer_on(buf, like.device), like.shape, time_dim, like.dtype)
                elif type(value) is float and not 0.0 <= value <= 1.0:  # a tensor: traced, checked by the op
                    value = None
            if value is None:
                return None
            out.append(value)
        return tuple(out)

    def _standardize_rewards(self, tensordict, reward, eps):
        groups = self._group_ids(tensordict)
        if groups is None:
            reward = reward - reward.mean()
            reward = reward / reward.std().clamp_min(eps)
        else:
            reward = _trl._standardize_by_group(reward, groups, eps=eps)
        # written back, as TorchRL does, for code that reads the rewards later
        tensordict.set(("next", self.tensor_keys.reward), reward)
        return reward

    # ---------------------------------------------------------------- the fast path
    #
    # ``est(tensordict)`` without a value network, on a TensorDict whose entries are plain tensors of
    # one shape, runs the numbers directly: no TorchRL decorators (their effect is reproduced: the
    # grad mode; skip_existing only concerns value-network calls) and no shifted-tensordict copies,
    # which would take several times the host time of the rest of the call. Entries are read with
    # tensordict's public items() (a dict of a tensordict's own entries costs less than two gets) or get
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

    def _fast_or_general(self, args, kwargs, params, target_params, time_dim=_ABSENT):
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
            out = self._fast_forward(args[0]) if time_dim is _ABSENT else self._fast_forward(args[0], time_dim)
            if out is not None:
                return out
        if time_dim is _ABSENT:
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
        # the entries of each level as a dict: get's per-call key handling (~1 us) for str keys, once per level
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
            rows = _ROWS.get((shape, dim), _ABSENT)
            if rows is _ABSENT:  # the same few shapes every call: rows_shape once each
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

    def _td_scalars(self, *names) -> tuple | None:
        """The TD estimators' fast-path condition: scalar ``names`` in [0, 1], no reward
        standardisation and no functional value network."""
        if self.average_rewards or self.is_stateless:
            return None
        values = tuple(self._scalar(name) for name in names)
        return values if in_unit(*values) else None

    def _td_forward(self, tensordict, params, target_params):
        """TD(0)/TD(1)/TD(lambda) forward pass (value_target from :meth:`value_estimate`)."""
        if tensordict.batch_dims < 1:
            raise RuntimeError(
                "Expected input tensordict to have at least one dimensions, got"
                f"tensordict.batch_size = {tensordict.batch_size}"
            )
        if self.is_stateless and params is None:
            raise RuntimeError("Expected params to be passed to advantage module but got none.")
        value, next_value = self._values(tensordict, params, target_params)
        valid = tensordict.get("shifted_valid", default=None)
        data_for_value = self._prepare_shifted_tensordict(tensordict, valid, self._get_time_dim(None, tensordict))
        value_target = self.value_estimate(data_for_value, next_value=next_value)
        tensordict.set(self.tensor_keys.advantage, value_target - value)
        tensordict.set(self.tensor_keys.value_target, value_target)
        self._mask_shifted_output(tensordict, valid)
        return tensordict


# --------------------------------------------------------------------------------------------
# TD(0)


class TD0Estimator(_RLTritonEstimator, _trl.TD0Estimator):
    """TD(0) (one-step bootstrapped) targets, rl_triton-backed.

    Replaces :class:`torchrl.objectives.value.TD0Estimator`; same constructor, keys and outputs::

        from rl_triton.modules import TD0Estimator   # instead of torchrl.objectives.value

    ``value_target = r + gamma * (1 - terminated) * V(s')`` and ``advantage = value_target - V(s)``,
    computed by :func:`rl_triton.compute_lambda_returns` with ``lambda_=0`` on the data viewed as
    short rows (the estimate is elementwise, so no time dim is involved) with every step flagged
    as a boundary (so a non-finite value never leaks into a neighbouring step).

    A tensor ``gamma`` (or ``steps_to_next_obs``) is a per-step discount, read elementwise. Falls back to
    TorchRL's ``td0_return_estimate`` for a grad-requiring or non-broadcasting ``gamma``, ``gamma`` outside
    [0, 1] or mismatched shapes.
    """

    _SCALAR_BUFFERS = ("gamma",)

    @copy_signature(_trl.TD0Estimator.__init__)
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._prime_scalars(gamma=kwargs.get("gamma"))

    def forward(self, *args, params=None, target_params=None, **kwargs):
        """Computes the TD(0) advantage and target (see :class:`torchrl.objectives.value.TD0Estimator`).

        ``est(tensordict)`` without a value network takes the fast path in the common case
        (:meth:`_fast_inputs`); everything else TorchRL's decorated forward (:meth:`_forward`)."""
        return self._fast_or_general(args, kwargs, params, target_params)

    _FAST_ROWS = False  # elementwise: no time dim
    _FAST_HOOKS = _TD_HOOKS + ("_td0_rows", "_all_steps")

    def _fast_scalars(self):
        return self._td_scalars("gamma")

    def _fast_targets(self, tensordict, value, next_value, reward, done, terminated, rows, scalars):
        value_target, advantage = self._td0_rows(reward, next_value, terminated, scalars[0], value)
        return _in_shape_of(value, (advantage, value_target))

    @_self_set_skip_existing
    @_self_set_grad_enabled
    @dispatch
    def _forward(self, tensordict, *, params=None, target_params=None):
        """TorchRL's TD(0) forward, rl_triton-backed (every case :meth:`forward` does not take faster)."""
        return self._td_forward(tensordict, params, target_params)

    def value_estimate(self, tensordict, target_params=None, next_value=None, **kwargs):
        reward = self._entry(tensordict, ("next", self.tensor_keys.reward), "reward")
        steps = self._steps_to_next_obs(tensordict)
        if self.average_rewards:
            reward = self._standardize_rewards(tensordict, reward, 1e-5)
        next_value = self._next_state_value(tensordict, target_params, next_value, kwargs)
        # TorchRL's TD(0) reads terminated alone when done is absent
        done = tensordict.get(("next", self.tensor_keys.done), None)
        terminated = tensordict.get(("next", self.tensor_keys.terminated), default=done)
        if terminated is None:
            raise missing_entry(self, ("next", self.tensor_keys.done), _ROLES["done"], "done")
        shapes_ok = same_shapes(next_value, reward, terminated)
        got = self._discounts(("gamma",), reward, None, steps, reward) if shapes_ok else None
        if got is None:
            return _trl_fn.td0_return_estimate(
                gamma=self._torchrl_gamma(reward, steps),
                next_state_value=next_value,
                reward=reward,
                done=done,
                terminated=terminated,
            )
        return self._td0_rows(reward, next_value, terminated, got[0])

    def _td0_rows(self, reward, next_value, terminated, gamma, value=None):
        """The TD(0) target of same-shape ``reward``, ``next_value`` and ``terminated``; with
        ``value`` (of their shape and float dtype), ``(target, target - value)`` from one ``rows=``
        launch (shaped by :meth:`_fast_targets`)."""
        # elementwise: any (N, L) split of the flat data gives the same numbers; short rows keep
        # every kernel program busy (one long row would be a sequential walk over all elements)
        dtype = common_float_dtype(reward, next_value)
        numel = reward.numel()
        width = math.gcd(numel, _TD0_ROW) if numel else 1
        rows = (numel // width, width)
        every_step = self._all_steps(torch.Size(rows), reward.device)
        if type(gamma) is not float and gamma.dim():  # a per-step gamma, expanded to the data's shape (_discounts)
            gamma = gamma.reshape(rows)
        if value is not None and value.dtype == reward.dtype == next_value.dtype and value.shape == reward.shape:
            # the tensors as they are (rows=, no view op), the advantage from the same launch
            return F.returns_with_advantages(
                reward, value, terminated, every_step, gamma=gamma, lambda_=0.0, next_values=next_value,
                bootstrap_values=next_value, rows=rows,
            )  # fmt: skip
        nv = as_float(next_value, dtype).reshape(rows)
        r = as_float(reward, dtype).reshape(rows)
        out = F.compute_lambda_returns(
            r, nv, terminated.reshape(rows), every_step, gamma=gamma, lambda_=0.0, bootstrap_values=nv
        )
        return out.view(reward.shape)

    def _all_steps(self, shape, device) -> torch.Tensor:
        """An all-True bool tensor of ``shape`` (every step a boundary), kept for the next call of the
        same shape: it is only ever read, and allocating it (a fill kernel) would cost each call a
        launch. Tensors made in inference mode are kept apart (they cannot be saved for backward), and
        so are CUDA streams (a call on another stream must not read it before its fill has run)."""
        if is_compiling():  # a constant of the compiled graph: no cache to key
            return torch.ones(shape, dtype=torch.bool, device=device)
        stream = torch._C._cuda_getCurrentRawStream(device.index or 0) if device.type == "cuda" else None
        key = (shape, device, torch.is_inference_mode_enabled(), stream)
        hit = self.__dict__.get("_rlt_all_steps")
        if hit is not None and hit[0] == key:
            return hit[1]
        ones = torch.ones(shape, dtype=torch.bool, device=device)
        self.__dict__["_rlt_all_steps"] = (key, ones)
        return ones


# --------------------------------------------------------------------------------------------
# TD(1)


class TD1Estimator(_RLTritonEstimator, _trl.TD1Estimator):
    """TD(1) (Monte-Carlo, bootstrapped at cuts) targets, rl_triton-backed.

    Replaces :class:`torchrl.objectives.value.TD1Estimator`; same constructor, keys and outputs::

        from rl_triton.modules import TD1Estimator   # instead of torchrl.objectives.value

    ``value_target`` is :func:`rl_triton.compute_discounted_returns` with ``terminateds=terminated``,
    ``truncateds=done`` and ``bootstrap_values=V(s')``: the discounted return restarts at every done
    step, bootstraps from ``V(s')`` at done-but-not-terminated steps and at the last step.

    A tensor ``gamma`` (or ``steps_to_next_obs``) is a per-step discount (gamma_t of each step). Falls back to
    TorchRL's ``vec_td1_return_estimate`` for a grad-requiring or non-broadcasting ``gamma``, ``gamma``
    outside [0, 1] or mismatched shapes.
    """

    _SCALAR_BUFFERS = ("gamma",)

    @copy_signature(_trl.TD1Estimator.__init__)
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._prime_scalars(gamma=kwargs.get("gamma"))

    def forward(self, *args, params=None, target_params=None, **kwargs):
        """Computes the TD(1) advantage and target (see :class:`torchrl.objectives.value.TD1Estimator`).

        ``est(tensordict)`` without a value network takes the fast path in the common case
        (:meth:`_fast_inputs`); everything else TorchRL's decorated forward (:meth:`_forward`)."""
        return self._fast_or_general(args, kwargs, params, target_params)

    _FAST_HOOKS = _TD_HOOKS

    def _fast_scalars(self):
        return self._td_scalars("gamma")

    def _fast_targets(self, tensordict, value, next_value, reward, done, terminated, rows, scalars):
        value_target, advantage = F.returns_with_advantages(  # compute_discounted_returns, and G - V
            reward, value, terminated, done, gamma=scalars[0], lambda_=1.0, bootstrap_values=next_value, rows=rows
        )
        return _in_shape_of(value, (advantage, value_target))

    @_self_set_skip_existing
    @_self_set_grad_enabled
    @dispatch
    def _forward(self, tensordict, *, params=None, target_params=None):
        """TorchRL's TD(1) forward, rl_triton-backed (every case :meth:`forward` does not take faster)."""
        return self._td_forward(tensordict, params, target_params)

    def value_estimate(self, tensordict, target_params=None, next_value=None, time_dim=None, **kwargs):
        steps, next_value, time_dim, reward, done, terminated = self._td_inputs(
            tensordict, target_params, next_value, time_dim, kwargs, eps=1e-5
        )
        shapes_ok = same_shapes(next_value, reward, done, terminated)
        got = self._discounts(("gamma",), reward, time_dim, steps, reward) if shapes_ok else None
        if got is None:
            return _trl_fn.vec_td1_return_estimate(
                self._torchrl_gamma(reward, steps),
                next_value,
                reward,
                done=done,
                terminated=terminated,
                time_dim=time_dim,
            )
        (gamma,) = got
        return _on_rows(
            lambda r, nv, term, dn: F.compute_discounted_returns(r, term, dn, gamma=gamma, bootstrap_values=nv),
            [reward, next_value],
            [terminated, done],
            time_dim,
            1,
        )


# --------------------------------------------------------------------------------------------
# TD(lambda)


class TDLambdaEstimator(_RLTritonEstimator, _trl.TDLambdaEstimator):
    """TD(lambda) targets, rl_triton-backed.

    Replaces :class:`torchrl.objectives.value.TDLambdaEstimator`; same constructor, keys and
    outputs::

        from rl_triton.modules import TDLambdaEstimator   # instead of torchrl.objectives.value

    ``value_target`` is :func:`rl_triton.compute_lambda_returns` with ``next_values=V(s')``,
    ``terminateds=terminated``, ``truncateds=done`` and ``bootstrap_values=V(s')``. The
    ``vectorized`` flag is accepted but has no effect (both TorchRL paths compute the same numbers).

    Tensor ``gamma``/``lmbda`` (and ``steps_to_next_obs``) are per-step values (gamma_t, lambda_t of each
    step), as TorchRL's ``td_lambda_return_estimate`` reads them; TorchRL's vectorized form takes a tensor
    ``lmbda`` or a per-env ``gamma`` only with ``vectorized=False``, this class with either. Falls back to
    TorchRL's ``vec_td_lambda_return_estimate`` / ``td_lambda_return_estimate`` for a grad-requiring or
    non-broadcasting ``gamma``/``lmbda``, values outside [0, 1] or mismatched shapes.
    """

    _SCALAR_BUFFERS = ("gamma", "lmbda")

    @copy_signature(_trl.TDLambdaEstimator.__init__)
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._prime_scalars(gamma=kwargs.get("gamma"), lmbda=kwargs.get("lmbda"))

    def forward(self, *args, params=None, target_params=None, **kwargs):
        """Computes the TD(lambda) advantage and target (see :class:`torchrl.objectives.value.TDLambdaEstimator`).

        ``est(tensordict)`` without a value network takes the fast path in the common case
        (:meth:`_fast_inputs`); everything else TorchRL's decorated forward (:meth:`_forward`)."""
        return self._fast_or_general(args, kwargs, params, target_params)

    _FAST_HOOKS = _TD_HOOKS

    def _fast_scalars(self):
        return self._td_scalars("gamma", "lmbda")

    def _fast_targets(self, tensordict, value, next_value, reward, done, terminated, rows, scalars):
        gamma, lmbda = scalars
        value_target, advantage = F.returns_with_advantages(  # compute_lambda_returns, and G - V
            reward, value, terminated, done, gamma=gamma, lambda_=lmbda, next_values=next_value,
            bootstrap_values=next_value, rows=rows,
        )  # fmt: skip
        return _in_shape_of(value, (advantage, value_target))

    @_self_set_skip_existing
    @_self_set_grad_enabled
    @dispatch
    def _forward(self, tensordict, *, params=None, target_params=None):
        """TorchRL's TD(lambda) forward, rl_triton-backed (every case :meth:`forward` does not take faster)."""
        return self._td_forward(tensordict, params, target_params)

    def value_estimate(self, tensordict, target_params=None, next_value=None, time_dim=None, **kwargs):
        steps, next_value, time_dim, reward, done, terminated = self._td_inputs(
            tensordict, target_params, next_value, time_dim, kwargs, eps=1e-4
        )
        shapes_ok = same_shapes(next_value, reward, done, terminated)
        got = self._discounts(("gamma", "lmbda"), reward, time_dim, steps, reward) if shapes_ok else None
        if got is None:
            fn = _trl_fn.vec_td_lambda_return_estimate if self.vectorized else _trl_fn.td_lambda_return_estimate
            return fn(
                self._torchrl_gamma(reward, steps),
                _buffer_on(self.lmbda, reward.device),
                next_value,
                reward,
                done=done,
                terminated=terminated,
                time_dim=time_dim,
            )
        gamma, lmbda = got
        return _on_rows(
            lambda r, nv, term, dn: F.compute_lambda_returns(
                r, nv, term, dn, gamma=gamma, lambda_=lmbda, bootstrap_values=nv
            ),
            [reward, next_value],
            [terminated, done],
            time_dim,
            1,
        )


# --------------------------------------------------------------------------------------------
# GAE


class GAE(_RLTritonEstimator, _trl.GAE):
    """Generalized Advantage Estimation, rl_triton-backed.

    Replaces :class:`torchrl.objectives.value.GAE`; same constructor (``gamma``, ``lmbda``,
    ``value_network``, ``average_gae``, ``shifted``, ``time_dim``, ``auto_reset_env``, ...), keys
    and outputs (``advantage``, ``value_target``, and ``state_value`` / ``("next", "state_value")``
    when a value network is called)::

        from rl_triton.modules import GAE   # instead of torchrl.objectives.value

    The recursion is rl_triton's TorchRL-form GAE: ``V(s')`` read at every step,
    ``delta_t = r_t + gamma (1 - terminated_t) V(s'_t) - V(s_t)``,
    ``A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}``, ``value_target = A + V(s)``. The
    ``vectorized`` flag is accepted but has no effect.

    Tensor ``gamma``/``lmbda`` (and ``steps_to_next_obs``) are per-step values (gamma_t, lambda_t of each
    step), with TorchRL's numbers. Falls back to TorchRL's functional for a grad-requiring or
    non-broadcasting ``gamma``/``lmbda``, values outside [0, 1] or mismatched shapes.
    Deviation: with ``auto_reset_env=True`` the truncation bonus ``gamma * V(s) * truncated`` is
    always added (TorchRL first checks ``truncated.any()``, a host sync); the numbers are the same
    unless ``V(s)`` is not finite.
    """

    _SCALAR_BUFFERS = ("gamma", "lmbda")

    @copy_signature(_trl.GAE.__init__)
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._prime_scalars(gamma=kwargs.get("gamma"), lmbda=kwargs.get("lmbda"))

    def _gae(self, steps_reward, steps, value, next_value, reward, done, terminated, time_dim, vectorized=None):
        """(advantage, value_target). ``steps_reward`` is the un-broadcast reward that TorchRL shapes
        a per-step discount after."""
        shapes_ok = same_shapes(value, next_value, reward, done, terminated)
        got = self._discounts(("gamma", "lmbda"), value, time_dim, steps, steps_reward) if shapes_ok else None
        if got is None:
            vectorized = self.vectorized if vectorized is None else vectorized
            fn = _trl_fn.vec_generalized_advantage_estimate if vectorized else _trl_fn.generalized_advantage_estimate
            return fn(
                self._torchrl_gamma(steps_reward, steps),
                _buffer_on(self.lmbda, reward.device),
                value,
                next_value,
                reward,
                done=done,
                terminated=terminated,
                time_dim=time_dim,
            )
        gamma, lmbda = got
        return _on_rows(
            lambda r, v, nv, term, dn: F.gae_with_next_values(
                r, v, nv, term, dn, gamma=gamma, lambda_=lmbda, targets=True
            ),
            [reward, value, next_value],
            [terminated, done],
            time_dim,
            2,
        )

    def forward(self, *args, params=None, target_params=None, time_dim=None, **kwargs):
        """Computes GAE (see :class:`torchrl.objectives.value.GAE`); writes ``advantage`` and ``value_target``.

        Called as ``gae(tensordict)`` without a value network, the common case (values already in
        the tensordict, plain time-last or ``[..., T, 1]`` entries of one shape and float dtype, no
        per-step discount, no ``shifted_valid``, ``auto_reset_env`` off) takes :meth:`_fast_forward`;
        everything else TorchRL's decorated forward (:meth:`_forward`). Both give the same outputs.
        """
        if not is_compiling():
            return self._fast_or_general(args, kwargs, params, target_params, time_dim)
        if type(self)._forward is not GAE._forward:
            return self._forward(*args, params=params, target_params=target_params, time_dim=time_dim, **kwargs)
        # compiled: _forward's outer decorator (TorchRL's _self_set_skip_existing) done here, a frame fewer on the
        # stack at the graph break of TorchRL's NaN check (each frame there counts as one more break)
        run = GAE._decorated
        if self.skip_existing is not None:
            with set_skip_existing(self.skip_existing):
                return run(self, *args, params=params, target_params=target_params, time_dim=time_dim, **kwargs)
        return run(self, *args, params=params, target_params=target_params, time_dim=time_dim, **kwargs)

    # What GAE's forward calls that its fast path skips: a subclass overriding any of these keeps
    # the general path
    _FAST_HOOKS = (
        "_forward", "_values", "_signals", "_steps_to_next_obs", "_prepare_shifted_tensordict", "_mask_shifted_output",
        "_prepare_signals", "_gae", "_fast_forward", "_fast_inputs", "_fast_scalars", "_fast_targets",
        "_grad_mode_differs",
    )  # fmt: skip

    def _fast_scalars(self):
        if self.auto_reset_env:
            return None
        gamma, lmbda = self._scalar("gamma"), self._scalar("lmbda")
        if gamma is None or lmbda is None or not (0.0 <= gamma <= 1.0 and 0.0 <= lmbda <= 1.0):  # in_unit, inline
            return None
        return gamma, lmbda

    def _fast_targets(self, tensordict, value, next_value, reward, done, terminated, rows, scalars):
        gamma, lmbda = scalars
        adv, value_target = _in_shape_of(
            value,
            F.gae_with_next_values(
                reward,
                value,
                next_value,
                terminated,
                done,
                gamma=gamma,
                lambda_=lmbda,
                targets=True,  # value_target = adv + value from the same launch, bit for bit
                rows=rows,
            ),
        )
        if self.average_gae:
            adv = self._normalize_advantage(adv, None, groups=self._group_ids(tensordict))
        return adv, value_target

    def _gae_forward(self, tensordict, *, params=None, target_params=None, time_dim=None):
        """TorchRL's GAE forward, rl_triton-backed (every case :meth:`forward` does not take faster)."""
        if tensordict.batch_dims < 1:
            raise RuntimeError(
                "Expected input tensordict to have at least one dimension, got "
                f"tensordict.batch_size = {tensordict.batch_size}"
            )
        steps_reward = tensordict.get(("next", self.tensor_keys.reward))
        steps = self._steps_to_next_obs(tensordict)
        if self.value_network is None:
            value, next_value = self._stored_values(tensordict)
        else:  # _values, spelled out
            held, call = self._net_call(tensordict, params, target_params, False)
            with hold_out_net(self.value_network) if held else nullcontext():
                value, next_value, valid = self._call_value_nets(**call)
            if valid is not None:
                tensordict.set("shifted_valid", valid)
        time_dim = self._get_time_dim(time_dim, tensordict)
        valid = tensordict.get("shifted_valid", default=None)
        data_for_value = self._prepare_shifted_tensordict(tensordict, valid, time_dim)
        reward, done, terminated = self._signals(data_for_value)
        reward, done, terminated = self._prepare_signals(reward, done, terminated, value)
        if self.auto_reset_env:
            truncated = self._broadcast_optional(tensordict.get(("next", "truncated")), value)
            gamma = self._scalar("gamma")
            if steps is not None or gamma is None:
                gamma = self._torchrl_gamma(steps_reward, steps)
            # TorchRL adds this only when truncated.any(), a host sync; adding zeros is the same
            reward = reward + gamma * value * truncated
            terminated = done
        adv, value_target = self._gae(steps_reward, steps, value, next_value, reward, done, terminated, time_dim)
        if self.average_gae:
            adv = self._normalize_advantage(adv, valid, groups=self._group_ids(tensordict))
        tensordict.set(self.tensor_keys.advantage, adv)
        tensordict.set(self.tensor_keys.value_target, value_target)
        self._mask_shifted_output(tensordict, valid)
        return tensordict

    _decorated = _self_set_grad_enabled(dispatch(_gae_forward))
    _forward = _self_set_skip_existing(_decorated)

    def value_estimate(self, tensordict, params=None, target_params=None, time_dim=None, **kwargs):
        """The GAE value target ``A + V(s)`` (see :meth:`torchrl.objectives.value.GAE.value_estimate`)."""
        if tensordict.batch_dims < 1:
            raise RuntimeError(
                "Expected input tensordict to have at least one dimensions, got"
                f"tensordict.batch_size = {tensordict.batch_size}"
            )
        steps_reward = tensordict.get(("next", self.tensor_keys.reward))
        steps = self._steps_to_next_obs(tensordict)
        time_dim = self._get_time_dim(time_dim, tensordict)
        if self.is_stateless and params is None:
            raise RuntimeError("Expected params to be passed to advantage module but got none.")
        value, next_value = self._values(tensordict, params, target_params)
        valid = tensordict.get("shifted_valid", default=None)
        data_for_value = self._prepare_shifted_tensordict(tensordict, valid, time_dim)
        reward, done, terminated = self._signals(data_for_value)
        reward, done, terminated = self._prepare_signals(reward, done, terminated, value)
        _, value_target = self._gae(
            steps_reward, steps, value, next_value, reward, done, terminated, time_dim, vectorized=True
        )
        return value_target


class MultiAgentGAE(_trl.MultiAgentGAE, GAE):
    """Multi-agent GAE, rl_triton-backed.

    Replaces :class:`torchrl.objectives.value.MultiAgentGAE`; same constructor (``agent_dim`` plus
    :class:`GAE`'s arguments), keys and outputs::

        from rl_triton.modules import MultiAgentGAE   # instead of torchrl.objectives.value

    Team-level reward/done/terminated (``[*B, T, 1]``) are broadcast over the agent dim of the
    per-agent values (``[*B, T, n_agents, 1]``) exactly as TorchRL does; the broadcast signals are
    materialised once for the kernel (N = batch x agents rows). Per-agent advantage standardisation
    (``average_gae``) is TorchRL's. Same fallbacks as :class:`GAE`.
    """

    # TorchRL's broadcast of team signals (_prepare_signals) is a no-op for the same-shape entries
    # the fast path takes, so this class is the reference its subclasses are checked against
    _FAST_HOOKS = GAE._FAST_HOOKS


# --------------------------------------------------------------------------------------------
# V-trace


# rl_triton's ``vtrace_with_next_values`` bootstraps the advantage from ``next_values_t + D_{t+1}``
# where TorchRL (and docs/semantics.md's vs_{t+1}) use ``values_{t+1} + D_{t+1}``; the two differ
# whenever V(s'_t) != V(s_{t+1}) (target parameters, stochastic value nets). Until the kernel reads
# ``values_{t+1}`` there, the advantage is formed here from the kernel's ``vs``. Set to True once it does.
_KERNEL_VTRACE_ADVANTAGE = True


def _vtrace_rows(lpi, lmu, v, nv, r, term, dn, gamma, rho_bar, c_bar):
    """(vs, advantages) on ``(N, T)`` rows, in TorchRL's form."""
    vs, adv = F.vtrace_with_next_values(lpi, lmu, v, nv, r, term, dn, gamma=gamma, rho_bar=rho_bar, c_bar=c_bar)
    if _KERNEL_VTRACE_ADVANTAGE:
        return vs, adv
    done = dn if dn.dtype == torch.bool else dn != 0
    not_term = (term == 0).to(v.dtype)
    vs_next = torch.where(done, nv, torch.cat([vs[:, 1:], nv[:, -1:]], dim=1))
    rho = (lpi - lmu).exp().clamp_max(rho_bar)
    return vs, rho * (r + gamma * not_term * vs_next - v)


class VTrace(_RLTritonEstimator, _trl.VTrace):
    """V-trace (IMPALA) targets and advantages, rl_triton-backed.

    Replaces :class:`torchrl.objectives.value.VTrace`; same constructor (``gamma``,
    ``actor_network``, ``value_network``, ``rho_thresh``, ``c_thresh``, ``average_adv``, ...), keys
    and outputs (``advantage``: the policy-gradient advantage ``rho_t (r_t + gamma (1 - term_t)
    vs_{t+1} - V(s_t))``; ``value_target``: the V-trace target ``vs``)::

        from rl_triton.modules import VTrace   # instead of torchrl.objectives.value

    The recursion is :func:`rl_triton.functional.vtrace_with_next_values` (``V(s')`` at every step,
    ``done`` cuts the trace, ``terminated`` zeroes the bootstrap).

    Deviation (a fix): TorchRL 0.14 evaluates log pi on an action *drawn from* (or the mode of) the
    current actor's distribution, not on the action stored in the batch, so its importance ratio
    ``rho = pi(a)/mu(a)`` compares two different actions. This class scores the stored action:
    ``log pi = actor_network.get_dist(td).log_prob(td[action])`` (``action`` is a new settable key,
    default ``"action"``; composite distributions are scored on the whole tensordict with
    log-probabilities summed over heads; per-dimension log-probabilities are summed over the
    trailing dims). ``log mu`` is read from the ``sample_log_prob`` key as in TorchRL. The actor is
    held out of the graph (no gradient), as in TorchRL. ``in_keys`` additionally lists the action; a
    tensordict without it raises :class:`~rl_triton.modules.MissingEntryError`.

    A ``steps_to_next_obs`` entry gives the per-step discount ``gamma ** steps`` (TorchRL's constructor takes
    a scalar ``gamma`` only). Falls back to TorchRL's ``vtrace_advantage_estimate`` (with the stored-action
    log pi) for non-scalar thresholds, ``gamma`` outside [0, 1] or mismatched shapes.
    """

    _SCALAR_BUFFERS = ("gamma", "rho_thresh", "c_thresh")

    @expose_inherited_keys
    @dataclass
    class _AcceptedKeys(_trl.VTrace._AcceptedKeys):
        """TorchRL's keys plus ``action``: the stored action that the target policy scores."""

        action: NestedKey = "action"

    default_keys = _AcceptedKeys

    @copy_signature(_trl.VTrace.__init__)
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._prime_scalars(
            gamma=kwargs.get("gamma"), rho_thresh=kwargs.get("rho_thresh", 1.0), c_thresh=kwargs.get("c_thresh", 1.0)
        )

    @classmethod
    def for_loss(cls, loss_module, **hyperparams):
        """TorchRL's wiring (critic + actor), plus the loss's action key when it has one."""
        estimator = super().for_loss(loss_module, **hyperparams)
        keys = getattr(loss_module, "tensor_keys", None)
        action = getattr(keys, "action", None) if keys is not None else None
        if isinstance(action, (str, tuple)):
            estimator.set_keys(action=action)
        return estimator

    @property
    def in_keys(self):
        keys = super().in_keys
        if self.tensor_keys.action not in keys:
            keys = keys + [self.tensor_keys.action]
        return keys

    def _log_pi(self, tensordict, value):
        """log pi(a_t | s_t) of the stored action under the current actor, shaped like ``value``."""
        actor = self.actor_network
        with hold_out_net(actor), set_composite_lp_aggregate(True):
            dist = actor.get_dist(tensordict.select(*actor.in_keys, strict=False))
            if isinstance(dist, CompositeDistribution):
                log_pi = dist.log_prob(tensordict)
            else:
                action = _maybe_get_or_select(tensordict, self.tensor_keys.action)
                if action is None:
                    raise missing_entry(self, self.tensor_keys.action, _ROLES["action"], "action")
                log_pi = dist.log_prob(action)
        if is_tensor_collection(log_pi):
            log_pi = log_pi.sum(dim="feature", reduce=True)
        if log_pi.numel() != value.numel() and log_pi.ndim > tensordict.ndim:
            log_pi = log_pi.flatten(tensordict.ndim, -1).sum(-1)
        return log_pi.reshape(value.shape)

    @_self_set_skip_existing
    @_self_set_grad_enabled
    @dispatch
    def forward(self, tensordict, *, params=None, target_params=None, time_dim=None):
        """Computes V-trace (see :class:`torchrl.objectives.value.VTrace`); writes ``advantage``, ``value_target``."""
        if tensordict.batch_dims < 1:
            raise RuntimeError(
                "Expected input tensordict to have at least one dimensions, got "
                f"tensordict.batch_size = {tensordict.batch_size}"
            )
        steps = self._steps_to_next_obs(tensordict)
        steps_reward = self._entry(tensordict, ("next", self.tensor_keys.reward), "reward")
        if self.value_network is None:
            value, next_value = self._stored_values(tensordict)
        else:  # _values, spelled out
            held, call = self._net_call(tensordict, params, target_params, True)
            with hold_out_net(self.value_network) if held else nullcontext():
                value, next_value, valid = self._call_value_nets(**call)
            if valid is not None:
                tensordict.set("shifted_valid", valid)

        lp = _maybe_get_or_select(tensordict, self.tensor_keys.sample_log_prob)
        if lp is None:
            raise missing_entry(self, self.tensor_keys.sample_log_prob, _ROLES["sample_log_prob"], "sample_log_prob")
        if is_tensor_collection(lp):
            lp = lp.sum(dim="feature", reduce=True)
        log_mu = lp.view_as(value)
        log_pi = self._log_pi(tensordict, value)

        time_dim = self._get_time_dim(time_dim, tensordict)
        valid = tensordict.get("shifted_valid", default=None)
        data_for_value = self._prepare_shifted_tensordict(tensordict, valid, time_dim)
        reward, done, terminated = self._signals(data_for_value)

        rho, c = self._scalars("rho_thresh", "c_thresh")
        got = None
        if non_negative(rho, c) and same_shapes(value, next_value, reward, done, terminated, log_pi, log_mu):
            got = self._discounts(("gamma",), value, time_dim, steps, steps_reward)
        if got is None:
            adv, value_target = _trl_fn.vtrace_advantage_estimate(
                self._torchrl_gamma(steps_reward, steps),
                log_pi,
                log_mu,
                value,
                next_value,
                reward,
                done,
                terminated,
                rho_thresh=self.rho_thresh,
                c_thresh=self.c_thresh,
                time_dim=time_dim,
            )
        else:
            (gamma,) = got
            value_target, adv = _on_rows(
                lambda lpi, lmu, v, nv, r, term, dn: _vtrace_rows(lpi, lmu, v, nv, r, term, dn, gamma, rho, c),
                [log_pi, log_mu, value, next_value, reward],
                [terminated, done],
                time_dim,
                2,
            )

        if self.average_adv:
            groups = self._group_ids(tensordict)
            if groups is None:
                adv = (adv - adv.mean()) / adv.std().clamp_min(1e-5)
            else:
                adv = _trl._standardize_by_group(adv, groups, eps=1e-5)
        tensordict.set(self.tensor_keys.advantage, adv)
        tensordict.set(self.tensor_keys.value_target, value_target)
        self._mask_shifted_output(tensordict, valid)
        return tensordict
