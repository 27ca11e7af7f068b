"""The V-trace (IMPALA) value estimator whose recursion runs in rl_triton.

What it keeps from TorchRL: :mod:`rl_triton.modules._base`; it also scores the stored action under the target
policy, where TorchRL scores a freshly drawn one (see the class).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

from tensordict import is_tensor_collection
from tensordict.nn import CompositeDistribution, dispatch, set_composite_lp_aggregate
from tensordict.utils import NestedKey
from torchrl.objectives.utils import _maybe_get_or_select, hold_out_net
from torchrl.objectives.value import advantages as _trl
from torchrl.objectives.value import functional as _trl_fn
from torchrl.objectives.value.advantages import _self_set_grad_enabled, _self_set_skip_existing

from .. import functional as F
from ._base import ROLES, RLTritonEstimator, no_batch_dims, on_rows
from ._common import copy_signature, expose_inherited_keys, missing_entry, non_negative, same_shapes
from ._registry import torchrl_estimator

__all__ = ["VTrace"]


@torchrl_estimator("VTrace")
class VTrace(RLTritonEstimator, _trl.VTrace):
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
                    raise missing_entry(self, self.tensor_keys.action, ROLES["action"], "action")
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
            raise no_batch_dims(tensordict)
        steps = self._steps_to_next_obs(tensordict)
        steps_reward = self._entry(tensordict, ("next", self.tensor_keys.reward), "reward")
        if self.value_network is None:
            value, next_value = self._stored_values(tensordict)
        else:  # _values inline: under torch.compile a frame fewer at the graph break of TorchRL's NaN check
            held, call = self._net_call(tensordict, params, target_params, True)
            with hold_out_net(self.value_network) if held else nullcontext():
                value, next_value, valid = self._call_value_nets(**call)
            if valid is not None:
                tensordict.set("shifted_valid", valid)

        lp = _maybe_get_or_select(tensordict, self.tensor_keys.sample_log_prob)
        if lp is None:
            raise missing_entry(self, self.tensor_keys.sample_log_prob, ROLES["sample_log_prob"], "sample_log_prob")
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
            value_target, adv = on_rows(
                lambda lpi, lmu, v, nv, r, term, dn: F.vtrace_with_next_values(
                    lpi, lmu, v, nv, r, term, dn, gamma=gamma, rho_bar=rho, c_bar=c
                ),
                [log_pi, log_mu, value, next_value, reward],
                [terminated, done],
                time_dim,
                2,
            )

        if self.average_adv:
            adv = self._standardized(adv, tensordict, 1e-5)
        tensordict.set(self.tensor_keys.advantage, adv)
        tensordict.set(self.tensor_keys.value_target, value_target)
        self._mask_shifted_output(tensordict, valid)
        return tensordict
