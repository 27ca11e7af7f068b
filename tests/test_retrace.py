"""compute_retrace against the float64 reference, hand-computed values and edge cases."""

import dataclasses

import pytest
import torch

import rl_triton
from rl_triton.kernels import plans
from rl_triton.kernels.plans import Form
from tests import reference
from tests._helpers import (
    DTYPE_IDS,
    F32_TOL,
    FLOAT_DTYPES,
    SHAPES,
    case,
    case_inputs,
    check,
    check_case,
    cuda_path,
    flag_masks,
    golden,
    kernel_paths,
    probs,
    randn,
    to_flags,
)

FN = "compute_retrace"


def make_case(
    shape,
    *,
    num_actions=4,
    device="cpu",
    dtype=torch.float32,
    flag_dtype=torch.bool,
    p=0.1,
    next_probs=False,
    dones="random",
):
    """Inputs for one call: (N, T) or (T,) per-step tensors, (..., A) per-action ones; dones: where
    the flags sit (tests._helpers.flag_masks)."""
    term, trunc = flag_masks(shape, dones, p)
    a_shape = (*shape, num_actions)
    target = probs(a_shape, torch.float64)
    behavior_all = probs(a_shape, torch.float64)
    actions = torch.randint(0, num_actions, shape)
    behavior = behavior_all.gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    args = [
        target.to(dtype).to(device),
        behavior.to(dtype).to(device),
        randn(shape, dtype, device),  # q_values
        randn(a_shape, dtype, device),  # next_q_values_all
        actions.to(device),
        randn(shape, dtype, device),  # rewards
        to_flags(term, flag_dtype, device),
        to_flags(trunc, flag_dtype, device),
    ]
    kwargs = {"gamma": 0.97, "lambda_": 0.9}
    if next_probs:
        kwargs["next_action_probs_target"] = probs(a_shape, dtype, device)
    return args, kwargs


# The case table: every row on every backend path against the float64 reference (see test_gae.py).
# Rows have 4 actions, lambda = 0.9 and c_bar = rho_bar = 1 unless given; next_probs: with
# next_action_probs_target.
CASES = [
    # Shapes: T = 1 and 2, primes and odd sizes, one long row, 1-D calls.
    *(case(s) for s in SHAPES),
    # Numbers of actions.
    *(case((3, 25), num_actions=a) for a in (1, 2, 7, 18)),
    # next_action_probs_target, batched and 1-D.
    *(case(s, next_probs=True) for s in ((3, 33), (33,))),
    # lambda and the clipping levels.
    case((3, 40), lambda_=1.0, c_bar=1.0, rho_bar=1.0),
    case((3, 40), lambda_=0.0, c_bar=1.0, rho_bar=1.0),
    case((3, 40), lambda_=0.7, c_bar=0.5, rho_bar=2.0),
    case((3, 40), lambda_=1.0, c_bar=2.0, rho_bar=0.5),
    # Where the flags sit: none; terminations or truncations at every step, t = 0, t = T-1 or at random;
    # steps both terminated and truncated.
    case((4, 16), dones="none"),
    *(case((4, 16), dones=f"{k}-{at}") for k in ("term", "trunc") for at in ("all", "first", "last", "random")),
    case((3, 30), dones="both"),
    # Integer flag dtypes (bool is most rows', float flags the float dtype rows').
    *(case((3, 40), flag_dtype=f, p=0.2) for f in (torch.uint8, torch.int32, torch.int64)),
    # Float dtypes with flags of the same dtype. Rows of 300 and 1100 steps, 4 actions: the register-capped
    # programs on the GPU (kernels/plans.py, Plan.maxnreg: 2-byte dtypes at 512 steps per row, float32 and
    # 2-byte dtypes walking 1024-step chunks).
    *(case(s, dtype=d, flag_dtype=d, next_probs=True) for d in DTYPE_IDS for s in ((5, 63), (2, 300), (2, 1100))),
    # 8-byte flags with float64 data at row lengths of multiples of 4 (Triton 3.6 miscompiled the terminated mask's
    # layout conversion there: ops/retrace.py, _term_like_e).
    *(case(s, dtype=torch.float64, flag_dtype=f) for f in (torch.float64, torch.int64) for s in ((64, 20), (4, 1000))),
    # Non-contiguous views of every input (they also equal the call on contiguous copies).
    case((5, 37), layout="stride", next_probs=True),
    case((5, 37), layout="transpose", next_probs=True),
    # gamma at its bounds.
    case((3, 50), gamma=0.0),
    case((3, 50), gamma=1.0),
]


@pytest.mark.parametrize("c", CASES)
def test_matches_reference(path, c):
    check_case(FN, c, *case_inputs(make_case, c, path.device))


# ------------------------------------------------------------------------------------------
# Hand-computed values, gamma = 0.5, lambda = c_bar = rho_bar = 1, T = 2, A = 2.
# target probs: t0 [.5, .5], t1 [.25, .75]; actions [0, 1]; behaviour probs [.25, 1]
#   ratio = [.5/.25, .75/1] = [2, .75]  ->  c = [1, .75], rho = [1, .75]
# next_q_values_all: t0 [2, 4], t1 [4, 8]  ->  E = [.5*2 + .5*4, .25*4 + .75*8] = [3, 7]
# q_values [1, 2], rewards [1, 1].
#
# A: no flags.    delta1 = 1 + .5*7 - 2 = 2.5, Delta1 = 2.5 (c_next = 0 at T-1), qt1 = 4.5
#                 delta0 = 1 + .5*3 - 1 = 1.5, Delta0 = 1.5 + .5*c1*2.5 = 2.4375, qt0 = 3.4375
#                 adv0 = rho0*(1 + .5*qt1 - 1) = 2.25;  adv1 = rho1*(1 + .5*E1 - 2) = 1.875
# B: term at t=0. delta0 = 1 + 0 - 1 = 0, cut: qt0 = 1; adv0 = 1*(1 + 0 - 1) = 0; t=1 as A
# C: trunc at t=0. delta0 = 1.5, cut: qt0 = 2.5; adv0 = 1 + .5*E0 - 1 = 1.5; t=1 as A
# D: as A with next_action_probs_target t0 [1, 0], t1 [0, 1]  ->  E = [2, 8] (c still from target)
#                 delta1 = 1 + 4 - 2 = 3, qt1 = 5; delta0 = 1 + 1 - 1 = 1, Delta0 = 1 + .5*.75*3 = 2.125
#                 adv0 = 1 + .5*5 - 1 = 2.5; adv1 = .75*(1 + .5*8 - 2) = 2.25
GOLDEN_QT = [[3.4375, 4.5], [1.0, 4.5], [2.5, 4.5]]
GOLDEN_ADV = [[2.25, 1.875], [0.0, 1.875], [1.5, 1.875]]
GOLDEN_NEXT = ([3.125, 5.0], [2.5, 2.25])


def _golden(fn, device):
    def f(x):
        return torch.tensor(x, dtype=torch.float32, device=device)

    target = f([[[0.5, 0.5], [0.25, 0.75]]] * 3)
    behavior = f([[0.25, 1.0]] * 3)
    q = f([[1.0, 2.0]] * 3)
    next_q = f([[[2.0, 4.0], [4.0, 8.0]]] * 3)
    actions = torch.tensor([[0, 1]] * 3, device=device)
    rewards = f([[1.0, 1.0]] * 3)
    term = f([[0, 0], [1, 0], [0, 0]]).bool()
    trunc = f([[0, 0], [0, 0], [1, 0]]).bool()
    out = fn(target, behavior, q, next_q, actions, rewards, term, trunc, gamma=0.5)
    golden(out, (GOLDEN_QT, GOLDEN_ADV))
    out = fn(
        target[0],
        behavior[0],
        q[0],
        next_q[0],
        actions[0],
        rewards[0],
        term[0],
        trunc[0],
        gamma=0.5,
        next_action_probs_target=f([[1.0, 0.0], [0.0, 1.0]]),
    )
    assert out[0].shape == (2,) and out[1].shape == (2,)
    golden(out, GOLDEN_NEXT)


def test_golden_reference():
    _golden(reference.compute_retrace, "cpu")


def test_golden(path):
    _golden(rl_triton.compute_retrace, path.device)


@pytest.mark.parametrize(
    "form, shape, num_actions",
    [
        ("pieces", (3, 25), 1),
        ("pieces", (3, 25), 3),
        ("pieces", (3, 25), 7),
        ("pieces", (2, 70), 18),
        ("env-major", (300, 8), 4),
        ("env-major", (70, 5), 3),
    ],
)
@kernel_paths
def test_sweep_forms(path, form, shape, num_actions):
    """Tile forms on shapes where the policy would not choose them: one action tile per binary digit of A for
    few actions (an explicit plan), and the env-major groups the policy picks for short rows."""
    if not path.is_kernel:
        pytest.skip("a kernel tile form")
    chosen = plans.choose("retrace", *shape, torch.float32, num_actions=num_actions)
    plan = None
    if form == "pieces":
        plan = dataclasses.replace(chosen, pieces=True, pi_tile=False)
    else:
        assert chosen.form is Form.ENV_GROUPS
    args, kwargs = make_case(shape, num_actions=num_actions, device=path.device)
    check(FN, *args, **kwargs, plan=plan, **F32_TOL)


# Env-major kernel variants of short rows (ops/retrace.py's retrace_kernel): the row length as a constexpr (E:
# exact_t, rows of T == BT), c_{t+1} and q_{t+1} shifted in registers (S: shift), pi(a_t | s_t) from the weights
# tile (P: pi_tile), the last two on rows of T == BT only; programs of (steps, warps) that give each thread half a
# row (1024, 8: the default), a whole row (1024, 4; 512, 2) or two rows (2048, 4).
_ENV_VARIANTS = [
    ("", 1024, 8), ("E", 1024, 8), ("ES", 1024, 8), ("EP", 1024, 8), ("ESP", 1024, 8), ("ESP", 1024, 4),
    ("ES", 512, 2), ("EP", 2048, 4),
]  # fmt: skip
_ENV_CASES = [
    pytest.param((300, 8), 4, False, id="N300-T8-A4"),
    pytest.param((70, 5), 3, False, id="N70-T5-A3"),
    pytest.param((9, 4), 4, False, id="N9-T4-A4"),
    pytest.param((3, 8), 2, True, id="N3-T8-A2-next"),
    pytest.param((5, 8), 1, False, id="N5-T8-A1"),
    pytest.param((6,), 8, False, id="T6-A8-1d"),
]


def _env_plan(variant, shape, num_actions):
    """The env-major plan of a variant: programs of ``steps`` (at 4 actions, scaled by the padded actions) and
    ``warps``, with the letters' flags where rows are exactly one chunk."""
    flags, steps, warps = variant
    n, t = (1, shape[0]) if len(shape) == 1 else shape
    base = plans.tile(n, t, block=max(128, steps * 4 // plans.pow2(num_actions)))
    exact = "E" in flags and t == base.bt
    return dataclasses.replace(
        base, warps=warps, form=Form.ENV_GROUPS, exact_t=exact, shift=exact and "S" in flags,
        pi_tile=exact and "P" in flags, row_div=1 if exact else plans.row_div(t),
    )  # fmt: skip


@pytest.mark.parametrize("variant", _ENV_VARIANTS, ids=lambda v: f"{v[0] or 'plain'}-{v[1]}-w{v[2]}")
@pytest.mark.parametrize("shape, num_actions, next_probs", _ENV_CASES)
@kernel_paths
def test_env_major_variants(path, variant, shape, num_actions, next_probs):
    if not path.is_kernel:
        pytest.skip("a kernel tile form")
    plan = _env_plan(variant, shape, num_actions)
    args, kwargs = make_case(shape, num_actions=num_actions, device=path.device, next_probs=next_probs)
    check(FN, *args, **kwargs, plan=plan, **F32_TOL)


def test_env_major_policy():
    """Short rows of few actions take env-major groups with all three variants where rows are exactly one chunk
    (the default programs: 1024 steps at 4 actions, 8 warps), none of them otherwise."""
    for shape, num_actions in [((300, 8), 4), ((9, 4), 4), ((3, 8), 2), ((70, 5), 3), ((5, 8), 1)]:
        chosen = plans.choose("retrace", *shape, torch.float32, num_actions=num_actions)
        assert chosen == _env_plan(("ESP", 1024, 8), shape, num_actions), shape


@pytest.mark.parametrize("variant", [("", 1024, 8), ("ESP", 1024, 4)], ids=["plain", "ESP"])
@kernel_paths
def test_env_major_variants_bfloat16(path, variant):
    if not path.is_kernel:
        pytest.skip("a kernel tile form")
    dtype, atol, rtol = next(p.values for p in FLOAT_DTYPES if p.values[0] == torch.bfloat16)
    args, kwargs = make_case((40, 8), device=path.device, dtype=dtype, flag_dtype=dtype)
    check(FN, *args, **kwargs, plan=_env_plan(variant, (40, 8), 4), atol=atol, rtol=rtol)


@pytest.mark.parametrize("variant", [("ESP", 1024, 8), ("ESP", 1024, 4)], ids=["ESP", "ESP-w4"])
@pytest.mark.parametrize("shape", [(64, 8), (64, 4)], ids=["N64-T8", "N64-T4"])
@cuda_path
def test_env_major_variants_out_of_range_actions(path, variant, shape):
    """On CUDA actions are not range-checked: with an action outside [0, A), the variants give what the
    plain env-major form gives (NaN where that has NaN), and the other envs' outputs are unaffected."""
    if path.name != "cuda":
        pytest.skip("CPU actions are range-checked (tests/test_errors.py)")
    args, kwargs = make_case(shape, device=path.device)
    plain_plan, variant_plan = _env_plan(("", 1024, 8), shape, 4), _env_plan(variant, shape, 4)
    good = rl_triton.compute_retrace(*args, **kwargs, plan=plain_plan)
    for bad in (-1, 4):
        args[4] = args[4].clone()
        args[4][1, 3] = bad
        plain = rl_triton.compute_retrace(*args, **kwargs, plan=plain_plan)
        got = rl_triton.compute_retrace(*args, **kwargs, plan=variant_plan)
        rest = torch.arange(shape[0], device=path.device) != 1
        for g, p, ok in zip(got, plain, good, strict=True):
            torch.testing.assert_close(g, p, atol=0, rtol=1e-6, equal_nan=True)
            torch.testing.assert_close(g[rest], ok[rest], atol=0, rtol=1e-6)
