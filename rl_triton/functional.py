"""The public functional API: seven credit-assignment functions.

Every function validates its arguments (``ValueError``/``TypeError`` naming the argument), then
runs either the fused Triton kernels (CUDA tensors; CPU tensors under ``TRITON_INTERPRET=1``) or
the PyTorch path (other CPU tensors); see :func:`rl_triton.use_backend`. The formulas are those of
docs/semantics.md and are repeated in each docstring. Conventions shared by all functions:

* Per-step tensors are ``(num_envs, seq_len)``, or ``(seq_len,)`` for one env (the result then
  has the same 1-D shape). Time runs along the last dim, ``t = 0 .. T-1``.
* Flags (``terminateds``, ``truncateds``, ``dones``) may be bool, integer or floating 0/1; nonzero
  means set. ``done_t = term_t OR trunc_t``; no recursion crosses a done step.
* A boundary step takes its continuation value from outside the buffer:
  ``boundary_t = trunc_t OR t == T-1``. ``boot_t`` is ``bootstrap_values[:, t]`` (``last_value``
  fills only ``t = T-1``; zero when neither is given) and is read only at boundary steps.
* Float inputs share one dtype (float16, bfloat16, float32 or float64); outputs have that dtype;
  accumulation is float32 (float64 for float64 inputs). Inputs are never modified.
* ``gamma`` and ``lambda_`` of the five backward functions (GAE, V-trace, Retrace, the discounted and the
  lambda returns) may be Python floats, 0-d tensors (the float they hold, bit for bit), ``(N,)`` per-env or
  ``(N, T)`` per-step tensors (``(T,)`` for 1-D calls) of any float dtype on the inputs' device. Step t's
  line of each formula then reads gamma_t (the discount from t to t+1: it multiplies step t's continuation
  and carried term) and lambda_t. CPU tensors are checked to lie in [0, 1] (GPU ones are not: that would
  need a host sync); they are never differentiated. Until the kernels read such tensors, these calls run
  the PyTorch path on every device (CUDA tensors included).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from . import _ops, ops
from ._discounts import scale
from ._dispatch import call
from ._ops import compilable, is_compiling

if TYPE_CHECKING:
    from .kernels.plans import Plan

# Each function below checks what is its own (torch.compile's op, exclusive arguments), then hands its algorithm's
# spec (ops/<algorithm>.py, imported on first use: it imports Triton), its tensors in the validation cache key's
# order (TENSORS there) and its hyper-parameters to the generic call path, _dispatch.call.


def _check_bootstrap(fn: str, truncateds, bootstrap_values, last_value) -> None:
    if last_value is not None and bootstrap_values is not None:
        raise ValueError(f"{fn}: pass either 'last_value' or 'bootstrap_values', not both")
    if last_value is not None and truncateds is not None:
        raise ValueError(
            f"{fn}: 'last_value' cannot be combined with 'truncateds' (interior truncations need per-step "
            "bootstrap values): pass 'bootstrap_values' instead"
        )


@compilable(like="rewards", n_out=1)
def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None = None,
    *,
    gamma: float | torch.Tensor,
    lambda_: float | torch.Tensor,
    bootstrap_values: torch.Tensor | None = None,
    last_value: torch.Tensor | None = None,
    plan: Plan | None = None,
) -> torch.Tensor:
    """Generalized Advantage Estimation (Schulman et al., 2016).

    ::

        v_next_t = boot_t if boundary_t else values_{t+1}
        delta_t  = r_t + gamma (1 - term_t) v_next_t - values_t
        A_t      = delta_t + gamma lambda (1 - done_t) A_{t+1},    A_T = 0

    Args:
        rewards: ``(N, T)`` float, r_t received after acting at step t.
        values: ``(N, T)`` float, V(s_t).
        terminateds: ``(N, T)`` flags, 1 where the episode truly ended at step t.
        truncateds: optional ``(N, T)`` flags, 1 where a time limit cut the episode at step t.
        gamma: discount in [0, 1]. lambda_: GAE lambda in [0, 1]. Each a Python float, a 0-d tensor, an
            ``(N,)`` per-env or an ``(N, T)`` per-step tensor (``(T,)`` for 1-D calls; see the module docstring:
            gamma_t and lambda_t at step t).
        bootstrap_values: optional ``(N, T)`` float, V(s_{t+1}) at truncated steps and at the last
            step when the window ends mid-episode (read only at those steps).
        last_value: optional ``(N,)`` float, V(s_T) for the last step only; exclusive with
            ``bootstrap_values`` and with ``truncateds``.

        plan: advanced: the launch plan of the kernel path (:class:`rl_triton.kernels.plans.Plan`); by
            default :func:`rl_triton.kernels.plans.choose` picks it from the shape and dtype. Ignored by the
            PyTorch path.

    Returns:
        advantages, ``(N, T)`` in the input dtype.

    Example::

        >>> import torch, rl_triton
        >>> r, v = torch.ones(2, 3), torch.zeros(2, 3)
        >>> rl_triton.compute_gae(r, v, torch.zeros(2, 3), gamma=0.5, lambda_=1.0)[0]
        tensor([1.7500, 1.5000, 1.0000])
    """
    if is_compiling() and _ops.tracing():
        return _ops.emit(
            "compute_gae", rewards, values, terminateds, truncateds, gamma=gamma, lambda_=lambda_,
            bootstrap_values=bootstrap_values, last_value=last_value, plan=plan,
        )  # fmt: skip
    if last_value is not None:
        _check_bootstrap("compute_gae", truncateds, bootstrap_values, last_value)
    return call(
        ops.gae.GAE, (rewards, values, bootstrap_values, terminateds, truncateds, last_value), plan, (gamma, lambda_)
    )


def gae_with_next_values(
    rewards, values, next_values, terminateds, dones, *, gamma, lambda_, targets: bool = False, rows=None, plan=None
):  # fmt: skip
    """GAE in TorchRL's form: ``next_values[t]`` = V(s_{t+1}) is used at every step (not only at
    boundaries), ``dones`` cuts the recursion and ``terminateds`` zeroes the bootstrap::

        delta_t = r_t + gamma (1 - term_t) next_values_t - values_t
        A_t = delta_t + gamma lambda (1 - done_t) A_{t+1}

    Used by :mod:`rl_triton.modules`; same shapes and dtypes as :func:`compute_gae`. With
    ``targets=True`` returns ``(A, A + values)``, both from one kernel launch; the sum is rounded to
    the inputs' dtype once, so it equals ``A + values`` bit for bit. ``rows=(N, T)``: the inputs share
    one shape whose ``reshape(rows)`` is their ``(N, T)`` form (``[..., T, 1]`` or time last); the
    outputs then come in that shape, without view ops on the kernel path (:func:`prepare`). ``gamma`` and
    ``lambda_`` as in :func:`compute_gae`; a per-step tensor of a ``rows=`` call is ``(N, T)`` (the rows' form).
    """
    if is_compiling() and _ops.tracing():
        name = "_gae_next_targets" if targets else "_gae_next"
        return _traced_rows(name, rows, rewards, (rewards, values, next_values, terminateds, dones), gamma, lambda_)
    op = ops.gae.GAE_NEXT_TARGETS if targets else ops.gae.GAE_NEXT
    return call(op, (rewards, values, next_values, terminateds, dones, None), plan, (gamma, lambda_), rows)


@compilable(like="rewards", n_out=2)
def compute_vtrace(
    log_pi_target: torch.Tensor,
    log_pi_behavior: torch.Tensor,
    values: torch.Tensor,
    rewards: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None = None,
    *,
    gamma: float | torch.Tensor,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    bootstrap_values: torch.Tensor | None = None,
    last_value: torch.Tensor | None = None,
    plan: Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace targets and policy-gradient advantages (Espeholt et al., 2018).

    ::

        ratio_t = exp(log_pi_target_t - log_pi_behavior_t)
        rho_t = min(rho_bar, ratio_t),   c_t = min(c_bar, ratio_t)
        v_next_t = boot_t if boundary_t else values_{t+1}
        delta_t = rho_t (r_t + gamma (1 - term_t) v_next_t - values_t)
        D_t = delta_t + gamma c_t (1 - done_t) D_{t+1},   D_T = 0
        vs_t = values_t + D_t
        q_t = v_next_t if boundary_t else vs_{t+1}
        advantages_t = rho_t (r_t + gamma (1 - term_t) q_t - values_t)

    At a truncated step the advantage bootstraps from the true continuation value, never from the
    next episode's ``vs``.

    Args:
        log_pi_target, log_pi_behavior: ``(N, T)`` float, log-probabilities of the taken action a_t
            under the target (learner) and behaviour (actor) policies. Treated as constants for
            autograd (no gradient flows to them), as IMPALA stops gradients through rho and c.
        values: ``(N, T)`` float, V(s_t). rewards: ``(N, T)`` float, r_t.
        terminateds, truncateds, bootstrap_values, last_value: as in :func:`compute_gae`.
        gamma: discount in [0, 1]: a float, 0-d, per-env or per-step tensor (as in :func:`compute_gae`).
            rho_bar, c_bar: clipping thresholds (>= 0; default 1; floats or 0-d tensors).

        plan: advanced: the launch plan of the kernel path (:class:`rl_triton.kernels.plans.Plan`); by
            default :func:`rl_triton.kernels.plans.choose` picks it from the shape and dtype. Ignored by the
            PyTorch path.

    Returns:
        ``(vs, advantages)``, each ``(N, T)`` in the input dtype.

    Example::

        >>> import torch, rl_triton
        >>> z = torch.zeros(1, 3)
        >>> vs, adv = rl_triton.compute_vtrace(z, z, z, torch.ones(1, 3), z, gamma=0.5)
        >>> vs[0]
        tensor([1.7500, 1.5000, 1.0000])
    """
    if is_compiling() and _ops.tracing():
        return _ops.emit(
            "compute_vtrace", log_pi_target, log_pi_behavior, values, rewards, terminateds, truncateds, gamma=gamma,
            rho_bar=rho_bar, c_bar=c_bar, bootstrap_values=bootstrap_values, last_value=last_value, plan=plan,
        )  # fmt: skip
    if last_value is not None:
        _check_bootstrap("compute_vtrace", truncateds, bootstrap_values, last_value)
    return call(
        ops.vtrace.VTRACE, (log_pi_target, log_pi_behavior, values, rewards, bootstrap_values, terminateds, truncateds,
                 last_value), plan, (gamma, rho_bar, c_bar),
    )  # fmt: skip


def vtrace_with_next_values(
    log_pi_target, log_pi_behavior, values, next_values, rewards, terminateds, dones, *, gamma, rho_bar=1.0, c_bar=1.0,
    plan=None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """V-trace in TorchRL's form: ``next_values[t]`` = V(s_{t+1}) at every step, ``dones`` cuts the
    recursion (and makes the advantage bootstrap from ``next_values``), ``terminateds`` zeroes the
    bootstrap. Returns ``(vs, advantages)``. Used by :mod:`rl_triton.modules`."""
    if is_compiling() and _ops.tracing():
        return _ops.emit_ordered(
            "_vtrace_next",
            (log_pi_target, log_pi_behavior, values, next_values, rewards, terminateds, dones),
            {"gamma": gamma, "rho_bar": rho_bar, "c_bar": c_bar},
        )
    return call(
        ops.vtrace.VTRACE_NEXT, (log_pi_target, log_pi_behavior, values, rewards, next_values, terminateds, dones,
                                 None), plan, (gamma, rho_bar, c_bar),
    )  # fmt: skip


@compilable(like="rewards", n_out=2)
def compute_retrace(
    action_probs_target: torch.Tensor,
    action_probs_behavior: torch.Tensor,
    q_values: torch.Tensor,
    next_q_values_all: torch.Tensor,
    actions: torch.Tensor,
    rewards: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor,
    *,
    gamma: float | torch.Tensor,
    lambda_: float | torch.Tensor = 1.0,
    c_bar: float = 1.0,
    rho_bar: float = 1.0,
    next_action_probs_target: torch.Tensor | None = None,
    plan: Plan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Retrace(lambda) Q targets and advantages for discrete actions (Munos et al., 2016).

    ::

        pi_t = action_probs_target[t, actions_t],   ratio_t = pi_t / action_probs_behavior_t
        c_t = lambda min(c_bar, ratio_t),   rho_t = min(rho_bar, ratio_t)
        E_t = sum_a w[t, a] next_q_values_all[t, a]     (w = next_action_probs_target if given,
                                                          else action_probs_target)
        delta_t = r_t + gamma (1 - term_t) E_t - q_values_t
        Delta_t = delta_t + gamma c_{t+1} (1 - done_t) Delta_{t+1},   c_T = 0,  Delta_T = 0
        q_targets_t = q_values_t + Delta_t
        X_t = E_t if boundary_t else q_targets_{t+1}
        advantages_t = rho_t (r_t + gamma (1 - term_t) X_t - q_values_t)

    Args:
        action_probs_target: ``(N, T, A)`` float, the full target distribution pi(. | s_t).
        action_probs_behavior: ``(N, T)`` float, mu(a_t | s_t) of the taken action only.
        q_values: ``(N, T)`` float, Q(s_t, a_t).
        next_q_values_all: ``(N, T, A)`` float, Q(s_{t+1}, .) for every step including the last
            (the continuation at boundaries is embedded here; there is no bootstrap argument).
        actions: ``(N, T)`` int64 in [0, A). On CPU an out-of-range action is a ValueError; on CUDA
            it is not checked (that would need a host sync) and makes that step's outputs NaN.
        rewards: ``(N, T)`` float. terminateds, truncateds: ``(N, T)`` flags (truncateds required).
        gamma: discount in [0, 1]; lambda_ in [0, 1] (each a float, 0-d, per-env or per-step tensor, as in
            :func:`compute_gae`; c_t uses lambda_t); c_bar, rho_bar >= 0.
        next_action_probs_target: optional ``(N, T, A)`` float, pi(. | s_{t+1}), replacing the row-t
            distribution in E_t for callers who have it.

    Probabilities are treated as constants for autograd; gradients flow to ``q_values``,
    ``next_q_values_all`` and ``rewards``.

        plan: advanced: the launch plan of the kernel path (:class:`rl_triton.kernels.plans.Plan`); by
            default :func:`rl_triton.kernels.plans.choose` picks it from the shape and dtype. Ignored by the
            PyTorch path.

    Returns:
        ``(q_targets, advantages)``, each ``(N, T)`` in the input dtype.
    """
    if is_compiling() and _ops.tracing():
        return _ops.emit(
            "compute_retrace", action_probs_target, action_probs_behavior, q_values, next_q_values_all, actions,
            rewards, terminateds, truncateds, gamma=gamma, lambda_=lambda_, c_bar=c_bar, rho_bar=rho_bar,
            next_action_probs_target=next_action_probs_target, plan=plan,
        )  # fmt: skip
    return call(
        ops.retrace.RETRACE, (action_probs_behavior, q_values, rewards, terminateds, truncateds, action_probs_target,
                  next_q_values_all, next_action_probs_target, actions), plan, (gamma, lambda_, c_bar, rho_bar),
    )  # fmt: skip


@compilable(like="rewards", n_out=1)
def compute_discounted_returns(
    rewards: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None = None,
    *,
    gamma: float | torch.Tensor,
    bootstrap_values: torch.Tensor | None = None,
    plan: Plan | None = None,
) -> torch.Tensor:
    """Discounted returns (reward-to-go) that restart at episode boundaries.

    ::

        Y_t = boot_t if boundary_t else G_{t+1}
        G_t = r_t + gamma (1 - term_t) Y_t

    There is no ``last_value`` shortcut: pass ``bootstrap_values`` with the last column set to
    bootstrap a window that ends mid-episode (without it the return after the window is 0).

    Args:
        rewards: ``(N, T)`` float. terminateds, truncateds: ``(N, T)`` flags.
        gamma: discount in [0, 1] (a float, 0-d, per-env or per-step tensor, as in :func:`compute_gae`).
            bootstrap_values: optional ``(N, T)`` float (see compute_gae).

        plan: advanced: the launch plan of the kernel path (:class:`rl_triton.kernels.plans.Plan`); by
            default :func:`rl_triton.kernels.plans.choose` picks it from the shape and dtype. Ignored by the
            PyTorch path.

    Returns:
        returns, ``(N, T)`` in the input dtype.

    Example::

        >>> import torch, rl_triton
        >>> rl_triton.compute_discounted_returns(torch.ones(3), torch.tensor([0, 1, 0]), gamma=0.5)
        tensor([1.5000, 1.0000, 1.0000])
    """
    if is_compiling() and _ops.tracing():
        return _ops.emit(
            "compute_discounted_returns", rewards, terminateds, truncateds, gamma=gamma,
            bootstrap_values=bootstrap_values, plan=plan,
        )  # fmt: skip
    return call(
        ops.returns.DISCOUNTED_RETURNS, (rewards, bootstrap_values, terminateds, truncateds), plan, (gamma, 1.0)
    )


@compilable(like="rewards", n_out=1)
def compute_lambda_returns(
    rewards: torch.Tensor,
    next_values: torch.Tensor,
    terminateds: torch.Tensor,
    truncateds: torch.Tensor | None = None,
    *,
    gamma: float | torch.Tensor,
    lambda_: float | torch.Tensor,
    bootstrap_values: torch.Tensor | None = None,
    plan: Plan | None = None,
) -> torch.Tensor:
    """TD(lambda) returns.

    ::

        X_t = boot_t                              if trunc_t
            = (1 - lambda) nv_t + lambda boot_t   if t == T-1 (and not truncated)
            = (1 - lambda) nv_t + lambda G_{t+1}  otherwise
        G_t = r_t + gamma (1 - term_t) X_t

    with ``nv_t = next_values_t``. lambda = 0 gives one-step TD targets; lambda = 1 with the same
    ``bootstrap_values`` gives :func:`compute_discounted_returns`.

    Args:
        rewards: ``(N, T)`` float.
        next_values: ``(N, T)`` float, V(s_{t+1}) for every step including the last (not
            ``values[:, 1:]``, which is one column short).
        terminateds, truncateds: ``(N, T)`` flags. bootstrap_values: optional ``(N, T)`` float, read
            at truncated steps and the last step (zero when not given).
        gamma, lambda_: in [0, 1]; each a float, 0-d, per-env or per-step tensor (as in :func:`compute_gae`).

        plan: advanced: the launch plan of the kernel path (:class:`rl_triton.kernels.plans.Plan`); by
            default :func:`rl_triton.kernels.plans.choose` picks it from the shape and dtype. Ignored by the
            PyTorch path.

    Returns:
        returns, ``(N, T)`` in the input dtype.
    """
    if is_compiling() and _ops.tracing():
        return _ops.emit(
            "compute_lambda_returns", rewards, next_values, terminateds, truncateds, gamma=gamma, lambda_=lambda_,
            bootstrap_values=bootstrap_values, plan=plan,
        )  # fmt: skip
    return call(
        ops.returns.LAMBDA_RETURNS,
        (rewards, next_values, bootstrap_values, terminateds, truncateds),
        plan,
        (gamma, lambda_),
    )


def returns_with_advantages(
    rewards, values, terminateds, truncateds, *, gamma, lambda_, next_values=None, bootstrap_values=None, rows=None,
    plan=None,
):  # fmt: skip
    """``(G, G - values)`` from one kernel launch, for :mod:`rl_triton.modules`' TD(1) and TD(lambda)
    estimators: ``G`` is :func:`compute_lambda_returns` (with ``next_values``) or, without them and
    with ``lambda_ = 1``, :func:`compute_discounted_returns`, bit for bit; the advantages are rounded
    to the inputs' dtype once, so they equal ``G - values`` bit for bit. ``rows``: as in
    :func:`gae_with_next_values`."""
    if is_compiling() and _ops.tracing():
        shaped = (rewards, values, terminateds, truncateds, next_values, bootstrap_values)
        return _traced_rows("_returns_advantages", rows, rewards, shaped, gamma, lambda_)
    return call(
        ops.returns.RETURNS_WITH_ADVANTAGES, (rewards, values, next_values, bootstrap_values, terminateds,
                                              truncateds), plan, (gamma, lambda_), rows,
    )  # fmt: skip


# torch.compile: the TorchRL-form functions above as rl_triton::call ops (registered under these private names),
# so that Dynamo traces none of their validation, caches or backend choice


def _traced_rows(name: str, rows, like: torch.Tensor, tensors: tuple, gamma, lambda_):
    """The op ``name`` on ``tensors`` viewed as ``rows`` (the outputs back in ``like``'s shape), while tracing."""
    if rows is not None:
        tensors = tuple(None if x is None else x.reshape(rows) for x in tensors)
    out = _ops.emit_ordered(name, tensors, {"gamma": gamma, "lambda_": lambda_})
    if rows is None:
        return out
    return out.reshape(like.shape) if isinstance(out, torch.Tensor) else tuple(o.reshape(like.shape) for o in out)


@compilable(like="rewards", n_out=1)
def _gae_next(
    rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminateds: torch.Tensor,
    dones: torch.Tensor, *, gamma: float | torch.Tensor, lambda_: float | torch.Tensor,
) -> torch.Tensor:  # fmt: skip
    return gae_with_next_values(rewards, values, next_values, terminateds, dones, gamma=gamma, lambda_=lambda_)


@compilable(like="rewards", n_out=2)
def _gae_next_targets(
    rewards: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor, terminateds: torch.Tensor,
    dones: torch.Tensor, *, gamma: float | torch.Tensor, lambda_: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return gae_with_next_values(
        rewards, values, next_values, terminateds, dones, gamma=gamma, lambda_=lambda_, targets=True
    )


@compilable(like="rewards", n_out=2)
def _vtrace_next(
    log_pi_target: torch.Tensor, log_pi_behavior: torch.Tensor, values: torch.Tensor, next_values: torch.Tensor,
    rewards: torch.Tensor, terminateds: torch.Tensor, dones: torch.Tensor, *, gamma: float | torch.Tensor,
    rho_bar: float, c_bar: float,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return vtrace_with_next_values(
        log_pi_target, log_pi_behavior, values, next_values, rewards, terminateds, dones, gamma=gamma,
        rho_bar=rho_bar, c_bar=c_bar,
    )  # fmt: skip


@compilable(like="rewards", n_out=2)
def _returns_advantages(
    rewards: torch.Tensor, values: torch.Tensor, terminateds: torch.Tensor, truncateds: torch.Tensor | None,
    next_values: torch.Tensor | None, bootstrap_values: torch.Tensor | None, *, gamma: float | torch.Tensor,
    lambda_: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    return returns_with_advantages(
        rewards, values, terminateds, truncateds, gamma=gamma, lambda_=lambda_, next_values=next_values,
        bootstrap_values=bootstrap_values,
    )  # fmt: skip


@compilable(like="gradients", n_out=1)
def compute_eligibility_traces(
    gradients: torch.Tensor,
    dones: torch.Tensor,
    *,
    gamma: float,
    lambda_: float,
    seed_values: torch.Tensor | None = None,
    plan: Plan | None = None,
) -> torch.Tensor:
    """Accumulating eligibility traces (forward scan).

    ::

        e_t = g_t + gamma lambda (1 - done_{t-1}) e_{t-1},   e_{-1} = seed_values (or 0), done_{-1} = 0

    The trace restarts the step after ``dones[t] == 1``.

    Args:
        gradients: ``(N, T)`` float, the per-step quantity to trace (e.g. grad_w V(s_t)).
        dones: ``(N, T)`` flags, terminated OR truncated.
        gamma, lambda_: in [0, 1]. seed_values: optional ``(N,)`` float, the trace before t = 0.

        plan: advanced: the launch plan of the kernel path (:class:`rl_triton.kernels.plans.Plan`); by
            default :func:`rl_triton.kernels.plans.choose` picks it from the shape and dtype. Ignored by the
            PyTorch path.

    Returns:
        traces, ``(N, T)`` in the input dtype.

    Example::

        >>> import torch, rl_triton
        >>> rl_triton.compute_eligibility_traces(torch.ones(3), torch.zeros(3), gamma=0.5, lambda_=1.0)
        tensor([1.0000, 1.5000, 1.7500])
    """
    if is_compiling() and _ops.tracing():
        return _ops.emit(
            "compute_eligibility_traces", gradients, dones, gamma=gamma, lambda_=lambda_, seed_values=seed_values,
            plan=plan,
        )  # fmt: skip
    # gamma * lambda_ is checked before the tensors (as ever)
    scaled = (scale("compute_eligibility_traces", gamma, lambda_),)
    return call(ops.forward.ELIGIBILITY_TRACES, (gradients, dones, seed_values), plan, scaled)


@compilable(like="inputs", n_out=1)
def compute_episodic_prefix_sum(
    inputs: torch.Tensor,
    dones: torch.Tensor,
    *,
    boundary: str = "ends_at",
    seed_values: torch.Tensor | None = None,
    plan: Plan | None = None,
) -> torch.Tensor:
    """Cumulative sum along time that restarts at episode boundaries (forward scan).

    ::

        boundary="ends_at":   S_t = x_t + (1 - done_{t-1}) S_{t-1}
        boundary="starts_at": S_t = x_t + (1 - done_t) S_{t-1}
        S_{-1} = seed_values (or 0),  done_{-1} = 0

    ``"ends_at"`` (default) matches a Gymnasium ``terminated | truncated`` flag: the episode ends
    at the flagged step, so the sum restarts at the next one. ``"starts_at"`` is for flags that
    mark a segment's first step. There is no limit on ``seq_len``.

    Args:
        inputs: ``(N, T)`` float. dones: ``(N, T)`` flags.
        boundary: ``"ends_at"`` or ``"starts_at"``. seed_values: optional ``(N,)`` float, S_{-1}.

        plan: advanced: the launch plan of the kernel path (:class:`rl_triton.kernels.plans.Plan`); by
            default :func:`rl_triton.kernels.plans.choose` picks it from the shape and dtype. Ignored by the
            PyTorch path.

    Returns:
        sums, ``(N, T)`` in the input dtype.

    Example::

        >>> import torch, rl_triton
        >>> rl_triton.compute_episodic_prefix_sum(torch.ones(4), torch.tensor([0, 1, 0, 0]))
        tensor([1., 2., 1., 2.])
    """
    if is_compiling() and _ops.tracing():
        return _ops.emit(
            "compute_episodic_prefix_sum", inputs, dones, boundary=boundary, seed_values=seed_values, plan=plan
        )
    if boundary not in ("ends_at", "starts_at"):
        raise ValueError(f"compute_episodic_prefix_sum: boundary must be 'ends_at' or 'starts_at', got {boundary!r}")
    op = ops.forward.PREFIX_SUM_STARTS_AT if boundary == "starts_at" else ops.forward.PREFIX_SUM
    return call(op, (inputs, dones, seed_values), plan, (1.0,))
