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

from . import _ops, _validation, reference
from ._dispatch import launchable, run
from ._ops import compilable, is_compiling
from ._validation import (
    _UNKNOWN,
    TensorDiscount,
    check_data,
    check_probabilities,
    discount,
    fast_discount,
    per_step,
    prepare,
    scalar,
    signature,
)

if TYPE_CHECKING:
    from .kernels.plans import Plan

# Fast paths. Each function first builds its validation cache key (_validation.signature, the tensors in the
# order prepare's key takes them). A hit that needs nothing but the launch (_dispatch.launchable) and whose
# launch the cache entry already keeps (kernels/launch.py, the key _start files it under) checks the
# hyper-parameters, allocates the outputs and launches: the steps in between (Prepared, the run/kernel
# closures, the launchers' dict lookups) are what a call of a validated signature would spend on them
# every time. Anything else takes the prepared path, with the key already built.

_BOOT_DIFF = ("bootstrap_values", "last_value")
# per-call constants (a tuple built in the call would be rebuilt, and hashed by the validation cache, every time)
_GAE_REQUIRED = {
    False: ("rewards", "values", "terminateds"),
    True: ("rewards", "values", "terminateds", "bootstrap_values"),
}
_GAE_PLAIN, _GAE_NEXT = _GAE_REQUIRED[False], _GAE_REQUIRED[True]
_GAE_DIFF = ("rewards", "values", *_BOOT_DIFF)
_VTRACE_REQUIRED = ("log_pi_target", "log_pi_behavior", "values", "rewards", "terminateds")
_RETRACE_REQUIRED = (
    "action_probs_target", "action_probs_behavior", "q_values", "next_q_values_all", "actions", "rewards",
    "terminateds", "truncateds",
)  # fmt: skip
_RETURNS_REQUIRED = ("rewards", "terminateds")
_LAMBDA_REQUIRED = ("rewards", "next_values", "terminateds")
_RWA_REQUIRED = ("rewards", "values", "terminateds")
_RWA_DIFF = ("rewards", "values", "next_values", "bootstrap_values")
_REQUIRED_TRACE = {"gradients": ("gradients", "dones"), "inputs": ("inputs", "dones")}
# positions of the differentiable inputs in each fast path's tensors (autograd takes the prepared path)
_GAE_AT = (0, 1, 2, 5)  # rewards, values, bootstrap_values, last_value
_VTRACE_AT = (2, 3, 4, 7)  # values, rewards, bootstrap_values, last_value
_RETRACE_AT = (1, 2, 6)  # q_values, rewards, next_q_values_all
_TRACE_AT = (0, 2)  # inputs, seed_values
# the keys the launchers file each function's launch under in the cache entry (kernels/launch.py, _start)
_GAE_LAUNCH = ("gae", False, False)
_GAE_NEXT_LAUNCH = {False: ("gae", True, False), True: ("gae", True, True)}  # by targets
_VTRACE_LAUNCH = {False: ("vtrace", False), True: ("vtrace", True)}  # by next_all
_RETRACE_LAUNCH = ("retrace",)
_RETURNS_LAUNCH = ("returns", False)
_RWA_LAUNCH = ("returns", True)
_TRACE_LAUNCH = {False: ("forward_trace", False), True: ("forward_trace", True)}  # by starts_at
_LAUNCH = None


def _launchers():
    """:mod:`rl_triton.kernels.launch`, imported on first use (it imports Triton); a module global
    after that, because an import statement costs ~0.7 us on every call."""
    global _LAUNCH
    if _LAUNCH is None:
        from .kernels import launch

        _LAUNCH = launch
    return _LAUNCH


def _fast(key, plan, tensors, diff_at, at, build, inputs, two, gamma, lambda_=None, bars=()):
    """The fast path: for a call without ``plan`` whose validation cache entry (filed under ``key``) is
    :func:`launchable` (``diff_at``: the differentiable inputs' positions in ``tensors``), the launch the entry
    keeps under ``at``. Checks gamma, then lambda_ (None: the function has none), then the ``(name, value)``
    clipping ``bars`` as the prepared path does, allocates the output like ``tensors[e.like_at]`` (and a second
    one when ``two``) and launches with the arguments the launchers' ``build`` makes of ``inputs``. None where
    the prepared path must run: a plan, a miss, an entry that cannot launch directly, no kept launch, a tensor
    gamma/lambda_."""
    if plan is not None:
        return None
    e = _validation._CACHE.get(key)
    if not launchable(e, tensors, diff_at):
        return None
    launch = e.plans.get(at)
    if launch is None:
        return None
    try:
        g = gamma if type(gamma) is float and 0.0 <= gamma <= 1.0 else fast_discount("gamma", gamma)
        if lambda_ is not None:
            lam = lambda_ if type(lambda_) is float and 0.0 <= lambda_ <= 1.0 else fast_discount("lambda_", lambda_)
            g = (g, lam)
        else:
            g = (g,)
    except TensorDiscount:
        return None  # a tensor gamma/lambda_: the prepared path
    for name, x in bars:
        g += (x if type(x) is float and x >= 0.0 else scalar(name, x, hi=None),)
    like = tensors[e.like_at]
    out = torch.empty_like(like)
    second = torch.empty_like(like) if two else out
    k = _LAUNCH or _launchers()
    k._run(launch, getattr(k, build)(*inputs, out, second, e.num_envs, e.seq_len, *g))
    return (out, second) if two else out


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
    fn = "compute_gae"
    if last_value is not None:
        _check_bootstrap(fn, truncateds, bootstrap_values, last_value)
    tensors = (rewards, values, bootstrap_values, terminateds, truncateds, last_value)
    key = signature(fn, _GAE_PLAIN, None, tensors)
    out = _fast(
        key, plan, tensors, _GAE_AT, _GAE_LAUNCH, "gae_args",
        (rewards, values, terminateds, truncateds, bootstrap_values, last_value), False, gamma, lambda_,
    )  # fmt: skip
    if out is not None:
        return out
    return _gae(
        fn, rewards, values, terminateds, truncateds, gamma, lambda_, bootstrap_values, last_value, False, plan=plan,
        key=key,
    )  # fmt: skip


def _gae(
    fn, rewards, values, terminateds, truncateds, gamma, lambda_, bootstrap_values, last_value, next_all, targets=False,
    rows=None, plan=None, key=_UNKNOWN,
):  # fmt: skip
    s = {"gamma": discount("gamma", gamma), "lambda_": discount("lambda_", lambda_), "next_all": next_all}
    p = prepare(
        fn,
        steps={"rewards": rewards, "values": values, "bootstrap_values": bootstrap_values},
        flags={"terminateds": terminateds, "truncateds": truncateds},
        per_env={"last_value": last_value},
        required=_GAE_REQUIRED[next_all],
        rows=rows,
        key=key,
    )
    if type(s["gamma"]) is not float or type(s["lambda_"]) is not float:
        per_step(p, s)  # a per-env or per-step gamma or lambda_
    if not next_all:
        check_data(p, term="terminateds", trunc="truncateds", boot="bootstrap_values")
    if targets:

        def both():
            return _launchers().gae(p, s["gamma"], s["lambda_"], next_all, True, plan)

        adv, tgt = run(p, reference.gae_targets, s, both, _GAE_DIFF, 2)
        return p.finish(adv), p.finish(tgt)

    def kernel():
        launch = _launchers()
        return (launch.gae(p, s["gamma"], s["lambda_"], next_all, plan=plan),)

    (adv,) = run(p, reference.gae, s, kernel, _GAE_DIFF, 1)
    return p.finish(adv)


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
    fn = "gae_with_next_values"
    tensors = (rewards, values, next_values, terminateds, dones, None)
    key = signature(fn, _GAE_NEXT, rows, tensors)
    out = _fast(
        key, plan, tensors, _GAE_AT, _GAE_NEXT_LAUNCH[bool(targets)], "gae_args",
        (rewards, values, terminateds, dones, next_values, None), targets, gamma, lambda_,
    )  # fmt: skip
    if out is not None:
        return out
    return _gae(
        fn, rewards, values, terminateds, dones, gamma, lambda_, next_values, None, True, targets, rows, plan, key=key
    )


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
    fn = "compute_vtrace"
    if last_value is not None:
        _check_bootstrap(fn, truncateds, bootstrap_values, last_value)
    return _vtrace(
        fn, log_pi_target, log_pi_behavior, values, rewards, terminateds, truncateds, gamma, rho_bar, c_bar,
        bootstrap_values, last_value, False, plan,
    )  # fmt: skip


def _vtrace(
    fn, log_pi_target, log_pi_behavior, values, rewards, terminateds, truncateds, gamma, rho_bar, c_bar,
    bootstrap_values, last_value, next_all, plan=None,
):  # fmt: skip
    tensors = (log_pi_target, log_pi_behavior, values, rewards, bootstrap_values, terminateds, truncateds, last_value)
    key = signature(fn, _VTRACE_REQUIRED, None, tensors)
    out = _fast(
        key, plan, tensors, _VTRACE_AT, _VTRACE_LAUNCH[next_all], "vtrace_args",
        (log_pi_target, log_pi_behavior, values, rewards, terminateds, truncateds, bootstrap_values, last_value),
        True, gamma, None, (("rho_bar", rho_bar), ("c_bar", c_bar)),
    )  # fmt: skip
    if out is not None:
        return out
    s = {
        "gamma": discount("gamma", gamma),
        "rho_bar": scalar("rho_bar", rho_bar, hi=None),
        "c_bar": scalar("c_bar", c_bar, hi=None),
        "next_all": next_all,
    }
    p = prepare(
        fn,
        steps={
            "log_pi_target": log_pi_target,
            "log_pi_behavior": log_pi_behavior,
            "values": values,
            "rewards": rewards,
            "bootstrap_values": bootstrap_values,
        },
        flags={"terminateds": terminateds, "truncateds": truncateds},
        per_env={"last_value": last_value},
        required=_VTRACE_REQUIRED,
        key=key,
    )
    if type(s["gamma"]) is not float:
        per_step(p, s)  # a per-env or per-step gamma
    if not next_all:
        check_data(p, term="terminateds", trunc="truncateds", boot="bootstrap_values")

    def kernel():
        launch = _launchers()
        return launch.vtrace(p, s["gamma"], s["rho_bar"], s["c_bar"], next_all, plan)

    vs, adv = run(p, reference.vtrace, s, kernel, _GAE_DIFF, 2)
    return p.finish(vs), p.finish(adv)


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
    return _vtrace(
        "vtrace_with_next_values", log_pi_target, log_pi_behavior, values, rewards, terminateds, dones, gamma,
        rho_bar, c_bar, next_values, None, True, plan,
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
    fn = "compute_retrace"
    tensors = (
        action_probs_behavior, q_values, rewards, terminateds, truncateds, action_probs_target, next_q_values_all,
        next_action_probs_target, actions,
    )  # fmt: skip
    key = signature(fn, _RETRACE_REQUIRED, None, tensors)
    # the cache never keeps a call with CPU actions (_validation.cacheable_actions): a miss leaves that to prepare
    out = _fast(
        key, plan, tensors, _RETRACE_AT, _RETRACE_LAUNCH, "retrace_args",
        (action_probs_target, next_action_probs_target, action_probs_behavior, q_values, next_q_values_all, actions,
         rewards, terminateds, truncateds),
        True, gamma, lambda_, (("c_bar", c_bar), ("rho_bar", rho_bar)),
    )  # fmt: skip
    if out is not None:
        return out
    s = {
        "gamma": discount("gamma", gamma),
        "lambda_": discount("lambda_", lambda_),
        "c_bar": scalar("c_bar", c_bar, hi=None),
        "rho_bar": scalar("rho_bar", rho_bar, hi=None),
    }
    p = prepare(
        fn,
        steps={"action_probs_behavior": action_probs_behavior, "q_values": q_values, "rewards": rewards},
        flags={"terminateds": terminateds, "truncateds": truncateds},
        per_action={
            "action_probs_target": action_probs_target,
            "next_q_values_all": next_q_values_all,
            "next_action_probs_target": next_action_probs_target,
        },
        actions=("actions", actions),
        required=_RETRACE_REQUIRED,
        key=key if key in _validation._CACHE else _UNKNOWN,
    )
    if type(s["gamma"]) is not float or type(s["lambda_"]) is not float:
        per_step(p, s)  # a per-env or per-step gamma or lambda_
    check_data(p, term="terminateds", trunc="truncateds")
    check_probabilities(p, ("action_probs_target", "next_action_probs_target"), "action_probs_behavior")

    def kernel():
        launch = _launchers()
        return launch.retrace(p, s["gamma"], s["lambda_"], s["c_bar"], s["rho_bar"], plan)

    qt, adv = run(p, reference.retrace, s, kernel, ("rewards", "q_values", "next_q_values_all"), 2)
    return p.finish(qt), p.finish(adv)


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
    fn = "compute_discounted_returns"
    tensors = (rewards, bootstrap_values, terminateds, truncateds)
    key = signature(fn, _RETURNS_REQUIRED, None, tensors)
    out = _fast(
        key, plan, tensors, (0, 1), _RETURNS_LAUNCH, "returns_args",
        (rewards, None, terminateds, truncateds, bootstrap_values, None), False, gamma, 1.0,
    )  # fmt: skip
    if out is not None:
        return out
    s = {"gamma": discount("gamma", gamma), "lambda_": 1.0}
    p = prepare(
        fn,
        steps={"rewards": rewards, "bootstrap_values": bootstrap_values},
        flags={"terminateds": terminateds, "truncateds": truncateds},
        required=_RETURNS_REQUIRED,
        key=key,
    )
    if type(s["gamma"]) is not float or type(s["lambda_"]) is not float:
        per_step(p, s)  # a per-env or per-step gamma or lambda_
    check_data(p, term="terminateds", trunc="truncateds", boot="bootstrap_values")

    def kernel():
        launch = _launchers()
        return (launch.returns(p, s["gamma"], 1.0, plan=plan),)

    (g,) = run(p, reference.lambda_returns, s, kernel, ("rewards", "bootstrap_values"), 1)
    return p.finish(g)


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
    fn = "compute_lambda_returns"
    tensors = (rewards, next_values, bootstrap_values, terminateds, truncateds)
    key = signature(fn, _LAMBDA_REQUIRED, None, tensors)
    out = _fast(
        key, plan, tensors, (0, 1, 2), _RETURNS_LAUNCH, "returns_args",
        (rewards, next_values, terminateds, truncateds, bootstrap_values, None), False, gamma, lambda_,
    )  # fmt: skip
    if out is not None:
        return out
    s = {"gamma": discount("gamma", gamma), "lambda_": discount("lambda_", lambda_)}
    p = prepare(
        fn,
        steps={"rewards": rewards, "next_values": next_values, "bootstrap_values": bootstrap_values},
        flags={"terminateds": terminateds, "truncateds": truncateds},
        required=_LAMBDA_REQUIRED,
        key=key,
    )
    if type(s["gamma"]) is not float or type(s["lambda_"]) is not float:
        per_step(p, s)  # a per-env or per-step gamma or lambda_
    check_data(p, term="terminateds", trunc="truncateds", boot="bootstrap_values")

    def kernel():
        launch = _launchers()
        return (launch.returns(p, s["gamma"], s["lambda_"], plan=plan),)

    (g,) = run(p, reference.lambda_returns, s, kernel, ("rewards", "next_values", "bootstrap_values"), 1)
    return p.finish(g)


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
    fn = "returns_with_advantages"
    tensors = (rewards, values, next_values, bootstrap_values, terminateds, truncateds)
    key = signature(fn, _RWA_REQUIRED, rows, tensors)
    out = _fast(
        key, plan, tensors, (0, 1, 2, 3), _RWA_LAUNCH, "returns_args",
        (rewards, next_values, terminateds, truncateds, bootstrap_values, values), True, gamma, lambda_,
    )  # fmt: skip
    if out is not None:
        return out
    s = {"gamma": discount("gamma", gamma), "lambda_": discount("lambda_", lambda_)}
    p = prepare(
        fn,
        steps={"rewards": rewards, "values": values, "next_values": next_values, "bootstrap_values": bootstrap_values},
        flags={"terminateds": terminateds, "truncateds": truncateds},
        required=_RWA_REQUIRED,
        rows=rows,
        key=key,
    )
    if type(s["gamma"]) is not float or type(s["lambda_"]) is not float:
        per_step(p, s)  # a per-env or per-step gamma or lambda_
    check_data(p, term="terminateds", trunc="truncateds", boot="bootstrap_values")

    def kernel():
        return _launchers().returns(p, s["gamma"], s["lambda_"], True, plan)

    g, adv = run(p, reference.returns_advantages, s, kernel, _RWA_DIFF, 2)
    return p.finish(g), p.finish(adv)


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


def _scale(gamma, lambda_) -> float:
    """The traces' gamma * lambda; 1.0 for the prefix sums (gamma None)."""
    if gamma is None:
        return 1.0
    g = gamma if type(gamma) is float and 0.0 <= gamma <= 1.0 else scalar("gamma", gamma)
    return g * (lambda_ if type(lambda_) is float and 0.0 <= lambda_ <= 1.0 else scalar("lambda_", lambda_))


def _forward_trace(fn: str, x_name: str, x, dones, seed_values, gamma, lambda_, starts_at: bool, plan=None):
    """The forward scans, scaled by :func:`_scale` (checked before the prepared path's tensors, as ever)."""
    tensors = (x, dones, seed_values)
    required = _REQUIRED_TRACE[x_name]
    key = signature(fn, required, None, tensors)
    e = _validation._CACHE.get(key)
    if plan is None and launchable(e, tensors, _TRACE_AT):
        launch = e.plans.get(_TRACE_LAUNCH[starts_at])
        if launch is not None:
            gl = _scale(gamma, lambda_)
            out = torch.empty_like(x)
            k = _LAUNCH or _launchers()
            k._run(launch, k.forward_args(x, dones, seed_values, out, e.num_envs, e.seq_len, gl))
            return out
    s = {"scale": _scale(gamma, lambda_), "starts_at": starts_at}
    p = prepare(
        fn,
        steps={x_name: x},
        flags={"dones": dones},
        per_env={"seed_values": seed_values},
        required=required,
        key=key,
    )
    check_data(p)
    p.tensors["inputs"] = p.tensors.pop(x_name)

    def kernel():
        launch = _launchers()
        return (launch.forward_trace(p, s["scale"], s["starts_at"], plan),)

    (y,) = run(p, reference.forward_trace, s, kernel, ("inputs", "seed_values"), 1)
    return p.finish(y)


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
    return _forward_trace(
        "compute_eligibility_traces", "gradients", gradients, dones, seed_values, gamma, lambda_, False, plan
    )


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
    return _forward_trace(
        "compute_episodic_prefix_sum", "inputs", inputs, dones, seed_values, None, None, boundary == "starts_at", plan
    )
