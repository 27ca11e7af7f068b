"""Retrace(lambda) as a TorchRL value estimator (TorchRL has none)."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase, is_tensor_collection
from tensordict.nn import TensorDictModule, dispatch
from tensordict.utils import NestedKey, unravel_key
from torchrl.objectives.utils import hold_out_net
from torchrl.objectives.value.advantages import ValueEstimatorBase, _self_set_grad_enabled, _self_set_skip_existing

from .. import functional as F
from .._discounts import check_values, in_unit, out_of_range
from ._base import RLTritonEstimator, no_batch_dims
from ._common import (
    axis,
    common_float_dtype,
    discount_rows,
    expose_inherited_keys,
    missing_entry,
    non_negative,
    to_rows,
    to_rows_actions,
)

__all__ = ["Retrace"]

_LOG_PROB_DEFAULTS = ("sample_log_prob", "action_log_prob")


class Retrace(RLTritonEstimator, ValueEstimatorBase):
    r"""Retrace(lambda) Q-value targets and advantages for discrete actions (Munos et al., 2016).

    A new estimator (TorchRL 0.14 has no Retrace); a :class:`~torchrl.objectives.value.ValueEstimatorBase`
    subclass, so ``set_keys``, ``in_keys``/``out_keys``, ``skip_existing``, ``differentiable``,
    ``time_dim`` and the keyword call form work as for TorchRL's estimators::

        from rl_triton.modules import Retrace
        retrace = Retrace(gamma=0.99, lmbda=1.0, c_bar=1.0, rho_bar=1.0)
        retrace(rollout)   # writes "value_target" and "advantage"

    With ``a_t`` the stored action, ``pi`` the target policy and ``mu`` the behaviour policy
    (:func:`rl_triton.compute_retrace`)::

        ratio_t = pi(a_t | s_t) / mu(a_t | s_t)
        c_t = lambda * min(c_bar, ratio_t),   rho_t = min(rho_bar, ratio_t)
        E_t = sum_a pi'(a) Q(s_{t+1}, a)     pi' = pi(. | s_{t+1}) if available, else pi(. | s_t)
        delta_t = r_t + gamma (1 - terminated_t) E_t - Q(s_t, a_t)
        Delta_t = delta_t + gamma c_{t+1} (1 - done_t) Delta_{t+1},   c_T = 0, Delta_T = 0
        value_target_t = Q(s_t, a_t) + Delta_t
        X_t = E_t if (truncated_t or t == T-1) else value_target_{t+1}
        advantage_t = rho_t (r_t + gamma (1 - terminated_t) X_t - Q(s_t, a_t))

    with ``done_t = terminated_t or truncated_t``. The trace never crosses an episode end; at a
    truncation and at the end of the window the target bootstraps from ``E_t``.

    Tensordict entries (keys settable with :meth:`set_keys`; batch ``[*B, T]``, time at
    ``time_dim``):

    * ``action_value`` (``"action_value"``): ``Q(s_t, .)``, ``[*B, T, A]``; and
      ``("next", action_value)``: ``Q(s_{t+1}, .)``, ``[*B, T, A]``. Read from the tensordict, or
      computed by ``value_network`` (a Q-network writing ``action_value``; ``target_params`` give
      the next-state values, as in TorchRL's estimators).
    * ``target_probs`` (``"target_probs"``): ``pi(. | s_t)``, ``[*B, T, A]``, or computed from
      ``actor_network``'s distribution (``.probs``). ``("next", target_probs)``, if present (or
      computable by the actor from the ``"next"`` entries), gives ``pi(. | s_{t+1})`` for ``E_t``.
    * ``sample_log_prob`` (``"sample_log_prob"``): ``log mu(a_t | s_t)`` of the stored action,
      ``[*B, T]`` or ``[*B, T, 1]``. If the configured key is one of TorchRL's two default names
      (``"sample_log_prob"``, ``"action_log_prob"``, which TorchRL 0.14 actors write by default)
      and is absent, the other one is read.
    * ``action`` (``"action"``): the stored action, an index ``[*B, T]`` (or ``[*B, T, 1]``) or a
      one-hot ``[*B, T, A]``.
    * ``("next", reward | done | terminated | truncated)``: ``[*B, T]`` or ``[*B, T, 1]``.
      ``truncated`` defaults to ``done & ~terminated`` (or all False without ``done``); when both
      are present a step counts as truncated if either says so (and it is not terminated).

    Outputs ``value_target`` and ``advantage`` have the reward's shape. Probabilities are constants
    for autograd; with ``differentiable=True`` gradients flow to the action values and rewards.

    Keyword Args:
        gamma (float or Tensor): discount in [0, 1]; a tensor that broadcasts against the reward entry
            (e.g. ``[*B, T, 1]`` per step or ``[*B, 1, 1]`` per env) gives gamma_t per step.
        lmbda (float or Tensor): trace decay lambda in [0, 1], a float or a tensor like ``gamma``
            (``c_t`` uses ``lmbda_t``). Defaults to ``1.0``.
        c_bar (float): trace clipping threshold (>= 0). Defaults to ``1.0``.
        rho_bar (float): advantage clipping threshold (>= 0). Defaults to ``1.0``.
        value_network (TensorDictModule, optional): Q-network writing ``action_value``.
        actor_network (ProbabilisticTensorDictModule, optional): target policy, used when
            ``target_probs`` is not in the tensordict. Held out of the graph.
        average_adv (bool): standardise the advantage (within ``group_key`` groups if set).
        differentiable (bool): keep the graph. Defaults to ``False``.
        skip_existing (bool, optional): as in TorchRL's estimators.
        device (torch.device, optional): where the hyper-parameter buffers live.
        time_dim (int, optional): time dim of the tensordict (default: the dim named ``"time"``,
            else the last).
        deactivate_vmap (bool): call the value network without vmap.
        group_key (NestedKey, optional): group ids for ``average_adv``.

    Not supported: a per-step discount (``steps_to_next_obs``) raises ``NotImplementedError``;
    ``shifted`` value-network calls are not offered.
    """

    @expose_inherited_keys
    @dataclass
    class _AcceptedKeys(ValueEstimatorBase._AcceptedKeys):
        """TorchRL's estimator keys plus those of Retrace.

        Attributes:
            sample_log_prob: log mu(a | s) of the stored action (default ``"sample_log_prob"``).
            action_value: Q(s, .) for every action; ``("next", action_value)`` holds Q(s', .).
            target_probs: the target policy's probabilities pi(. | s).
            action: the stored action (index or one-hot).
            truncated: the truncation flag under ``"next"``.
        """

        sample_log_prob: NestedKey = "sample_log_prob"
        action_value: NestedKey = "action_value"
        target_probs: NestedKey = "target_probs"
        action: NestedKey = "action"
        truncated: NestedKey = "truncated"

    default_keys = _AcceptedKeys
    _SCALAR_BUFFERS = ("gamma", "lmbda", "c_bar", "rho_bar")

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        lmbda: float | torch.Tensor = 1.0,
        c_bar: float | torch.Tensor = 1.0,
        rho_bar: float | torch.Tensor = 1.0,
        value_network: TensorDictModule | None = None,
        actor_network: TensorDictModule | None = None,
        average_adv: bool = False,
        differentiable: bool = False,
        skip_existing: bool | None = None,
        device: torch.device | None = None,
        time_dim: int | None = None,
        deactivate_vmap: bool = False,
        group_key: NestedKey | None = None,
    ):
        super().__init__(
            value_network=value_network,
            differentiable=differentiable,
            skip_existing=skip_existing,
            device=device,
            deactivate_vmap=deactivate_vmap,
            group_key=group_key,
        )
        scalars = {"gamma": gamma, "lmbda": lmbda, "c_bar": c_bar, "rho_bar": rho_bar}
        for name, value in scalars.items():
            if isinstance(value, torch.Tensor):
                buf = value.to(self._device)
            else:  # float64 so that the Python number reaches the kernels unrounded
                buf = torch.tensor(value, dtype=torch.float64, device=self._device)
            if buf.numel() != 1 and name not in ("gamma", "lmbda"):
                raise ValueError(f"Retrace: {name} must be a scalar, got a tensor of shape {tuple(buf.shape)}")
            self.register_buffer(name, buf)
        self._prime_scalars(**scalars)
        self._check_scalars()
        self.actor_network = actor_network
        self.average_adv = average_adv
        self.time_dim = time_dim

    def _check_scalars(self) -> tuple:
        """(gamma, lmbda, c_bar, rho_bar): floats, gamma and lmbda possibly tensors (their buffers, range
        checked on the CPU only: a GPU check would need a host sync)."""
        gamma, lmbda = self._scalar("gamma"), self._scalar("lmbda")
        c_bar, rho_bar = self._scalar("c_bar"), self._scalar("rho_bar")
        tensors = {}
        for name, value in (("gamma", gamma), ("lmbda", lmbda)):
            buf = self._buffers[name]
            if value is None and buf.numel() != 1 and not buf.requires_grad and buf.is_floating_point():
                check_values("Retrace", name, buf)
                tensors[name] = buf
            elif not in_unit(value):
                raise out_of_range("Retrace", name, value)
        gamma, lmbda = tensors.get("gamma", gamma), tensors.get("lmbda", lmbda)
        if not non_negative(c_bar, rho_bar):
            raise ValueError(f"Retrace: c_bar and rho_bar must be >= 0, got c_bar={c_bar}, rho_bar={rho_bar}")
        return gamma, lmbda, c_bar, rho_bar

    # ---------------------------------------------------------------------------- keys

    @property
    def in_keys(self):
        k = self.tensor_keys
        keys = []
        if self.value_network is not None and hasattr(self.value_network, "in_keys"):
            keys += list(self.value_network.in_keys) + [("next", key) for key in self.value_network.in_keys]
        else:
            keys += [k.action_value, ("next", k.action_value)]
        if self.actor_network is not None and hasattr(self.actor_network, "in_keys"):
            keys += list(self.actor_network.in_keys)
        else:
            keys += [k.target_probs, ("next", k.target_probs)]
        keys += [
            k.action,
            k.sample_log_prob,
            ("next", k.reward),
            ("next", k.done),
            ("next", k.terminated),
            ("next", k.truncated),
        ]
        if self.group_key is not None:
            keys.append(self.group_key)
        out = []
        for key in keys:
            key = unravel_key(key)
            if key not in out:
                out.append(key)
        return out

    @property
    def out_keys(self):
        return [self.tensor_keys.advantage, self.tensor_keys.value_target]

    # ---------------------------------------------------------------------------- inputs

    def _action_values(self, tensordict, params, target_params):
        key = self.tensor_keys.action_value
        if self.value_network is not None:
            if params is not None:
                params = params.detach()
                if target_params is None:
                    target_params = params.clone(False)
            held = params is None and target_params is None
            with hold_out_net(self.value_network) if held else nullcontext():
                q, next_q, _ = self._call_value_nets(
                    data=tensordict,
                    params=params,
                    next_params=target_params,
                    single_call=False,
                    value_key=key,
                    detach_next=True,
                    vmap_randomness=self.vmap_randomness,
                )
            return q, next_q
        hint = ", and no value_network was given"
        q = self._entry(tensordict, key, "action_value", "the action values Q(s, .)", hint)
        next_q = self._entry(tensordict, ("next", key), "action_value", "the action values Q(s', .)", hint)
        return q, next_q

    def _target_probs(self, tensordict, next_state: bool):
        key = self.tensor_keys.target_probs
        probs = tensordict.get(("next", key) if next_state else key, None)
        if probs is not None or self.actor_network is None:
            return probs
        source = tensordict.get("next", None) if next_state else tensordict
        if source is None:
            return None
        in_keys = list(getattr(self.actor_network, "in_keys", []))
        if next_state and any(source.get(k, None) is None for k in in_keys):
            return None
        with hold_out_net(self.actor_network), torch.no_grad():
            dist = self.actor_network.get_dist(source.select(*in_keys, strict=False))
        probs = getattr(dist, "probs", None)
        if probs is None:
            raise TypeError(
                f"Retrace: the actor's distribution {type(dist).__name__} has no 'probs'; Retrace needs a categorical "
                "target policy (or store the probabilities under the target_probs key)"
            )
        return probs

    def _behaviour_log_prob(self, tensordict):
        key = self.tensor_keys.sample_log_prob
        candidates = [key]
        if key in _LOG_PROB_DEFAULTS:
            candidates += [k for k in _LOG_PROB_DEFAULTS if k != key]
        for k in candidates:
            lp = tensordict.get(k, None)
            if lp is not None:
                if is_tensor_collection(lp):
                    lp = lp.sum(dim="feature", reduce=True)
                return lp
        raise missing_entry(self, key, "the behaviour policy's log-probability of the stored action", "sample_log_prob")

    @staticmethod
    def _action_index(action: torch.Tensor, batch_ndim: int, num_actions: int) -> torch.Tensor:
        if action.ndim == batch_ndim + 1:
            if action.shape[-1] == num_actions and (num_actions > 1 or action.dtype == torch.bool):
                return action.argmax(-1)  # one-hot
            if action.shape[-1] == 1:
                return action.squeeze(-1).long()
        if action.ndim == batch_ndim:
            return action.long()
        raise ValueError(
            "Retrace: the action must be an index of shape [*B, T] (or [*B, T, 1]) or a one-hot "
            f"[*B, T, {num_actions}], got shape {tuple(action.shape)}"
        )

    # ---------------------------------------------------------------------------- compute

    def _retrace(self, tensordict: TensorDictBase, params, target_params, time_dim) -> tuple:
        """(value_target, advantage) in the reward's shape, time at ``time_dim`` (TorchRL's rule)."""
        if tensordict.batch_dims < 1:
            raise no_batch_dims(tensordict)
        time_dim = axis(self._get_time_dim(time_dim, tensordict), tensordict.batch_dims)
        q_all, next_q_all = self._action_values(tensordict, params, target_params)
        if tensordict.get(self.tensor_keys.steps_to_next_obs, None) is not None:
            raise NotImplementedError("Retrace does not support a per-step discount (steps_to_next_obs)")
        gamma, lmbda, c_bar, rho_bar = self._check_scalars()
        batch = tensordict.batch_size
        nb = len(batch)
        for name, t in (("action_value", q_all), (("next", "action_value"), next_q_all)):
            if t.ndim != nb + 1 or t.shape[:nb] != batch:
                raise ValueError(
                    f"Retrace: {name!r} must have shape [*batch, num_actions] = {list(batch)} + [A], got "
                    f"{tuple(t.shape)}"
                )
        num_actions = q_all.shape[-1]
        k = self.tensor_keys

        def per_step(name, t):
            if t.numel() != batch.numel():
                raise ValueError(
                    f"Retrace: {name!r} must have the tensordict's batch shape {list(batch)} (optionally with a "
                    f"trailing 1), got {tuple(t.shape)}"
                )
            return t.reshape(batch)

        reward = self._entry(tensordict, ("next", k.reward), "reward")
        out_shape = reward.shape
        reward = per_step(("next", k.reward), reward)

        def per_step_discount(name, value):
            """A tensor gamma/lmbda broadcast against the reward entry (gamma_t of each step), as (N, T) rows."""
            if not isinstance(value, torch.Tensor):
                return value
            full = discount_rows(value.to(reward.device), out_shape, None)
            if full is None:
                raise ValueError(
                    f"Retrace: {name} of shape {tuple(value.shape)} does not broadcast to the reward's shape "
                    f"{tuple(out_shape)}"
                )
            return to_rows(full.reshape(batch), time_dim)

        gamma, lmbda = per_step_discount("gamma", gamma), per_step_discount("lmbda", lmbda)
        done = tensordict.get(("next", k.done), None)
        terminated = tensordict.get(("next", k.terminated), None)
        truncated = tensordict.get(("next", k.truncated), None)
        if terminated is None:
            terminated = done if done is not None else torch.zeros(batch, dtype=torch.bool, device=reward.device)
        terminated = per_step(("next", k.terminated), terminated).bool()
        if done is not None:
            cut = per_step(("next", k.done), done).bool() & ~terminated
            if truncated is not None:
                cut = cut | (per_step(("next", k.truncated), truncated).bool() & ~terminated)
            truncated = cut
        elif truncated is not None:
            truncated = per_step(("next", k.truncated), truncated).bool() & ~terminated
        else:
            truncated = torch.zeros_like(terminated)

        action = self._entry(tensordict, k.action, "action", "the stored action")
        action = self._action_index(action, nb, num_actions)
        q_taken = q_all.gather(-1, action.unsqueeze(-1)).squeeze(-1)
        mu = per_step(k.sample_log_prob, self._behaviour_log_prob(tensordict)).exp()

        pi = self._target_probs(tensordict, next_state=False)
        if pi is None:
            hint = ", and no actor_network was given"
            raise missing_entry(self, k.target_probs, "the target policy's probabilities", "target_probs", hint)
        next_pi = self._target_probs(tensordict, next_state=True)

        dtype = common_float_dtype(q_all, next_q_all, reward)
        cast = lambda t: None if t is None else (t if t.dtype == dtype else t.to(dtype))
        q_targets, adv = F.compute_retrace(
            to_rows_actions(cast(pi), time_dim),
            to_rows(cast(mu), time_dim),
            to_rows(cast(q_taken), time_dim),
            to_rows_actions(cast(next_q_all), time_dim),
            to_rows(action, time_dim),
            to_rows(cast(reward), time_dim),
            to_rows(terminated, time_dim),
            to_rows(truncated, time_dim),
            gamma=gamma,
            lambda_=lmbda,
            c_bar=c_bar,
            rho_bar=rho_bar,
            next_action_probs_target=None if next_pi is None else to_rows_actions(cast(next_pi), time_dim),
        )
        moved = tuple(batch[:time_dim]) + tuple(batch[time_dim + 1 :]) + (batch[time_dim],)

        def back(y):
            y = y.reshape(moved)
            if time_dim != nb - 1:
                y = y.movedim(-1, time_dim)
            return y.reshape(out_shape)

        return back(q_targets), back(adv)

    @_self_set_skip_existing
    @_self_set_grad_enabled
    @dispatch
    def forward(
        self,
        tensordict: TensorDictBase,
        *,
        params: TensorDictBase | None = None,
        target_params: TensorDictBase | None = None,
        time_dim: int | None = None,
    ) -> TensorDictBase:
        """Writes the Retrace targets (``value_target``) and advantages (``advantage``) into ``tensordict``.

        Args:
            tensordict: a ``[*B, T]`` rollout with the entries listed in the class docstring.

        Keyword Args:
            params, target_params: parameters for a functional ``value_network`` (the next-state
                action values use ``target_params``).
            time_dim: overrides the estimator's ``time_dim`` for this call.
        """
        value_target, adv = self._retrace(tensordict, params, target_params, time_dim)
        if self.average_adv:
            adv = self._standardized(adv, tensordict, 1e-5)
        tensordict.set(self.tensor_keys.advantage, adv)
        tensordict.set(self.tensor_keys.value_target, value_target)
        return tensordict

    def value_estimate(
        self,
        tensordict: TensorDictBase,
        params: TensorDictBase | None = None,
        target_params: TensorDictBase | None = None,
        time_dim: int | None = None,
        **kwargs,
    ) -> torch.Tensor:
        """The Retrace Q targets (``value_target``) alone, shaped like the reward."""
        return self._retrace(tensordict, params, target_params, time_dim)[0]
