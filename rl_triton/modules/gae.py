"""GAE and multi-agent GAE value estimators whose recursion runs in rl_triton.

What they keep from TorchRL, the ``(N, T)`` view of the data, per-step discounts and the fallbacks to
TorchRL's functional: :mod:`rl_triton.modules._base`.
"""

from __future__ import annotations

from contextlib import nullcontext

from tensordict.nn import dispatch
from torch.compiler import is_compiling
from torchrl.objectives.utils import hold_out_net
from torchrl.objectives.value import advantages as _trl
from torchrl.objectives.value import functional as _trl_fn
from torchrl.objectives.value.advantages import _self_set_grad_enabled, _self_set_skip_existing, set_skip_existing

from .. import functional as F
from .._discounts import in_unit
from ._base import RLTritonEstimator, buffer_on, in_shape_of, no_batch_dims, no_params, on_rows
from ._common import copy_signature, same_shapes
from ._registry import torchrl_estimator

__all__ = ["GAE", "MultiAgentGAE"]


@torchrl_estimator("GAE")
class GAE(RLTritonEstimator, _trl.GAE):
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
                buffer_on(self.lmbda, reward.device),
                value,
                next_value,
                reward,
                done=done,
                terminated=terminated,
                time_dim=time_dim,
            )
        gamma, lmbda = got
        return on_rows(
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
        return (gamma, lmbda) if in_unit(gamma, lmbda) else None

    def _fast_targets(self, tensordict, value, next_value, reward, done, terminated, rows, scalars):
        gamma, lmbda = scalars
        adv, value_target = in_shape_of(
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
            raise no_batch_dims(tensordict)
        steps_reward = tensordict.get(("next", self.tensor_keys.reward))
        steps = self._steps_to_next_obs(tensordict)
        if self.value_network is None:
            value, next_value = self._stored_values(tensordict)
        else:  # _values inline: under torch.compile a frame fewer at the graph break of TorchRL's NaN check
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
            raise no_batch_dims(tensordict)
        steps_reward = tensordict.get(("next", self.tensor_keys.reward))
        steps = self._steps_to_next_obs(tensordict)
        time_dim = self._get_time_dim(time_dim, tensordict)
        if self.is_stateless and params is None:
            raise no_params()
        value, next_value = self._values(tensordict, params, target_params)
        valid = tensordict.get("shifted_valid", default=None)
        data_for_value = self._prepare_shifted_tensordict(tensordict, valid, time_dim)
        reward, done, terminated = self._signals(data_for_value)
        reward, done, terminated = self._prepare_signals(reward, done, terminated, value)
        _, value_target = self._gae(
            steps_reward, steps, value, next_value, reward, done, terminated, time_dim, vectorized=True
        )
        return value_target


@torchrl_estimator("MAGAE")
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
