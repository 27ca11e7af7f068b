"""Forward scans, one kernel: eligibility traces (``compute_eligibility_traces``) and episodic prefix sums
(``compute_episodic_prefix_sum``), top-down: the spec, the PyTorch path, the Triton prologue, epilogue and kernel,
the argument builder and the ops.

::

    x_t = in_t + scale (1 - done_{t-1}) x_{t-1}    (done_t with STARTS_AT),   x_{-1} = seed_values (or 0)

with scale = gamma lambda for the traces and 1 for the prefix sums.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._discounts import hp
from ..kernels import core
from ..kernels.core import PLAIN
from ..scan import shift
from .utils import Op, acc, as_float, flag

# The spec (see ops/gae.py): the traces' input is named gradients, the reference's inputs. The scale is checked
# by the public functions (a float >= 0). Output: the traces or sums.
TENSORS = (("inputs", "step"), ("dones", "flag"), ("seed_values", "env"))
DIFFERENTIABLE = ("inputs", "seed_values")
HYPERS = (("scale", 0.0),)


# PyTorch path


def reference(t: dict, s: dict, acc: torch.dtype, scan) -> tuple[torch.Tensor]:
    """Eligibility traces (scale = gamma*lambda, ends_at) and episodic prefix sums (scale = 1)."""
    x = as_float(t, "inputs", acc)
    dones = flag(t, "dones", x)
    if not s["starts_at"]:
        dones = shift(dones, towards_future=False)
    seed = as_float(t, "seed_values", acc)
    return (scan(s["scale"] * (1 - dones), x, seed, False),)


# Triton path


@triton.jit
def forward_prologue(ins, hps, off, o_t, m, o_n, m_n, T, ST, K: tl.constexpr, ACC: tl.constexpr):
    """x_t = scale (1 - done_{t-1}) x_{t-1} + in_t (done_t with STARTS_AT)."""
    STARTS_AT: tl.constexpr = K[0]
    p_x, p_done = ins
    if STARTS_AT:
        q_done = core.flag_set(p_done, off, m)
    else:
        q_done = core.flag_set(p_done, off - ST, m & (o_t >= 1))
    b_a = tl.where(m, tl.where(q_done, 0.0, hps[0]), 1.0)  # a select where scale * (1 - done) was
    b_b = tl.load(p_x + off, mask=m, other=0).to(ACC)
    return b_a, b_b, ()


@triton.jit
def forward_epilogue(outs, ins, hps, ctx, b_y, b_yn, off, m, ST, K: tl.constexpr, ACC: tl.constexpr):
    tl.store(outs[0] + off, b_y, mask=m)


@triton.jit(do_not_specialize=["N", "NK", "CPB", "scale_hi", "scale_lo"])
def forward_trace_kernel(
    p_x,  # [N, T] gradients (eligibility traces) or inputs (prefix sums)
    p_done,  # [N, T] dones (any dtype)
    p_seed,  # [N] initial state e_-1 / S_-1 (if HAS_SEED)
    p_out,  # [N, T] output
    N, T,
    scale_hi, scale_lo,  # gamma * lambda (eligibility traces) or 1 (prefix sums)
    p_agg_a, p_agg_b, p_flag, NK, CPB,  # multi-block (see gae_kernel)
    STARTS_AT: tl.constexpr,  # reset at the flagged step instead of the step after it
    HAS_SEED: tl.constexpr, PHASE: tl.constexpr, ONE: tl.constexpr, ACC: tl.constexpr, BN: tl.constexpr,
    BT: tl.constexpr,
    NKP: tl.constexpr,
    TDIV: tl.constexpr = 1,  # T is a multiple of TDIV: see gae_kernel
    TM: tl.constexpr = 0,  # time-major rows: see gae_kernel
    LATE: tl.constexpr = False,  # see gae_kernel
):  # fmt: skip
    """Forward recurrence x_t = scale (1 - done_{t-1}) x_{t-1} + in_t (done_t if STARTS_AT)."""
    core.scan_rows(
        (p_x, p_done), (p_out,), (scale_hi, scale_lo), N, T, p_agg_a, p_agg_b, p_flag, NK, CPB, core.hp_scalars,
        forward_prologue, forward_epilogue, (STARTS_AT,), PHASE, ONE, ACC, BN, BT, NKP, PLAIN, False, TDIV, TM, False,
        REVERSE=False, p_seed=p_seed, HAS_SEED=HAS_SEED, SEEDED=True, AGGREGATE_TEST=TM > 0, LATE=LATE,
    )  # fmt: skip


# Host side: the kernel's arguments and constexprs


def args(x, dones, seed, out, second, n: int, t: int, scale: float) -> tuple:
    return (x, dones, x if seed is None else seed, out, n, t, *hp(scale))


def constexprs(p, s: dict, two: bool) -> dict:
    return dict(STARTS_AT=s["starts_at"], HAS_SEED=p.tensors.get("seed_values") is not None, ACC=acc(p.dtype))


def kind(t: dict) -> str:
    return "forward"


PREFIX_SUM = Op(
    "compute_episodic_prefix_sum", TENSORS, ("inputs", "dones"), DIFFERENTIABLE, HYPERS, reference,
    forward_trace_kernel, args, constexprs, kind, ("forward_trace", False), consts={"starts_at": False},
)  # fmt: skip
PREFIX_SUM_STARTS_AT = PREFIX_SUM.variant(at=("forward_trace", True), consts={"starts_at": True})
ELIGIBILITY_TRACES = PREFIX_SUM.variant(
    fn="compute_eligibility_traces", tensors=(("gradients", "step"), *TENSORS[1:]), required=("gradients", "dones"),
    rename=("gradients", "inputs"),
)  # fmt: skip
