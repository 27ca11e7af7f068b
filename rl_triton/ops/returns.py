"""Discounted and TD(lambda) returns, one kernel (``compute_discounted_returns``, ``compute_lambda_returns`` and the
modules' ``returns_with_advantages``), top-down: the spec, the PyTorch path, the Triton prologue, epilogue and
kernel, the argument builders and the ops.

::

    X_t = boot_t                              if trunc_t
        = (1 - lambda_t) nv_t + lambda_t boot_t   if t == T-1 (and not truncated)
        = (1 - lambda_t) nv_t + lambda_t G_{t+1}  otherwise
    G_t = r_t + gamma_t (1 - term_t) X_t

Without next values (nv_t = 0) and with lambda = 1 these are the discounted returns.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._discounts import disc, discount_of, hp, tensor_flags
from ..kernels import core
from .common import discount, step_context, store_with_value
from .utils import Op, acc, as_float, bootstrap, boundary, unless

# The spec (see ops/gae.py), per function: the discounted returns take no next_values, the lambda returns no
# values; returns_with_advantages takes the values for its second output, G - values.
DISCOUNTED = (("rewards", "step"), ("bootstrap_values", "step"), ("terminateds", "flag"), ("truncateds", "flag"))
LAMBDA = (
    ("rewards", "step"), ("next_values", "step"), ("bootstrap_values", "step"), ("terminateds", "flag"),
    ("truncateds", "flag"),
)  # fmt: skip
WITH_ADVANTAGES = (("rewards", "step"), ("values", "step"), *LAMBDA[1:])
DIFFERENTIABLE = ("rewards", "values", "next_values", "bootstrap_values")
HYPERS = (("gamma", 1.0), ("lambda_", 1.0))  # compute_discounted_returns passes lambda_ = 1.0


# PyTorch path


def reference(t: dict, s: dict, acc: torch.dtype, scan) -> tuple[torch.Tensor]:
    """Also the discounted returns: lambda_ = 1 and no next_values."""
    r = as_float(t, "rewards", acc)
    term, trunc, bnd = boundary(t, r)
    boot = bootstrap(t, bnd, acc)
    lam = discount_of(s, "lambda_", acc)
    nv = as_float(t, "next_values", acc)
    # X_t without the recursive part: boot at truncations; (1-lam) nv_t + lam boot_t at the last step.
    # next_values are not read at truncations, nor X_t at terminated steps.
    x_const = lam * boot * (1 - trunc) + trunc * boot
    if nv is not None:
        x_const = x_const + (1 - trunc) * (1 - lam) * unless(trunc, nv)
    disc = discount_of(s, "gamma", acc) * (1 - term)
    return (scan(disc * lam * (1 - bnd), r + disc * unless(term, x_const), None, True),)


def reference_advantages(t: dict, s: dict, acc: torch.dtype, scan) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`reference` and the advantages ``G - V(s)``, the difference taken in the inputs'
    dtype (as a caller subtracting the two would: the fused kernel rounds it the same way)."""
    v = t["values"]
    g = reference(t, s, acc, scan)[0].to(v.dtype)
    return g, g - v


# Triton path


@triton.jit
def returns_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """TD(lambda) returns: a_t = gamma_t lambda_t (0 at done steps and boundaries), b_t = r_t + gamma_t X_t
    with X_t the bootstrap part of the return's target."""
    HAS_NV: tl.constexpr = K[0]
    HAS_TRUNC: tl.constexpr = K[1]
    HAS_BOOT: tl.constexpr = K[2]
    EXACT_T: tl.constexpr = K[4]
    G_TENSOR: tl.constexpr = K[5]
    L_TENSOR: tl.constexpr = K[6]
    p_r, p_nv, p_term, p_trunc, p_boot, p_v, p_g, g_sn, g_st, p_l, l_sn, l_st = ins
    gamma, lmbda = hps
    gamma = discount(gamma, p_g, g_sn, g_st, o_n, o_t, m, G_TENSOR, ACC)
    lmbda = discount(lmbda, p_l, l_sn, l_st, o_n, o_t, m, L_TENSOR, ACC)
    q_term, q_trunc, q_bnd, b_boot = step_context(
        p_term, p_trunc, p_boot, p_boot, off, o_n, o_t, m, m_n, T, HAS_TRUNC, HAS_BOOT, False, ACC
    )
    b_trunc = q_trunc.to(ACC)
    b_r = tl.load(p_r + off, mask=m, other=0).to(ACC)
    # X_t minus its recursive part: boot at truncations, (1-lam) nv + lam boot at the last step; the next
    # values are not read at truncations (X_t = boot_t), nor X_t at terminated steps (selected to 0).
    if HAS_NV and EXACT_T:
        # Which of the two products the compiler contracts into an FMA depends on the tile layout; spelled
        # out, a row's bits do not depend on the number of envs.
        b_nv = tl.where(q_trunc, 0.0, tl.load(p_nv + off, mask=m, other=0).to(ACC))
        b_x = tl.fma(b_boot, b_trunc + lmbda * (1 - b_trunc), (1 - b_trunc) * (1 - lmbda) * b_nv)
    else:
        b_x = b_boot * (b_trunc + lmbda * (1 - b_trunc))
        if HAS_NV:
            b_nv = tl.where(q_trunc, 0.0, tl.load(p_nv + off, mask=m, other=0).to(ACC))
            b_x += (1 - b_trunc) * (1 - lmbda) * b_nv
    b_x = tl.where(q_term, 0.0, b_x)  # also stands for the factor (1 - term_t) of gamma (1 - term_t) X_t
    b_a = tl.where(m, tl.where(q_term | q_bnd, 0.0, gamma * lmbda), 1.0)  # where gamma (1-term) lam (1-bnd) was
    if HAS_BOOT or HAS_NV:
        b_b = tl.where(m, b_r + gamma * b_x, 0.0)
    else:  # X_t minus its recursive part is 0 (r + gamma 0 is r)
        b_b = tl.where(m, b_r, 0.0)
    return b_a, b_b, ()


@triton.jit
def returns_epilogue(outs, ins, hps, ctx, b_g, b_gn, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    ADV: tl.constexpr = K[3]
    store_with_value(outs[0], outs[1], b_g, ins[5], off, m, ADV, True, ACC)


@triton.jit(do_not_specialize=["N", "NK", "CPB", "gamma_hi", "gamma_lo", "lmbda_hi", "lmbda_lo"])
def returns_kernel(
    p_r,  # [N, T] rewards
    p_nv,  # [N, T] next values V(s_{t+1}) (if HAS_NV; TD(lambda) returns)
    p_term, p_trunc, p_boot,  # flags and bootstrap values as in gae_kernel
    p_v,  # [N, T] values V(s_t) (if ADV)
    p_g,  # [N, T] output returns
    p_adv,  # [N, T] output advantages G_t - V(s_t) (if ADV)
    N, T,
    gamma_hi, gamma_lo, p_gamma, gamma_sn, gamma_st,  # gamma and lambda: a float's halves or a tensor (gae_kernel)
    lmbda_hi, lmbda_lo, p_lmbda, lmbda_sn, lmbda_st,
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block (see gae_kernel)
    HAS_NV: tl.constexpr, HAS_TRUNC: tl.constexpr, HAS_BOOT: tl.constexpr,
    ADV: tl.constexpr,  # also store the advantages
    PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr,
    NKP: tl.constexpr,
    FORM: tl.constexpr,  # tile form (kernels/core.py)
    EXACT_T: tl.constexpr = False,  # env-major rows of T == BT steps: see gae_kernel
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV: see gae_kernel
    TM: tl.constexpr = 0,  # time-major rows: see gae_kernel
    WHOLE: tl.constexpr = False,  # rows of whole chunks: see gae_kernel
    LATE: tl.constexpr = False,  # see gae_kernel
    G_TENSOR: tl.constexpr = False,  # tensor gamma, lambda: see gae_kernel
    L_TENSOR: tl.constexpr = False,
):  # fmt: skip
    """TD(lambda) returns; with lambda = 1 and no next values, discounted returns."""
    core.scan_rows(
        (p_r, p_nv, p_term, p_trunc, p_boot, p_v, p_gamma, gamma_sn, gamma_st, p_lmbda, lmbda_sn, lmbda_st),
        (p_g, p_adv), (gamma_hi, gamma_lo, lmbda_hi, lmbda_lo), N, T,
        p_agg_a, p_agg_b, p_flag, NK, CPB, core.hp_scalars, returns_prologue, returns_epilogue,
        (HAS_NV, HAS_TRUNC, HAS_BOOT, ADV, EXACT_T, G_TENSOR, L_TENSOR),
        PHASE, ONE, ACC, BN, BT, NKP, FORM, EXACT_T, TDIV, TM, WHOLE, REVERSE=True, FULL=EXACT_T or WHOLE, LATE=LATE,
    )  # fmt: skip


# Host side: the kernel's arguments (one builder per function's tensors) and constexprs


def _args(r, nv, term, trunc, boot, v, out, adv, n: int, t: int, gamma, lambda_) -> tuple:
    g = (*hp(gamma), r, 0, 0) if type(gamma) is float else disc(gamma, r)
    lam = (*hp(lambda_), r, 0, 0) if type(lambda_) is float else disc(lambda_, r)
    return (
        r, r if nv is None else nv, term, r if trunc is None else trunc, r if boot is None else boot,
        r if v is None else v, out, adv, n, t, *g, *lam,
    )  # fmt: skip


def args_discounted(r, boot, term, trunc, out, adv, n: int, t: int, gamma, lambda_) -> tuple:
    return _args(r, None, term, trunc, boot, None, out, adv, n, t, gamma, lambda_)


def args_lambda(r, nv, boot, term, trunc, out, adv, n: int, t: int, gamma, lambda_) -> tuple:
    return _args(r, nv, term, trunc, boot, None, out, adv, n, t, gamma, lambda_)


def args_advantages(r, v, nv, boot, term, trunc, out, adv, n: int, t: int, gamma, lambda_) -> tuple:
    return _args(r, nv, term, trunc, boot, v, out, adv, n, t, gamma, lambda_)


def constexprs(p, s: dict, two: bool) -> dict:
    t = p.tensors
    return dict(
        HAS_NV=t.get("next_values") is not None, HAS_TRUNC=t.get("truncateds") is not None,
        HAS_BOOT=t.get("bootstrap_values") is not None, ADV=two, ACC=acc(p.dtype),
        **tensor_flags(s["gamma"], s["lambda_"]),
    )  # fmt: skip


def kind(t: dict) -> str:
    """Returns with next values have launch plans of their own."""
    return "returns_nv" if t.get("next_values") is not None else "returns"


_DATA = ("terminateds", "truncateds", "bootstrap_values")
DISCOUNTED_RETURNS = Op(
    "compute_discounted_returns", DISCOUNTED, ("rewards", "terminateds"), ("rewards", "bootstrap_values"), HYPERS,
    reference, returns_kernel, args_discounted, constexprs, kind, ("returns", False), data=_DATA,
)  # fmt: skip
LAMBDA_RETURNS = DISCOUNTED_RETURNS.variant(
    fn="compute_lambda_returns", tensors=LAMBDA, required=("rewards", "next_values", "terminateds"),
    differentiable=("rewards", "next_values", "bootstrap_values"), args=args_lambda,
)  # fmt: skip
RETURNS_WITH_ADVANTAGES = DISCOUNTED_RETURNS.variant(
    fn="returns_with_advantages", tensors=WITH_ADVANTAGES, required=("rewards", "values", "terminateds"),
    differentiable=DIFFERENTIABLE, reference=reference_advantages, args=args_advantages, at=("returns", True),
    two=True,
)  # fmt: skip
