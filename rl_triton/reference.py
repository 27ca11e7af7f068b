"""The PyTorch path: every function as prologue -> linear scan -> epilogue, in plain tensor ops.

This is what CPU tensors run (unless ``TRITON_INTERPRET=1``), and it is also how the kernel path
computes gradients: the backward pass re-runs these functions under autograd with the scan done
by the Triton kernels (:mod:`rl_triton.scan`). Each function takes the normalised 2-D tensors of
one call (``t``: name -> tensor or None, floats in the call's dtype, flags as stored), the
hyper-parameters (``s``: floats; ``gamma``/``lambda_`` may be (N, T) per-step views instead, read
elementwise), the accumulation dtype and a differentiable scan, and returns its
outputs in the accumulation dtype. The formulas are those of docs/semantics.md; the fused kernels in
:mod:`rl_triton.kernels.fused` compute the same prologues and epilogues in registers.

Containment (docs/semantics.md): what a zero flag factor multiplies, or what is not read, is selected
away (``torch.where``) before it enters the arithmetic, so that a NaN or an infinity there changes
nothing, not even a gradient; the scan is contained too (:mod:`rl_triton.scan`). With finite inputs
a select gives what the product by zero gave (up to the sign of a zero).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .scan import shift

Scan = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", bool], torch.Tensor]
Tensors = dict[str, "torch.Tensor | None"]


def _float(t: Tensors, name: str, acc: torch.dtype) -> torch.Tensor | None:
    x = t.get(name)
    return None if x is None else x.to(acc)


def _discount(s: dict, name: str, acc: torch.dtype):
    """gamma or lambda_: a float, or the call's (N, T) per-step view (per-env ones have time stride 0) in the
    accumulation dtype; every formula reads it elementwise, gamma_t and lambda_t at step t."""
    x = s[name]
    return x if type(x) is float else x.to(acc)


def _flag(t: Tensors, name: str, like: torch.Tensor) -> torch.Tensor:
    x = t.get(name)
    return torch.zeros_like(like) if x is None else (x != 0).to(like.dtype)


def _last_column(like: torch.Tensor) -> torch.Tensor:
    last = torch.zeros_like(like)
    last[:, -1] = 1.0
    return last


def _boundary(t: Tensors, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """term, trunc and boundary = trunc OR last step, as 0/1 tensors in the accumulation dtype."""
    term = _flag(t, "terminateds", like)
    trunc = _flag(t, "truncateds", like)
    return term, trunc, torch.maximum(trunc, _last_column(like))


def _bootstrap(t: Tensors, bnd: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """boot_t at boundary steps (zero elsewhere: boot is never read at other steps)."""
    boot = _float(t, "bootstrap_values", acc)
    if boot is None:
        boot = torch.zeros_like(bnd)
    last = _float(t, "last_value", acc)
    if last is not None:
        boot = torch.cat([boot[:, :-1], last.reshape(-1, 1)], dim=1)
    return torch.where(bnd.bool(), boot, 0.0)


def _unless(flag: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x where the 0/1 ``flag`` is clear, 0 where it is set (x is not read there)."""
    return torch.where(flag.bool(), 0.0, x)


def _next_values(t: Tensors, s: dict, values: torch.Tensor, bnd: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """v_next_t = boot_t at boundary steps, values_{t+1} otherwise. With ``s["next_all"]`` the
    ``bootstrap_values`` tensor holds V(s_{t+1}) at every step (TorchRL's form) and is used as is."""
    if s.get("next_all"):
        return _float(t, "bootstrap_values", acc)
    boot = _bootstrap(t, bnd, acc)
    return torch.where(bnd.bool(), boot, shift(values, towards_future=True))


def gae(t: Tensors, s: dict, acc: torch.dtype, scan: Scan) -> tuple[torch.Tensor]:
    r = _float(t, "rewards", acc)
    v = _float(t, "values", acc)
    term, trunc, bnd = _boundary(t, r)
    done = torch.maximum(term, trunc)
    v_next = _unless(term, _next_values(t, s, v, bnd, acc))
    gamma = _discount(s, "gamma", acc)
    delta = r + gamma * (1 - term) * v_next - v
    a = _unless(done, gamma * _discount(s, "lambda_", acc) * (1 - done))
    return (scan(a, delta, None, True),)


def gae_targets(t: Tensors, s: dict, acc: torch.dtype, scan: Scan) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE's advantages and value targets ``A + V(s)``, the sum taken in the inputs' dtype (as a
    caller adding the two would: the fused kernel rounds it the same way)."""
    v = t["values"]
    adv = gae(t, s, acc, scan)[0].to(v.dtype)
    return adv, adv + v


def vtrace(t: Tensors, s: dict, acc: torch.dtype, scan: Scan) -> tuple[torch.Tensor, torch.Tensor]:
    r = _float(t, "rewards", acc)
    v = _float(t, "values", acc)
    term, trunc, bnd = _boundary(t, r)
    done = torch.maximum(term, trunc)
    v_next = _unless(term, _next_values(t, s, v, bnd, acc))
    # Importance weights are constants for the gradient (IMPALA stops gradients through them).
    ratio = torch.exp(_float(t, "log_pi_target", acc) - _float(t, "log_pi_behavior", acc)).detach()
    rho = torch.clamp(ratio, max=s["rho_bar"])
    c = torch.clamp(ratio, max=s["c_bar"])
    gamma = _discount(s, "gamma", acc)
    target = r + gamma * (1 - term) * v_next
    delta = rho * (target - v)
    d = scan(_unless(done, gamma * c * (1 - done)), delta, None, True)
    vs = v + d
    # q_t: vs_{t+1} = values_{t+1} + D_{t+1} inside the buffer, v_next_t at boundary steps (and at
    # terminated ones, where v_next is 0: q_t is not read there).
    q = torch.where(
        torch.maximum(bnd, term).bool(), v_next, shift(v, towards_future=True) + shift(d, towards_future=True)
    )
    adv = rho * (r + gamma * (1 - term) * q - v)
    return vs, adv


def retrace(t: Tensors, s: dict, acc: torch.dtype, scan: Scan) -> tuple[torch.Tensor, torch.Tensor]:
    r = _float(t, "rewards", acc)
    q = _float(t, "q_values", acc)
    term, trunc, bnd = _boundary(t, r)
    done = torch.maximum(term, trunc)
    probs = _float(t, "action_probs_target", acc).detach()
    pi = probs.gather(-1, t["actions"].long().unsqueeze(-1)).squeeze(-1)
    ratio = pi / _float(t, "action_probs_behavior", acc).detach()
    gamma = _discount(s, "gamma", acc)
    # c_t = lambda_t min(c_bar, ratio_t); step t's carry is scaled by gamma_t c_{t+1}
    c = _discount(s, "lambda_", acc) * torch.clamp(ratio, max=s["c_bar"])
    rho = torch.clamp(ratio, max=s["rho_bar"])
    weights = _float(t, "next_action_probs_target", acc)
    weights = probs if weights is None else weights.detach()
    # E_t is not read at terminated steps: both factors selected away there, so that neither the value
    # nor the gradient of next_q_values_all depends on what is stored at such a step.
    stop = term.bool().unsqueeze(-1)
    expected = (torch.where(stop, 0.0, weights) * torch.where(stop, 0.0, _float(t, "next_q_values_all", acc))).sum(-1)
    delta = r + gamma * (1 - term) * expected - q
    a = _unless(done, gamma * shift(c, towards_future=True) * (1 - done))
    d = scan(a, delta, None, True)
    q_targets = q + d
    x = torch.where(torch.maximum(bnd, term).bool(), expected, shift(q_targets, towards_future=True))
    adv = rho * (r + gamma * (1 - term) * x - q)
    return q_targets, adv


def lambda_returns(t: Tensors, s: dict, acc: torch.dtype, scan: Scan) -> tuple[torch.Tensor]:
    """Also the discounted returns: lambda_ = 1 and no next_values."""
    r = _float(t, "rewards", acc)
    term, trunc, bnd = _boundary(t, r)
    boot = _bootstrap(t, bnd, acc)
    lam = _discount(s, "lambda_", acc)
    nv = _float(t, "next_values", acc)
    # X_t without the recursive part: boot at truncations; (1-lam) nv_t + lam boot_t at the last step.
    # next_values are not read at truncations, nor X_t at terminated steps.
    x_const = lam * boot * (1 - trunc) + trunc * boot
    if nv is not None:
        x_const = x_const + (1 - trunc) * (1 - lam) * _unless(trunc, nv)
    disc = _discount(s, "gamma", acc) * (1 - term)
    return (scan(disc * lam * (1 - bnd), r + disc * _unless(term, x_const), None, True),)


def returns_advantages(t: Tensors, s: dict, acc: torch.dtype, scan: Scan) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`lambda_returns` and the advantages ``G - V(s)``, the difference taken in the inputs'
    dtype (as a caller subtracting the two would: the fused kernel rounds it the same way)."""
    v = t["values"]
    g = lambda_returns(t, s, acc, scan)[0].to(v.dtype)
    return g, g - v


def forward_trace(t: Tensors, s: dict, acc: torch.dtype, scan: Scan) -> tuple[torch.Tensor]:
    """Eligibility traces (scale = gamma*lambda, ends_at) and episodic prefix sums (scale = 1)."""
    x = _float(t, "inputs", acc)
    dones = _flag(t, "dones", x)
    if not s["starts_at"]:
        dones = shift(dones, towards_future=False)
    seed = _float(t, "seed_values", acc)
    return (scan(s["scale"] * (1 - dones), x, seed, False),)
