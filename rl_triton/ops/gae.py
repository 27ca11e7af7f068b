"""Generalized Advantage Estimation (``compute_gae`` and TorchRL's ``gae_with_next_values``), top-down: the spec,
the PyTorch path, the Triton prologue, epilogue and kernel, the argument builder and the ops.

::

    v_next_t = boot_t if boundary_t else values_{t+1}    (next_values_t at every step: NEXT_ALL)
    delta_t  = r_t + gamma_t (1 - term_t) v_next_t - values_t
    A_t      = delta_t + gamma_t lambda_t (1 - done_t) A_{t+1},    A_T = 0
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._discounts import disc, discount_of, hp, tensor_flags
from ..kernels import core
from ..kernels.core import hp_scalar
from .common import discount, next_value, step_context, store_with_value
from .utils import Op, acc, as_float, bootstrap_flags, boundary, next_values, unless

# The spec: the tensors in the validation cache key's order and their roles, the required and the differentiable
# ones, the hyper-parameters (1.0: a discount in [0, 1]). gae_with_next_values passes next_values as
# bootstrap_values and dones as truncateds. Outputs: the advantages; with TARGET also A + values.
TENSORS = (
    ("rewards", "step"), ("values", "step"), ("bootstrap_values", "step"), ("terminateds", "flag"),
    ("truncateds", "flag"), ("last_value", "env"),
)  # fmt: skip
REQUIRED = ("rewards", "values", "terminateds")
DIFFERENTIABLE = ("rewards", "values", "bootstrap_values", "last_value")
HYPERS = (("gamma", 1.0), ("lambda_", 1.0))


# PyTorch path


def reference(t: dict, s: dict, acc: torch.dtype, scan) -> tuple[torch.Tensor]:
    r = as_float(t, "rewards", acc)
    v = as_float(t, "values", acc)
    term, trunc, bnd = boundary(t, r)
    done = torch.maximum(term, trunc)
    v_next = unless(term, next_values(t, s, v, bnd, acc))
    gamma = discount_of(s, "gamma", acc)
    delta = r + gamma * (1 - term) * v_next - v
    a = unless(done, gamma * discount_of(s, "lambda_", acc) * (1 - done))
    return (scan(a, delta, None, True),)


def reference_targets(t: dict, s: dict, acc: torch.dtype, scan) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE's advantages and value targets ``A + V(s)``, the sum taken in the inputs' dtype (as a
    caller adding the two would: the fused kernel rounds it the same way)."""
    v = t["values"]
    adv = reference(t, s, acc, scan)[0].to(v.dtype)
    return adv, adv + v


# Triton path


@triton.jit
def gae_scalars(hp, ACC: tl.constexpr):
    """(gamma, gamma lambda, lambda): the last for a tensor gamma or lambda_ (unused, so dropped, otherwise)."""
    gamma = hp_scalar(hp[0], hp[1], ACC)
    lmbda = hp_scalar(hp[2], hp[3], ACC)
    return gamma, gamma * lmbda, lmbda


@triton.jit
def gae_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """GAE: a_t = gamma_t lambda_t (0 at done steps), b_t = delta_t."""
    HAS_TRUNC: tl.constexpr = K[0]
    HAS_BOOT: tl.constexpr = K[1]
    HAS_LAST: tl.constexpr = K[2]
    NEXT_ALL: tl.constexpr = K[3]
    G_TENSOR: tl.constexpr = K[5]
    L_TENSOR: tl.constexpr = K[6]
    p_r, p_v, p_term, p_trunc, p_boot, p_last, p_g, g_sn, g_st, p_l, l_sn, l_st = ins
    gamma, gl, lmbda = hps
    if G_TENSOR or L_TENSOR:
        gamma = discount(gamma, p_g, g_sn, g_st, o_n, o_t, m, G_TENSOR, ACC)
        gl = gamma * discount(lmbda, p_l, l_sn, l_st, o_n, o_t, m, L_TENSOR, ACC)
    q_term, q_trunc, q_bnd, b_boot = step_context(
        p_term, p_trunc, p_boot, p_last, off, o_n, o_t, m, m_n, T, HAS_TRUNC, HAS_BOOT, HAS_LAST, ACC
    )
    b_r = tl.load(p_r + off, mask=m, other=0).to(ACC)
    b_v = tl.load(p_v + off, mask=m, other=0).to(ACC)
    # v_next_t is not read at terminated steps: 0 there, which also stands for the factor (1 - term_t)
    b_vnext = tl.where(q_term, 0.0, next_value(p_v, p_boot, off, m, q_bnd, b_boot, NEXT_ALL, ACC, ST))
    b_delta = b_r + gamma * b_vnext - b_v
    b_a = tl.where(m, tl.where(q_term | q_trunc, 0.0, gl), 1.0)
    b_b = tl.where(m, b_delta, 0.0)
    return b_a, b_b, ()


@triton.jit
def gae_epilogue(outs, ins, hps, ctx, b_x, b_xn, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    TARGET: tl.constexpr = K[4]
    store_with_value(outs[0], outs[1], b_x, ins[1], off, m, TARGET, False, ACC)


@triton.jit(do_not_specialize=["N", "NK", "CPB", "gamma_hi", "gamma_lo", "lmbda_hi", "lmbda_lo"])
def gae_kernel(
    p_r,  # [N, T] rewards
    p_v,  # [N, T] values V(s_t)
    p_term,  # [N, T] terminateds (any dtype)
    p_trunc,  # [N, T] truncateds (if HAS_TRUNC)
    p_boot,  # [N, T] bootstrap values (if HAS_BOOT)
    p_last,  # [N] last value (if HAS_LAST)
    p_adv,  # [N, T] output advantages
    p_tgt,  # [N, T] output value targets A_t + V(s_t) (if TARGET)
    N, T,  # envs, steps
    # gamma and lambda: float32 hi/lo halves of a float; a tensor's (N, T) view and its strides (G_TENSOR, L_TENSOR)
    gamma_hi, gamma_lo, p_gamma, gamma_sn, gamma_st, lmbda_hi, lmbda_lo, p_lmbda, lmbda_sn, lmbda_st,
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block: aggregates, flags (core.lookback), blocks, chunks/block
    HAS_TRUNC: tl.constexpr, HAS_BOOT: tl.constexpr, HAS_LAST: tl.constexpr,
    NEXT_ALL: tl.constexpr,  # v_next_t = p_boot[t] at every step (TorchRL's ("next", value) form)
    TARGET: tl.constexpr,  # also store the value targets
    PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr,
    NKP: tl.constexpr,
    FORM: tl.constexpr,  # tile form (kernels/core.py)
    # Env-major rows of one chunk, T == BT (Plan.exact_t): the row length as a constexpr, so that Triton
    # knows every row 16-byte aligned (it specialises T on multiples of 16 only, which 4 and 8 are not)
    # and vectorises the loads; as retrace_kernel's.
    EXACT_T: tl.constexpr = False,
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV (core.row_length; plans.row_div)
    TM: tl.constexpr = 0,  # time-major rows (core.time_stride; Plan.env_div)
    WHOLE: tl.constexpr = False,  # T a multiple of BT, rows of whole chunks (core.chunk; Plan.whole)
    LATE: tl.constexpr = False,  # plain walk, outputs stored, then one test (core.late_rows; Plan.late)
    G_TENSOR: tl.constexpr = False,  # gamma is the tensor at p_gamma (discount), not the float gamma_hi + gamma_lo
    L_TENSOR: tl.constexpr = False,  # lambda likewise
):  # fmt: skip
    core.scan_rows(
        (p_r, p_v, p_term, p_trunc, p_boot, p_last, p_gamma, gamma_sn, gamma_st, p_lmbda, lmbda_sn, lmbda_st),
        (p_adv, p_tgt), (gamma_hi, gamma_lo, lmbda_hi, lmbda_lo), N, T,
        p_agg_a, p_agg_b, p_flag, NK, CPB, gae_scalars, gae_prologue, gae_epilogue,
        (HAS_TRUNC, HAS_BOOT, HAS_LAST, NEXT_ALL, TARGET, G_TENSOR, L_TENSOR),
        PHASE, ONE, ACC, BN, BT, NKP, FORM, EXACT_T, TDIV, TM, WHOLE, REVERSE=True, FULL=EXACT_T or WHOLE, LATE=LATE,
    )  # fmt: skip


# Host side: the kernel's arguments and constexprs


def args(r, v, boot, term, trunc, last, out, tgt, n: int, t: int, gamma, lambda_) -> tuple:
    """The kernel's arguments from the tensors in key order (an absent optional input passes ``r``, never
    read), the outputs, the shape and the hyper-parameters (a float, or the (N, T) view of a tensor)."""
    g = (*hp(gamma), r, 0, 0) if type(gamma) is float else disc(gamma, r)
    lam = (*hp(lambda_), r, 0, 0) if type(lambda_) is float else disc(lambda_, r)
    return (
        r, v, term, r if trunc is None else trunc, r if boot is None else boot, r if last is None else last, out,
        tgt, n, t, *g, *lam,
    )  # fmt: skip


def constexprs(p, s: dict, two: bool) -> dict:
    return dict(
        **bootstrap_flags(p.tensors, s["next_all"]), TARGET=two, **tensor_flags(s["gamma"], s["lambda_"]),
        ACC=acc(p.dtype),
    )  # fmt: skip


def kind(t: dict) -> str:
    return "gae"


GAE = Op(
    "compute_gae", TENSORS, REQUIRED, DIFFERENTIABLE, HYPERS, reference, gae_kernel, args, constexprs, kind,
    ("gae", False, False), consts={"next_all": False}, data=("terminateds", "truncateds", "bootstrap_values"),
)  # fmt: skip
GAE_NEXT = GAE.variant(
    fn="gae_with_next_values", required=(*REQUIRED, "bootstrap_values"), at=("gae", True, False),
    consts={"next_all": True}, data=None,
)  # fmt: skip
GAE_NEXT_TARGETS = GAE_NEXT.variant(reference=reference_targets, at=("gae", True, True), two=True)
