"""Retrace(lambda) Q targets and advantages for discrete actions (``compute_retrace``), top-down: the spec, the
PyTorch path, the Triton prologue, epilogue and kernel, the argument builder and the op.

::

    ratio_t = action_probs_target[t, a_t] / action_probs_behavior_t
    c_t = lambda_t min(c_bar, ratio_t),   rho_t = min(rho_bar, ratio_t),   E_t = sum_a w[t, a] next_q_values_all[t, a]
    Delta_t = r_t + gamma_t (1 - term_t) E_t - q_t + gamma_t c_{t+1} (1 - done_t) Delta_{t+1}
    advantages_t = rho_t (r_t + gamma_t (1 - term_t) X_t - q_t),   X_t = E_t if boundary_t else q_targets_{t+1}
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._discounts import disc, discount_of, hp, tensor_flags
from ..kernels import core, plans
from ..kernels.core import ENV_GROUPS
from ..scan import shift
from .common import discount, step_context, store_off_policy
from .utils import Op, acc, as_float, boundary, unless

# The spec (see ops/gae.py). Outputs: the Q targets and the advantages.
TENSORS = (
    ("action_probs_behavior", "step"), ("q_values", "step"), ("rewards", "step"), ("terminateds", "flag"),
    ("truncateds", "flag"), ("action_probs_target", "action"), ("next_q_values_all", "action"),
    ("next_action_probs_target", "action"), ("actions", "actions"),
)  # fmt: skip
REQUIRED = (
    "action_probs_target", "action_probs_behavior", "q_values", "next_q_values_all", "actions", "rewards",
    "terminateds", "truncateds",
)  # fmt: skip
DIFFERENTIABLE = ("rewards", "q_values", "next_q_values_all")
HYPERS = (("gamma", 1.0), ("lambda_", 1.0), ("c_bar", None), ("rho_bar", None))


# PyTorch path


def reference(t: dict, s: dict, acc: torch.dtype, scan) -> tuple[torch.Tensor, torch.Tensor]:
    r = as_float(t, "rewards", acc)
    q = as_float(t, "q_values", acc)
    term, trunc, bnd = boundary(t, r)
    done = torch.maximum(term, trunc)
    probs = as_float(t, "action_probs_target", acc).detach()
    pi = probs.gather(-1, t["actions"].long().unsqueeze(-1)).squeeze(-1)
    ratio = pi / as_float(t, "action_probs_behavior", acc).detach()
    gamma = discount_of(s, "gamma", acc)
    # c_t = lambda_t min(c_bar, ratio_t); step t's carry is scaled by gamma_t c_{t+1}
    c = discount_of(s, "lambda_", acc) * torch.clamp(ratio, max=s["c_bar"])
    rho = torch.clamp(ratio, max=s["rho_bar"])
    weights = as_float(t, "next_action_probs_target", acc)
    weights = probs if weights is None else weights.detach()
    # E_t is not read at terminated steps: both factors selected away there, so that neither the value
    # nor the gradient of next_q_values_all depends on what is stored at such a step.
    stop = term.bool().unsqueeze(-1)
    expected = (torch.where(stop, 0.0, weights) * torch.where(stop, 0.0, as_float(t, "next_q_values_all", acc))).sum(-1)
    delta = r + gamma * (1 - term) * expected - q
    a = unless(done, gamma * shift(c, towards_future=True) * (1 - done))
    d = scan(a, delta, None, True)
    q_targets = q + d
    x = torch.where(torch.maximum(bnd, term).bool(), expected, shift(q_targets, towards_future=True))
    adv = rho * (r + gamma * (1 - term) * x - q)
    return q_targets, adv


# Triton path


@triton.jit
def _action_dot(p_w, p_nq, off, m, A: tl.constexpr, COL: tl.constexpr, W: tl.constexpr, ACC: tl.constexpr):
    """sum over actions COL .. COL + W - 1 (those < A) of w[., a] * nq[., a], from [..., W] tiles."""
    ax: tl.constexpr = len(off.shape)
    o_a = COL + tl.arange(0, W)
    off_a = tl.expand_dims(off, ax) * A + o_a
    m_a = tl.expand_dims(m, ax) & (o_a < A)
    b_w = tl.load(p_w + off_a, mask=m_a, other=0).to(ACC)
    return tl.sum(b_w * tl.load(p_nq + off_a, mask=m_a, other=0).to(ACC), ax)


@triton.jit
def _action_dot_pick(p_w, p_nq, off, m, b_act, m_act, A: tl.constexpr, AP: tl.constexpr, ACC: tl.constexpr):
    """:func:`_action_dot` over one tile of AP actions, and w[., a_t] picked out of its weights tile
    (NaN where ``m_act`` is false: an action outside [0, A))."""
    ax: tl.constexpr = len(off.shape)
    o_a = tl.arange(0, AP)
    off_a = tl.expand_dims(off, ax) * A + o_a
    m_a = tl.expand_dims(m, ax) & (o_a < A)
    b_w = tl.load(p_w + off_a, mask=m_a, other=0).to(ACC)
    b_e = tl.sum(b_w * tl.load(p_nq + off_a, mask=m_a, other=0).to(ACC), ax)
    b_pi = tl.sum(tl.where(tl.expand_dims(b_act, ax) == o_a, b_w, 0.0), ax)
    return b_e, tl.where(m_act, b_pi, float("nan"))


@triton.jit
def _term_like_e(p_term, off, m, AP: tl.constexpr):
    """The terminated flags (any dtype, nonzero: set) as a boolean in the layout of E_t, the reduction over an
    action axis: read once more through an [..., AP] tile (one lane per step loads) and reduced over it. With
    8-byte flags and a row divisor, Triton 3.6 gave the flags a load layout whose boolean mask it then converted
    to E_t's layout inside each warp with byte permutes, and that conversion is miscompiled (masks of the wrong
    steps and envs); a mask made in E_t's layout needs no conversion."""
    ax: tl.constexpr = len(off.shape)
    o_a = tl.arange(0, AP)
    b_f = tl.load(p_term + tl.expand_dims(off, ax) + o_a * 0, mask=tl.expand_dims(m, ax) & (o_a == 0), other=0)
    return tl.max((b_f != 0).to(tl.int32), ax) != 0


@triton.jit
def _env_next(x):
    """An env-major [BN, G, 4] tile of one chunk (G <= 2 groups, the latest first) one step later in
    time: slot t holds x_{t+1}, 0 past the chunk's last step. Registers only (no reload at off + 1)."""
    x0, x1, x2, x3 = core._split4(x)  # [BN, G] each
    if x.shape[1] == 1:
        n0 = tl.zeros_like(x0)
    else:
        tl.static_assert(x.shape[1] == 2, "env-major chunks of at most 8 steps")
        x0_late, _x0_early = tl.split(x0)  # step 4 of the row; step 0
        n0 = tl.join(tl.zeros_like(x0_late), x0_late)  # the earlier group's step 3 is followed by step 4
    return core._join4(x1, x2, x3, n0)


@triton.jit
def retrace_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """Retrace: (a, b) of Delta_t = b + a Delta_{t+1}, plus (rho, r, q, boundary, E) for the epilogue. SHIFT
    (env-major rows of one chunk) takes c_{t+1} from the tile in registers (:func:`_env_next`) instead of
    loading the actions, probabilities and behaviour probabilities again at off + ST; PI_TILE (p_w is p_pt, one
    action tile) picks pi(a_t | s_t) out of the weights tile instead of gathering the same bytes again. Without
    them the loads keep their order (placing the gather of pi(a_t | s_t) after the action tiles measured slower:
    docs/performance.md). c_{t+1} is not read at done steps nor E_t at terminated ones (0); the boundary flag
    passed on marks terminated steps too, where the epilogue's X_t is E_t (0) rather than q_targets_{t+1}."""
    A: tl.constexpr = K[0]
    AP: tl.constexpr = K[1]
    PIECES: tl.constexpr = K[2]
    HAS_TRUNC: tl.constexpr = K[3]
    SHIFT: tl.constexpr = K[4]
    PI_TILE: tl.constexpr = K[5]
    G_TENSOR: tl.constexpr = K[6]
    L_TENSOR: tl.constexpr = K[7]
    p_pt, p_w, p_pb, p_q, p_nq, p_act, p_r, p_term, p_trunc, p_g, g_sn, g_st, p_l, l_sn, l_st = ins
    gamma, lmbda, c_bar, rho_bar = hps
    gamma = discount(gamma, p_g, g_sn, g_st, o_n, o_t, m, G_TENSOR, ACC)
    q_term, q_trunc, q_bnd, _ = step_context(
        p_term, p_trunc, p_term, p_term, off, o_t, o_t, m, m, T, HAS_TRUNC, False, False, ACC
    )
    b_r = tl.load(p_r + off, mask=m, other=0).to(ACC)
    b_q = tl.load(p_q + off, mask=m, other=0).to(ACC)
    # pi(a_t | s_t) / mu(a_t | s_t); an action outside [0, A) gives NaN, never a wrong number.
    b_act = tl.load(p_act + off, mask=m, other=0)
    m_act = m & (b_act >= 0) & (b_act < A)
    if PI_TILE:
        tl.static_assert(not PIECES, "PI_TILE: one action tile")
        b_e, b_pi = _action_dot_pick(p_w, p_nq, off, m, b_act, m_act, A, AP, ACC)
    else:
        b_pi = tl.load(p_pt + off * A + b_act, mask=m_act, other=float("nan")).to(ACC)
    b_ratio = b_pi / tl.load(p_pb + off, mask=m, other=1).to(ACC)
    b_rho = tl.minimum(b_ratio, rho_bar)
    # c_{t+1}; zero past the last step. min(ratio, c_bar) as a select: c_bar for a NaN ratio (an action out of
    # range) on every backend, as tl.minimum gives on the GPU, so that the coefficient stays finite.
    m1 = m & (o_t + 1 < T)
    if SHIFT:  # lambda_t's tile shifts with the ratio's: lambda_{t+1} at slot t
        b_lmbda = discount(lmbda, p_l, l_sn, l_st, o_n, o_t, m, L_TENSOR, ACC)
        b_c1 = tl.where(m1, _env_next(b_lmbda * tl.where(b_ratio < c_bar, b_ratio, c_bar)), 0.0)
    else:
        b_act1 = tl.load(p_act + off + ST, mask=m1, other=0)
        m_act1 = m1 & (b_act1 >= 0) & (b_act1 < A)
        b_pi1 = tl.load(p_pt + (off + ST) * A + b_act1, mask=m_act1, other=float("nan")).to(ACC)
        b_ratio1 = b_pi1 / tl.load(p_pb + off + ST, mask=m1, other=1).to(ACC)
        b_lmbda1 = discount(lmbda, p_l, l_sn, l_st, o_n, o_t + 1, m1, L_TENSOR, ACC)  # lambda_{t+1}
        b_c1 = tl.where(m1, b_lmbda1 * tl.where(b_ratio1 < c_bar, b_ratio1, c_bar), 0.0)
    # E_t = sum_a w[t, a] Q(s_{t+1}, a), from [..., W] tiles: the A actions of a step are contiguous, so
    # the rows load as vectors (A is a constexpr); a loop over actions loaded every A-th element instead.
    # PIECES: one tile per binary digit of A (18 = 16 + 2), no padded lanes; else one tile of AP.
    if PIECES:
        tl.static_assert(A < (1 << 21), "PIECES: at most 2^21 - 1 actions")
        b_e = tl.zeros(off.shape, ACC)
        for j in tl.static_range(21):  # digits from the highest: columns in order
            if (A >> (20 - j)) & 1:
                b_e += _action_dot(p_w, p_nq, off, m, A, (A >> (21 - j)) << (21 - j), 1 << (20 - j), ACC)
    elif not PI_TILE:
        b_e = _action_dot(p_w, p_nq, off, m, A, 0, AP, ACC)
    b_a = tl.where(q_term | q_trunc, 0.0, gamma * b_c1)
    if p_term.dtype.element_ty.primitive_bitwidth > 32:  # 8-byte flags: the mask in E_t's layout (_term_like_e)
        b_e = tl.where(_term_like_e(p_term, off, m, AP), 0.0, b_e)
    else:
        b_e = tl.where(q_term, 0.0, b_e)
    b_b = b_r + gamma * b_e - b_q  # E_t (0 at terminated steps) stands for (1 - term) E_t
    ctx = (b_rho, b_r, b_q, q_bnd | q_term, b_e, gamma)
    return tl.where(m, b_a, 1.0), tl.where(m, b_b, 0.0), ctx


@triton.jit
def retrace_epilogue(outs, ins, hps, ctx, b_d, b_d1, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    SHIFT: tl.constexpr = K[4]
    p_qt, p_adv = outs
    b_q, q_bnd = ctx[2], ctx[3]  # q_t, boundary (or terminated) steps (retrace_prologue)
    if SHIFT:  # q_{t+1} from registers (used only where t is no boundary, so t + 1 < T)
        b_q1 = _env_next(b_q)
    else:
        b_q1 = tl.load(ins[3] + off + ST, mask=m & ~q_bnd, other=0).to(ACC)
    # q_targets_{t+1} inside the buffer; E_t (0) at terminated steps
    store_off_policy(p_qt, p_adv, ctx, b_d, b_q1, b_d1, off, m)


@triton.jit(
    do_not_specialize=[
        "N",
        "NK",
        "CPB",
        "gamma_hi",
        "gamma_lo",
        "lmbda_hi",
        "lmbda_lo",
        "c_hi",
        "c_lo",
        "rho_hi",
        "rho_lo",
    ]
)
def retrace_kernel(
    p_pt,  # [N, T, A] target policy pi(. | s_t)
    p_w,  # [N, T, A] weights of Q(s_{t+1}, .): pi(. | s_{t+1}) if given, else p_pt
    p_pb,  # [N, T] behaviour probability of the taken action
    p_q,  # [N, T] Q(s_t, a_t)
    p_nq,  # [N, T, A] Q(s_{t+1}, .)
    p_act,  # [N, T] actions (integer)
    p_r, p_term, p_trunc,  # [N, T] rewards, terminateds, truncateds
    p_qt,  # [N, T] output Q targets
    p_adv,  # [N, T] output advantages
    N, T,
    gamma_hi, gamma_lo, p_gamma, gamma_sn, gamma_st,  # gamma and lambda: a float's halves or a tensor (gae_kernel)
    lmbda_hi, lmbda_lo, p_lmbda, lmbda_sn, lmbda_st,
    c_hi, c_lo, rho_hi, rho_lo,
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block (see gae_kernel)
    A: tl.constexpr,  # number of actions
    AP: tl.constexpr,  # A rounded up to a power of two (the action axis of the tiles)
    PIECES: tl.constexpr,  # action tiles per binary digit of A instead of one padded to AP
    HAS_TRUNC: tl.constexpr, PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr,
    BT: tl.constexpr,
    NKP: tl.constexpr,
    FORM: tl.constexpr,  # tile form (kernels/core.py)
    # Env-major rows of one chunk (Plan.exact_t): EXACT_T: T == BT, taken as a constexpr (see gae_kernel);
    # SHIFT and PI_TILE: retrace_prologue.
    EXACT_T: tl.constexpr = False,
    SHIFT: tl.constexpr = False,
    PI_TILE: tl.constexpr = False,  # only where p_w is p_pt
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV: see gae_kernel
    TM: tl.constexpr = 0,  # time-major rows, [T, N, A] per-action tensors read as (N, T, A) views: see gae_kernel
    WHOLE: tl.constexpr = False,  # rows of whole chunks: see gae_kernel
    LATE: tl.constexpr = False,  # see gae_kernel
    G_TENSOR: tl.constexpr = False,  # tensor gamma, lambda: see gae_kernel
    L_TENSOR: tl.constexpr = False,
):  # fmt: skip
    tl.static_assert(FORM == ENV_GROUPS or not SHIFT, "SHIFT: env-major rows of one chunk")
    core.scan_rows(
        (p_pt, p_w, p_pb, p_q, p_nq, p_act, p_r, p_term, p_trunc, p_gamma, gamma_sn, gamma_st, p_lmbda, lmbda_sn,
         lmbda_st), (p_qt, p_adv),
        (gamma_hi, gamma_lo, lmbda_hi, lmbda_lo, c_hi, c_lo, rho_hi, rho_lo), N, T, p_agg_a, p_agg_b, p_flag, NK, CPB,
        core.hp_scalars, retrace_prologue, retrace_epilogue,
        (A, AP, PIECES, HAS_TRUNC, SHIFT, PI_TILE, G_TENSOR, L_TENSOR), PHASE, ONE, ACC, BN, BT, NKP, FORM, EXACT_T,
        TDIV, TM, WHOLE,
        REVERSE=True, NEXT=True, FULL=WHOLE, AGGREGATE_TEST=TM == 0, LATE=LATE,  # not EXACT_T: core.env_block
    )  # fmt: skip


# Host side: the kernel's arguments and constexprs


def args(
    mu, q, r, term, trunc, probs, next_q, next_probs, actions, qt, adv, n: int, t: int, gamma, lambda_, c_bar, rho_bar
) -> tuple:  # fmt: skip
    """The kernel's arguments (see ops/gae.py's ``args``; absent inputs pass ``probs``)."""
    g = (*hp(gamma), r, 0, 0) if type(gamma) is float else disc(gamma, r)
    lam = (*hp(lambda_), r, 0, 0) if type(lambda_) is float else disc(lambda_, r)
    return (
        probs, probs if next_probs is None else next_probs, mu, q, next_q, actions, r, term,
        probs if trunc is None else trunc, qt, adv, n, t, *g, *lam, *hp(c_bar), *hp(rho_bar),
    )  # fmt: skip


def constexprs(p, s: dict, two: bool) -> dict:
    t = p.tensors
    # pi(a_t | s_t) comes from the weights tile only where the weights are the target probabilities
    given_next = t.get("next_action_probs_target") is not None
    return dict(
        A=p.num_actions, AP=plans.pow2(p.num_actions), HAS_TRUNC=t.get("truncateds") is not None, ACC=acc(p.dtype),
        **({"PI_TILE": False} if given_next else {}), **tensor_flags(s["gamma"], s["lambda_"]),
    )  # fmt: skip


def kind(t: dict) -> str:
    return "retrace"


RETRACE = Op(
    "compute_retrace", TENSORS, REQUIRED, DIFFERENTIABLE, HYPERS, reference, retrace_kernel, args, constexprs, kind,
    ("retrace",), two=True, data=("terminateds", "truncateds", None),
    probabilities=(("action_probs_target", "next_action_probs_target"), "action_probs_behavior"),
)  # fmt: skip
