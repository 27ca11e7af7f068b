"""V-trace targets and policy-gradient advantages (``compute_vtrace`` and TorchRL's ``vtrace_with_next_values``),
top-down: the spec, the PyTorch path, the Triton prologue, epilogue and kernel, the argument builder and the ops.

::

    ratio_t = exp(log_pi_target_t - log_pi_behavior_t),  rho_t = min(rho_bar, ratio_t),  c_t = min(c_bar, ratio_t)
    delta_t = rho_t (r_t + gamma_t (1 - term_t) v_next_t - values_t)
    D_t = delta_t + gamma_t c_t (1 - done_t) D_{t+1},   vs_t = values_t + D_t
    advantages_t = rho_t (r_t + gamma_t (1 - term_t) q_t - values_t),  q_t = v_next_t if boundary_t else vs_{t+1}
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._discounts import disc, discount_of, hp
from ..kernels import core
from ..scan import shift
from .common import discount, next_value, step_context, store_off_policy
from .utils import Op, acc, as_float, bootstrap_flags, boundary, next_values, unless

# The spec (see ops/gae.py): vtrace_with_next_values passes next_values as bootstrap_values and dones as
# truncateds. Outputs: vs and the advantages.
TENSORS = (
    ("log_pi_target", "step"), ("log_pi_behavior", "step"), ("values", "step"), ("rewards", "step"),
    ("bootstrap_values", "step"), ("terminateds", "flag"), ("truncateds", "flag"), ("last_value", "env"),
)  # fmt: skip
REQUIRED = ("log_pi_target", "log_pi_behavior", "values", "rewards", "terminateds")
DIFFERENTIABLE = ("rewards", "values", "bootstrap_values", "last_value")
HYPERS = (("gamma", 1.0), ("rho_bar", None), ("c_bar", None))


# PyTorch path


def reference(t: dict, s: dict, acc: torch.dtype, scan) -> tuple[torch.Tensor, torch.Tensor]:
    r = as_float(t, "rewards", acc)
    v = as_float(t, "values", acc)
    term, trunc, bnd = boundary(t, r)
    done = torch.maximum(term, trunc)
    v_next = unless(term, next_values(t, s, v, bnd, acc))
    # Importance weights are constants for the gradient (IMPALA stops gradients through them).
    ratio = torch.exp(as_float(t, "log_pi_target", acc) - as_float(t, "log_pi_behavior", acc)).detach()
    rho = torch.clamp(ratio, max=s["rho_bar"])
    c = torch.clamp(ratio, max=s["c_bar"])
    gamma = discount_of(s, "gamma", acc)
    target = r + gamma * (1 - term) * v_next
    delta = rho * (target - v)
    d = scan(unless(done, gamma * c * (1 - done)), delta, None, True)
    vs = v + d
    # q_t: vs_{t+1} = values_{t+1} + D_{t+1} inside the buffer, v_next_t at boundary steps (and at
    # terminated ones, where v_next is 0: q_t is not read there).
    q = torch.where(
        torch.maximum(bnd, term).bool(), v_next, shift(v, towards_future=True) + shift(d, towards_future=True)
    )
    adv = rho * (r + gamma * (1 - term) * q - v)
    return vs, adv


# Triton path


@triton.jit
def vtrace_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """V-trace: (a, b) of D_t = b + a D_{t+1}, plus what the epilogue needs (rho, r, v, boundary, v_next).
    v_next is 0 at terminated steps and c_t is not read at done ones; the boundary flag passed on marks
    terminated steps too, where the epilogue's q_t is v_next (0) rather than vs_{t+1}."""
    HAS_TRUNC: tl.constexpr = K[0]
    HAS_BOOT: tl.constexpr = K[1]
    HAS_LAST: tl.constexpr = K[2]
    NEXT_ALL: tl.constexpr = K[3]
    G_TENSOR: tl.constexpr = K[4]
    p_lpt, p_lpb, p_r, p_v, p_term, p_trunc, p_boot, p_last, p_g, g_sn, g_st = ins
    gamma, rho_bar, c_bar = hps
    gamma = discount(gamma, p_g, g_sn, g_st, o_n, o_t, m, G_TENSOR, ACC)
    q_term, q_trunc, q_bnd, b_boot = step_context(
        p_term, p_trunc, p_boot, p_last, off, o_n, o_t, m, m_n, T, HAS_TRUNC, HAS_BOOT, HAS_LAST, ACC
    )
    b_r = tl.load(p_r + off, mask=m, other=0).to(ACC)
    b_v = tl.load(p_v + off, mask=m, other=0).to(ACC)
    b_vnext = tl.where(q_term, 0.0, next_value(p_v, p_boot, off, m, q_bnd, b_boot, NEXT_ALL, ACC, ST))
    b_lpt = tl.load(p_lpt + off, mask=m, other=0).to(ACC)
    b_lpb = tl.load(p_lpb + off, mask=m, other=0).to(ACC)
    b_ratio = tl.exp(b_lpt - b_lpb)
    b_rho = tl.minimum(b_ratio, rho_bar)
    # min(ratio, c_bar) as a select, c_bar for a NaN ratio on every backend (tl.minimum's on the GPU)
    b_c = tl.where(b_ratio < c_bar, b_ratio, c_bar)
    b_a = tl.where(q_term | q_trunc, 0.0, gamma * b_c)
    b_b = b_rho * (b_r + gamma * b_vnext - b_v)  # v_next (0 at terminated steps) stands for (1 - term) v_next
    # r and v are read again by the epilogue (L1 hits) rather than held across the scan and look-back
    ctx = (b_rho, q_bnd | q_term, b_vnext, gamma)
    return tl.where(m, b_a, 1.0), tl.where(m, b_b, 0.0), ctx


@triton.jit
def vtrace_epilogue(outs, ins, hps, ctx, b_d, b_d1, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    NEXT_ALL: tl.constexpr = K[3]
    p_vs, p_adv = outs
    b_rho, q_bnd, b_vnext, gamma = ctx  # boundary (or terminated) steps, v_next (vtrace_prologue)
    if NEXT_ALL:  # values_{t+1} (inside the buffer: no boundary at t, so t + 1 < T)
        b_v1 = tl.load(ins[3] + off + ST, mask=m & ~q_bnd, other=0).to(ACC)
    else:
        b_v1 = b_vnext
    b_r = tl.load(ins[2] + off, mask=m, other=0).to(ACC)
    b_v = tl.load(ins[3] + off, mask=m, other=0).to(ACC)
    # vs_{t+1} = values_{t+1} + D_{t+1} inside the buffer; v_next (0) at terminated steps too
    store_off_policy(p_vs, p_adv, (b_rho, b_r, b_v, q_bnd, b_vnext, gamma), b_d, b_v1, b_d1, off, m)


@triton.jit(do_not_specialize=["N", "NK", "CPB", "gamma_hi", "gamma_lo", "rho_hi", "rho_lo", "c_hi", "c_lo"])
def vtrace_kernel(
    p_lpt,  # [N, T] log pi_target(a_t | s_t)
    p_lpb,  # [N, T] log pi_behavior(a_t | s_t)
    p_v,  # [N, T] values
    p_r,  # [N, T] rewards
    p_term, p_trunc, p_boot, p_last,  # flags and bootstrap values as in gae_kernel
    p_vs,  # [N, T] output v-trace targets
    p_adv,  # [N, T] output policy-gradient advantages
    N, T,
    gamma_hi, gamma_lo, p_gamma, gamma_sn, gamma_st,  # gamma: a float's halves or a tensor (see gae_kernel)
    rho_hi, rho_lo, c_hi, c_lo,
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block (see gae_kernel)
    HAS_TRUNC: tl.constexpr, HAS_BOOT: tl.constexpr, HAS_LAST: tl.constexpr, NEXT_ALL: tl.constexpr,
    PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr, BT: tl.constexpr,
    NKP: tl.constexpr,
    FORM: tl.constexpr,  # tile form (kernels/core.py)
    EXACT_T: tl.constexpr = False,  # env-major rows of T == BT steps: see gae_kernel
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV: see gae_kernel
    TM: tl.constexpr = 0,  # time-major rows: see gae_kernel
    WHOLE: tl.constexpr = False,  # rows of whole chunks: see gae_kernel
    LATE: tl.constexpr = False,  # see gae_kernel
    G_TENSOR: tl.constexpr = False,  # a tensor gamma: see gae_kernel
):  # fmt: skip
    core.scan_rows(
        (p_lpt, p_lpb, p_r, p_v, p_term, p_trunc, p_boot, p_last, p_gamma, gamma_sn, gamma_st), (p_vs, p_adv),
        (gamma_hi, gamma_lo, rho_hi, rho_lo, c_hi, c_lo), N, T, p_agg_a, p_agg_b, p_flag, NK, CPB,
        core.hp_scalars, vtrace_prologue, vtrace_epilogue, (HAS_TRUNC, HAS_BOOT, HAS_LAST, NEXT_ALL, G_TENSOR),
        PHASE, ONE, ACC, BN, BT, NKP, FORM, EXACT_T, TDIV, TM, WHOLE,
        REVERSE=True, NEXT=True, FULL=WHOLE, LATE=LATE,  # not EXACT_T: core.env_block
    )  # fmt: skip


# Host side: the kernel's arguments and constexprs


def args(lpi, lmu, v, r, boot, term, trunc, last, vs, adv, n: int, t: int, gamma, rho_bar, c_bar) -> tuple:
    """The kernel's arguments (see ops/gae.py's ``args``)."""
    return (
        lpi, lmu, v, r, term, r if trunc is None else trunc, r if boot is None else boot, r if last is None else last,
        vs, adv, n, t, *((*hp(gamma), r, 0, 0) if type(gamma) is float else disc(gamma, r)), *hp(rho_bar), *hp(c_bar),
    )  # fmt: skip


def constexprs(p, s: dict, two: bool) -> dict:
    gamma = s["gamma"]
    return dict(**bootstrap_flags(p.tensors, s["next_all"]), G_TENSOR=isinstance(gamma, torch.Tensor), ACC=acc(p.dtype))


def kind(t: dict) -> str:
    return "vtrace"


VTRACE = Op(
    "compute_vtrace", TENSORS, REQUIRED, DIFFERENTIABLE, HYPERS, reference, vtrace_kernel, args, constexprs, kind,
    ("vtrace", False), two=True, consts={"next_all": False}, data=("terminateds", "truncateds", "bootstrap_values"),
)  # fmt: skip
VTRACE_NEXT = VTRACE.variant(fn="vtrace_with_next_values", at=("vtrace", True), consts={"next_all": True}, data=None)
