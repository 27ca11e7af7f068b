"""TD(0), TD(1) and TD(lambda) value estimators whose recursion runs in rl_triton.

What they keep from TorchRL, the ``(N, T)`` view of the data, per-step discounts and the fallbacks to
TorchRL's functional: :mod:`rl_triton.modules._base`.
"""

from __future__ import annotations

import math

import torch
from tensordict.nn import dispatch
from torch.compiler import is_compiling
from torchrl.objectives.value import advantages as _trl
from torchrl.objectives.value import functional as _trl_fn
from torchrl.objectives.value.advantages import _self_set_grad_enabled, _self_set_skip_existing

from .. import functional as F
from .._discounts import in_unit
from ._base import ROLES, RLTritonEstimator, buffer_on, in_shape_of, no_batch_dims, no_params, on_rows
from ._common import as_float, common_float_dtype, copy_signature, missing_entry, same_shapes
from ._registry import torchrl_estimator

__all__ = ["TD0Estimator", "TD1Estimator", "TDLambdaEstimator"]

_TD0_ROW = 64  # row length of the flat TD(0) layout
# What a TD estimator's forward calls that its fast path skips (see _base._stock)
_TD_HOOKS = (
    "_forward", "_td_forward", "_td_inputs", "value_estimate", "_values", "_signals", "_steps_to_next_obs",
    "_prepare_shifted_tensordict", "_mask_shifted_output", "_fast_forward", "_fast_inputs", "_fast_scalars",
    "_fast_targets", "_grad_mode_differs",
)  # fmt: skip


class _TDEstimator(RLTritonEstimator):
    """What the three TD estimators share: the forward pass (fast or TorchRL's general one) and the inputs of
    ``value_estimate``."""

    def forward(self, *args, params=None, target_params=None, **kwargs):
        """Computes the advantage and value target of TorchRL's estimator of the same name.

        ``est(tensordict)`` without a value network takes the fast path in the common case
        (:meth:`_fast_inputs`); everything else TorchRL's decorated forward (:meth:`_forward`)."""
        return self._fast_or_general(args, kwargs, params, target_params)

    @_self_set_skip_existing
    @_self_set_grad_enabled
    @dispatch
    def _forward(self, tensordict, *, params=None, target_params=None):
        """TorchRL's TD forward, rl_triton-backed (every case :meth:`forward` does not take faster)."""
        return self._td_forward(tensordict, params, target_params)

    def _td_forward(self, tensordict, params, target_params):
        """The general forward pass (value_target from :meth:`value_estimate`)."""
        if tensordict.batch_dims < 1:
            raise no_batch_dims(tensordict)
        if self.is_stateless and params is None:
            raise no_params()
        value, next_value = self._values(tensordict, params, target_params)
        valid = tensordict.get("shifted_valid", default=None)
        data_for_value = self._prepare_shifted_tensordict(tensordict, valid, self._get_time_dim(None, tensordict))
        value_target = self.value_estimate(data_for_value, next_value=next_value)
        tensordict.set(self.tensor_keys.advantage, value_target - value)
        tensordict.set(self.tensor_keys.value_target, value_target)
        self._mask_shifted_output(tensordict, valid)
        return tensordict

    def _td_scalars(self, *names) -> tuple | None:
        """The fast-path condition: scalar ``names`` in [0, 1], no reward standardisation and no functional
        value network."""
        if self.average_rewards or self.is_stateless:
            return None
        values = tuple(self._scalar(name) for name in names)
        return values if in_unit(*values) else None

    def _next_state_value(self, tensordict, target_params, next_value, kwargs):
        """V(s') as TorchRL's TD ``value_estimate`` gets it: given, from the value network, or read."""
        if next_value is None:
            next_value = self._next_value(tensordict, target_params, kwargs=kwargs)
            if next_value is None:
                raise missing_entry(self, ("next", self.tensor_keys.value), ROLES["value"], "value")
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

    def _standardize_rewards(self, tensordict, reward, eps):
        reward = self._standardized(reward, tensordict, eps, centre_first=True)
        # written back, as TorchRL does, for code that reads the rewards later
        tensordict.set(("next", self.tensor_keys.reward), reward)
        return reward


# --------------------------------------------------------------------------------------------
# TD(0)


@torchrl_estimator("TD0")
class TD0Estimator(_TDEstimator, _trl.TD0Estimator):
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

    _FAST_ROWS = False  # elementwise: no time dim
    _FAST_HOOKS = _TD_HOOKS + ("_td0_rows", "_all_steps")

    def _fast_scalars(self):
        return self._td_scalars("gamma")

    def _fast_targets(self, tensordict, value, next_value, reward, done, terminated, rows, scalars):
        value_target, advantage = self._td0_rows(reward, next_value, terminated, scalars[0], value)
        return in_shape_of(value, (advantage, value_target))

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
            raise missing_entry(self, ("next", self.tensor_keys.done), ROLES["done"], "done")
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


@torchrl_estimator("TD1")
class TD1Estimator(_TDEstimator, _trl.TD1Estimator):
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

    _FAST_HOOKS = _TD_HOOKS

    def _fast_scalars(self):
        return self._td_scalars("gamma")

    def _fast_targets(self, tensordict, value, next_value, reward, done, terminated, rows, scalars):
        value_target, advantage = F.returns_with_advantages(  # compute_discounted_returns, and G - V
            reward, value, terminated, done, gamma=scalars[0], lambda_=1.0, bootstrap_values=next_value, rows=rows
        )
        return in_shape_of(value, (advantage, value_target))

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
        return on_rows(
            lambda r, nv, term, dn: F.compute_discounted_returns(r, term, dn, gamma=gamma, bootstrap_values=nv),
            [reward, next_value],
            [terminated, done],
            time_dim,
            1,
        )


# --------------------------------------------------------------------------------------------
# TD(lambda)


@torchrl_estimator("TDLambda")
class TDLambdaEstimator(_TDEstimator, _trl.TDLambdaEstimator):
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

    _FAST_HOOKS = _TD_HOOKS

    def _fast_scalars(self):
        return self._td_scalars("gamma", "lmbda")

    def _fast_targets(self, tensordict, value, next_value, reward, done, terminated, rows, scalars):
        gamma, lmbda = scalars
        value_target, advantage = F.returns_with_advantages(  # compute_lambda_returns, and G - V
            reward, value, terminated, done, gamma=gamma, lambda_=lmbda, next_values=next_value,
            bootstrap_values=next_value, rows=rows,
        )  # fmt: skip
        return in_shape_of(value, (advantage, value_target))

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
                buffer_on(self.lmbda, reward.device),
                next_value,
                reward,
                done=done,
                terminated=terminated,
                time_dim=time_dim,
            )
        gamma, lmbda = got
        return on_rows(
            lambda r, nv, term, dn: F.compute_lambda_returns(
                r, nv, term, dn, gamma=gamma, lambda_=lmbda, bootstrap_values=nv
            ),
            [reward, next_value],
            [terminated, done],
            time_dim,
            1,
        )
