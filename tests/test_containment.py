"""Containment of non-finite inputs: an entry that the formulas multiply by a zero flag factor, or do not read,
changes no output even when it is NaN or +-inf (the outputs are those with the entry set to 0, bit for bit),
and a non-finite value inside one episode changes no other episode's outputs. Every function on every backend
path, in rows of one chunk and in rows split into time blocks (explicit launch plans: chunks walked with a
carry, two passes, the look-back, also over time-major rows), against the same call with the entries set to 0
(or, for values inside an episode, with the rows' own values) and the float64 reference.

Each call puts the three values in different rows (NaN in row 0, +inf in row 1, -inf in row 2), so that one
call checks all three and a leak from any row to another shows as well."""

import dataclasses
import functools
import math

import pytest
import torch
import triton
import triton.language as tl

import rl_triton as R
from rl_triton.kernels import core, plans
from rl_triton.kernels.plans import Form, Plan, Split
from rl_triton.ops import kind_of
from tests import reference
from tests._helpers import F32_TOL

POISONS = (math.nan, math.inf, -math.inf)  # rows 0, 1, 2
N = 3
# The interpreter evaluates both sides of a select in NumPy, so 0 * inf on the side not taken warns.
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

# layout -> (steps per row, plan); plans apply to the kernel paths only (the PyTorch path runs the same rows).
# Rows of 160 steps in chunks of 32 are 5 chunks: walked by one program with a carry, split into blocks of one
# chunk for two passes (aggregates, then folds of them), or for the look-back in windows of 4 (so that a window's
# aggregate is folded too); env-major groups take chunks of 8 steps (5 blocks of a 40-step row).
LAYOUTS = {
    "one-chunk": (37, None),
    "groups4-walk": (160, Plan(1, 32, 4, Form.GROUPS4)),
    "groups4-two-pass": (160, Plan(1, 32, 4, Form.GROUPS4, Split.TWO_PASS)),
    "groups4-lookback": (160, Plan(1, 32, 4, Form.GROUPS4, Split.LOOKBACK, window=4)),
    "plain-walk": (160, Plan(1, 32, 4, Form.PLAIN)),
    # plain outputs stored first, tested once per program after (Plan.late): walked, two passes, one chunk per row
    "groups4-walk-late": (160, Plan(1, 32, 4, Form.GROUPS4, late=True)),
    "groups8-two-pass-late": (160, Plan(1, 32, 4, Form.GROUPS8, Split.TWO_PASS, late=True)),
    "plain-walk-late": (160, Plan(1, 32, 4, Form.PLAIN, late=True)),
    "plain-one-chunk-late": (37, Plan(2, 64, 4, Form.PLAIN, late=True)),
    "groups8-one-chunk-late": (37, Plan(1, 64, 2, Form.GROUPS8, late=True)),
    "plain-two-pass": (160, Plan(1, 32, 4, Form.PLAIN, Split.TWO_PASS)),
    "plain-lookback": (160, Plan(1, 32, 4, Form.PLAIN, Split.LOOKBACK, window=4)),
    "env-groups-lookback": (40, Plan(1, 8, 4, Form.ENV_GROUPS, Split.LOOKBACK, window=4)),
    # time-major rows (views x.T of [T, N] buffers, read in place), as a dict of fields replaced in the chosen plan:
    # the look-back over a block of envs, 5 time blocks; a program walking the 5 chunks with the late test
    "time-major-lookback": (320, {"split": Split.LOOKBACK, "window": 4, "chunks_per_block": 1}),
    "time-major-walk-late": (320, {"split": Split.SINGLE, "late": True}),
    "time-major-two-pass-late": (320, {"split": Split.TWO_PASS, "chunks_per_block": 2, "late": True}),
}
# The split layout of each case whose poison reaches the scan, spread over the functions so that every tile form
# and split meets a case (entries that are never read do not depend on the layout; split rows are slow in the
# interpreter).
SPLIT_LAYOUTS = {
    "gae-episode": ["groups4-lookback", "time-major-lookback", "groups4-walk-late", "time-major-walk-late"],
    "vtrace-episode": ["groups4-two-pass", "groups8-two-pass-late", "time-major-two-pass-late"],
    "retrace-episode": ["plain-lookback", "time-major-lookback", "plain-one-chunk-late", "time-major-walk-late"],
    "discounted-episode": ["env-groups-lookback", "groups4-walk-late", "groups8-one-chunk-late"],
    "lambda-episode": ["groups4-walk", "plain-one-chunk-late", "time-major-walk-late"],
    "traces-episode": ["plain-two-pass", "plain-walk-late", "time-major-walk-late"],
    "prefix-episode": ["plain-lookback", "plain-one-chunk-late", "time-major-two-pass-late"],
    "prefix-starts-episode": ["plain-walk"],
}


def _bounds(t: int) -> tuple[int, int]:
    """The two episode ends inside every row (done steps)."""
    return (11, 24) if t < 64 else (t // 4 - 5, (3 * t) // 4 - 3)


def _flags(t: int, kind: str):
    """(terminateds, truncateds) [N, T]: episode ends at both bounds in every row, terminated or truncated as the
    row's pattern says; every row also terminates at its last step (where the bootstrap value is not read)."""
    b1, b2 = _bounds(t)
    term = torch.zeros(N, t, dtype=torch.bool)
    trunc = torch.zeros(N, t, dtype=torch.bool)
    if kind == "term":  # no truncateds
        term[:, [b1, b2]] = True
    else:
        term[0, b1], trunc[0, b2] = True, True
        trunc[1, b1], term[1, b2] = True, True
        term[2, b1], trunc[2, b2] = True, True
    term[:, t - 1] = True
    return term, trunc


def _episode(t: int, starts_at: bool = False) -> torch.Tensor:
    """Episode index of every step [T] (0, 1, 2), episodes ending at the bounds (or, starts_at, starting there)."""
    b1, b2 = _bounds(t)
    steps = torch.arange(t)
    if starts_at:
        return (steps >= b1).long() + (steps >= b2).long()
    return (steps > b1).long() + (steps > b2).long()


def _randn(*shape):
    return torch.randn(*shape, dtype=torch.float64).to(torch.float32)


def _probs(*shape):
    return (torch.softmax(torch.randn(*shape, dtype=torch.float64), -1) * 0.9 + 0.1 / shape[-1]).to(torch.float32)


# Each case: fn, how to build its keyword arguments on rows of t steps, and the entries to poison: a list of
# (argument, index) with index [N, ...]-shaped boolean masks or per-row step lists. "free" cases poison entries
# that are never read or multiplied by a zero flag factor (every output unchanged); "episode" cases poison the
# middle episode of every row (the other episodes' outputs unchanged).


def _gae_kwargs(t, last=False):
    term, trunc = _flags(t, "term" if last else "both")
    kw = dict(rewards=_randn(N, t), values=_randn(N, t), terminateds=term, gamma=0.9, lambda_=0.8)
    if last:
        kw["last_value"] = _randn(N)
    else:
        kw["truncateds"] = trunc
        kw["bootstrap_values"] = _randn(N, t)  # dense: entries away from boundaries must not matter
    return kw


def _vtrace_kwargs(t, last=False):
    kw = _gae_kwargs(t, last)
    kw.pop("lambda_")
    lpb = _randn(N, t)
    return dict(kw, log_pi_target=lpb + 0.5 * _randn(N, t), log_pi_behavior=lpb, rho_bar=1.2, c_bar=0.9)


def _retrace_kwargs(t):
    term, trunc = _flags(t, "both")
    actions = torch.randint(0, 4, (N, t))
    behavior = _probs(N, t, 4).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return dict(
        action_probs_target=_probs(N, t, 4), action_probs_behavior=behavior, q_values=_randn(N, t),
        next_q_values_all=_randn(N, t, 4), actions=actions, rewards=_randn(N, t), terminateds=term, truncateds=trunc,
        gamma=0.9, lambda_=0.8, next_action_probs_target=_probs(N, t, 4),
    )  # fmt: skip


def _returns_kwargs(t):
    term, trunc = _flags(t, "both")
    return dict(rewards=_randn(N, t), terminateds=term, truncateds=trunc, gamma=0.9, bootstrap_values=_randn(N, t))


def _lambda_kwargs(t):
    return dict(_returns_kwargs(t), next_values=_randn(N, t), lambda_=0.8)


def _forward_kwargs(t, fn, starts_at=False):
    dones = torch.zeros(N, t, dtype=torch.bool)
    b1, b2 = _bounds(t)
    dones[:, [b1, b2]] = True
    dones[0, 0] = True  # starts_at: row 0's seed is not read
    x = _randn(N, t)
    if fn == "compute_eligibility_traces":
        return dict(gradients=x, dones=dones, gamma=0.9, lambda_=0.8, seed_values=_randn(N))
    return dict(inputs=x, dones=dones, boundary="starts_at" if starts_at else "ends_at", seed_values=_randn(N))


def _rows_at(steps_per_row):
    """Index of one step per row: rows 0, 1, 2 at the given steps."""
    return (torch.arange(N), torch.tensor(steps_per_row))


def _not_boundary(t, trunc):
    """A mask [N, T] of three interior steps per row that are no boundary (bootstrap values not read there)."""
    m = torch.zeros(N, t, dtype=torch.bool)
    b1, b2 = _bounds(t)
    m[:, [3, b1 + 2, b2 + 2]] = True
    return m & ~trunc


def _middle(t, k):
    """One step per row in the middle episode: step b1 + 1 + k."""
    b1, _ = _bounds(t)
    return _rows_at([b1 + 1 + k] * N)


def _cases():
    """(id, fn, make(t) -> kwargs, poisons(kwargs, t) -> [(name, index)], episode: None or starts_at flag)."""

    def gae_free(kw, t):
        return [("bootstrap_values", _not_boundary(t, kw["truncateds"])), ("bootstrap_values", _rows_at([t - 1] * N))]

    def retrace_free(kw, t):  # E_t is not read at terminated steps
        term = kw["terminateds"].unsqueeze(-1).expand(-1, -1, 4)
        return [("next_q_values_all", term), ("next_action_probs_target", term)]

    def lambda_free(kw, t):  # next values are not read at truncations nor at terminated steps
        return gae_free(kw, t) + [("next_values", kw["truncateds"] | kw["terminateds"])]

    def reward_value(kw, t):  # values_{b1+1} is also v_next at the episode end b1 (a boundary in two rows)
        return [("rewards", _middle(t, 3)), ("values", _middle(t, 0))]

    yield "gae-free", "compute_gae", _gae_kwargs, gae_free, None
    yield "gae-last-value", "compute_gae", functools.partial(_gae_kwargs, last=True), _last_value, None
    yield "gae-episode", "compute_gae", _gae_kwargs, reward_value, False
    yield "vtrace-free", "compute_vtrace", _vtrace_kwargs, gae_free, None
    yield "vtrace-last-value", "compute_vtrace", functools.partial(_vtrace_kwargs, last=True), _last_value, None
    yield "vtrace-episode", "compute_vtrace", _vtrace_kwargs, _vtrace_episode, False
    yield "retrace-free", "compute_retrace", _retrace_kwargs, retrace_free, None
    yield "retrace-episode", "compute_retrace", _retrace_kwargs, _retrace_episode, False
    yield "discounted-free", "compute_discounted_returns", _returns_kwargs, gae_free, None
    yield "discounted-episode", "compute_discounted_returns", _returns_kwargs, _rewards_in_episode, False
    yield "lambda-free", "compute_lambda_returns", _lambda_kwargs, lambda_free, None
    yield "lambda-episode", "compute_lambda_returns", _lambda_kwargs, _lambda_episode, False
    traces = functools.partial(_forward_kwargs, fn="compute_eligibility_traces")
    prefix = functools.partial(_forward_kwargs, fn="compute_episodic_prefix_sum")
    yield "traces-episode", "compute_eligibility_traces", traces, _forward_episode, False
    yield "prefix-episode", "compute_episodic_prefix_sum", prefix, _forward_episode, False
    starts = functools.partial(_forward_kwargs, fn="compute_episodic_prefix_sum", starts_at=True)
    yield "prefix-starts-episode", "compute_episodic_prefix_sum", starts, _forward_episode, True
    yield "prefix-starts-seed", "compute_episodic_prefix_sum", starts, _unread_seed, None


def _last_value(kw, t):  # every row terminates at its last step: last_value is not read
    return [("last_value", torch.ones(N, dtype=torch.bool))]


def _vtrace_episode(kw, t):  # at the done step b2, c_t is not read, while rho_t belongs to the step's own episode
    _, b2 = _bounds(t)
    return [("rewards", _middle(t, 3)), ("values", _middle(t, 0)), ("log_pi_target", _rows_at([b2] * N))]


def _retrace_episode(kw, t):  # c_{b1+1} (probabilities at b1 + 1) is not read at the done step b1
    mid = _middle(t, 0)
    return [("rewards", _middle(t, 3)), ("q_values", _middle(t, 2)), ("action_probs_target", mid),
            ("action_probs_behavior", mid), ("next_q_values_all", _middle(t, 4))]  # fmt: skip


def _rewards_in_episode(kw, t):
    return [("rewards", _middle(t, 3))]


def _lambda_episode(kw, t):
    return [("rewards", _middle(t, 3)), ("next_values", _middle(t, 5))]


def _forward_episode(kw, t):
    name = "gradients" if "gradients" in kw else "inputs"
    return [(name, _middle(t, 3))]


def _unread_seed(kw, t):  # starts_at with done_0: S_0 = x_0, the seed is not read (row 0 only)
    return [("seed_values", torch.tensor([True, False, False]))]


CASES = {c[0]: c[1:] for c in _cases()}


def _poisoned(kw, poisons, value_of_row):
    """kw with the poisoned entries set: row r gets value_of_row(r) (a NaN or an infinity, or 0)."""
    out = dict(kw)
    for name, index in poisons:
        x = out[name].clone()
        rows = torch.arange(N).reshape((N,) + (1,) * (x.dim() - 1)).expand(x.shape)
        mask = torch.zeros(x.shape, dtype=torch.bool)
        mask[index] = True
        for r in range(N):
            x[mask & (rows == r)] = value_of_row(r)
        out[name] = x
    return out


def _time_major(x):
    """The same values as (N, T[, A]) views of contiguous (T, N[, A]) tensors; per-env tensors unchanged."""
    if isinstance(x, torch.Tensor) and x.dim() >= 2:
        return x.transpose(0, 1).contiguous().transpose(0, 1)
    return x


def _outputs(fn, kw, device, plan):
    kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    if isinstance(plan, dict):  # time-major rows: these fields of the chosen plan replaced
        t = kw["rewards" if "rewards" in kw else next(iter(kw))].shape[1]
        kind = kind_of(fn)
        chosen = plans.choose(kind, N, t, torch.float32, time_major=True, num_actions=4 if kind == "retrace" else 0)
        plan = dataclasses.replace(chosen, **plan)
        kw = {k: _time_major(v) for k, v in kw.items()}
    out = getattr(R, fn)(**kw, plan=plan)
    return tuple(o.cpu() for o in (out if isinstance(out, tuple) else (out,)))


def _assert_same_bits(got, want, mask, what):
    g, w = got[mask].contiguous(), want[mask].contiguous()
    assert torch.isfinite(w).all(), f"{what}: the call with zeros has non-finite outputs"
    bad = g.view(torch.int32) != w.view(torch.int32)
    assert not bad.any(), f"{what}: {int(bad.sum())} of {g.numel()} outputs differ, e.g. {g[bad][:4]} != {w[bad][:4]}"


@functools.cache
def _interpreter_contains() -> bool:
    """Whether the interpreter's fast fold of core.linear_combine (kernels/_interpret.py) selects b_r where
    a_r == 0, as the combine does: a scan of (1, NaN), (0, 1) must give B = 1."""
    a = torch.tensor([[1.0, 0.0]])
    b = torch.tensor([[math.nan, 1.0]])
    out = torch.empty(1, 2)
    _scan_probe[(1,)](a, b, out)
    return bool(out[0, 1] == 1.0)


@triton.jit
def _scan_probe(p_a, p_b, p_out):
    o = tl.arange(0, 2)[None, :]
    _A, b_B = tl.associative_scan((tl.load(p_a + o), tl.load(p_b + o)), 1, core.linear_combine)
    tl.store(p_out + o, b_B)


def _params():
    for case in CASES:
        for layout in ["one-chunk", *SPLIT_LAYOUTS.get(case, [])]:
            yield pytest.param(case, layout, id=f"{case}-{layout}")


@pytest.mark.parametrize(("case", "layout"), list(_params()))
def test_containment(path, case, layout):
    fn, make, poisons_of, episode = CASES[case]
    t, plan = LAYOUTS[layout]
    if path.name == "interpret" and not _interpreter_contains():
        pytest.xfail("kernels/_interpret.py folds core.linear_combine without its select at a_r == 0")
    if isinstance(plan, dict) and path.name == "torch":
        plan = None  # the PyTorch path computes time-major calls on contiguous copies
    kw = make(t)
    poisons = poisons_of(kw, t)
    bad = _outputs(fn, _poisoned(kw, poisons, lambda r: POISONS[r]), path.device, plan)
    # what the poisoned entries must be the same as: 0 where they are not read, else the rows' own values
    same = _poisoned(kw, poisons, lambda r: 0.0) if episode is None else kw
    good = _outputs(fn, same, path.device, plan)
    ref = getattr(reference, fn)(**{k: v.double() if torch.is_tensor(v) and v.is_floating_point() else v
                                    for k, v in same.items()})  # fmt: skip
    ref = ref if isinstance(ref, tuple) else (ref,)
    if episode is None:  # nothing may change
        keep = torch.ones(N, t, dtype=torch.bool)
    else:  # the middle episode of each row may change, the others not
        keep = (_episode(t, episode) != 1).expand(N, t)
        assert any(not torch.isfinite(o[~keep]).all() for o in bad), "the poison did not reach its own episode"
    for i, (b, g, r) in enumerate(zip(bad, good, ref, strict=True)):
        _assert_same_bits(b, g, keep, f"{case} output {i}")
        scale = max(1.0, r.abs().max().item())
        torch.testing.assert_close(b[keep].double(), r[keep], atol=F32_TOL["atol"] * scale, rtol=F32_TOL["rtol"])


GRAD_CASES = {
    "gae-free": ("compute_gae", ("rewards", "values", "bootstrap_values")),
    "gae-last-value": ("compute_gae", ("rewards", "values", "last_value")),
    "vtrace-free": ("compute_vtrace", ("rewards", "values", "bootstrap_values")),
    "retrace-free": ("compute_retrace", ("rewards", "q_values", "next_q_values_all")),
    "lambda-free": ("compute_lambda_returns", ("rewards", "next_values", "bootstrap_values")),
}


@pytest.mark.parametrize("case", list(GRAD_CASES))
def test_containment_gradients(path, case):
    """With entries that must not matter set to NaN and +-inf, the gradients of every output are finite, equal
    to those with the entries set to 0, and 0 at the poisoned entries themselves."""
    fn, names = GRAD_CASES[case]
    _fn, make, poisons_of, _episode = CASES[case]
    if path.name == "interpret" and not _interpreter_contains():
        pytest.xfail("kernels/_interpret.py folds core.linear_combine without its select at a_r == 0")
    t = LAYOUTS["one-chunk"][0]
    kw = make(t)
    poisons = poisons_of(kw, t)
    grads = []
    for values in (lambda r: POISONS[r], lambda r: 0.0):
        inputs = {k: v.to(path.device) if torch.is_tensor(v) else v for k, v in _poisoned(kw, poisons, values).items()}
        for n in names:
            inputs[n] = inputs[n].detach().clone().requires_grad_(True)
        leaves = [inputs[n] for n in names]
        out = getattr(R, fn)(**inputs)
        out = out if isinstance(out, tuple) else (out,)
        weights = [torch.linspace(-1, 1, o.numel(), device=o.device).reshape(o.shape) for o in out]
        torch.autograd.backward(out, weights)
        grads.append([x.grad.cpu() for x in leaves])
    for name, g_bad, g_good in zip(names, *grads, strict=True):
        assert torch.isfinite(g_bad).all(), f"{case}: non-finite gradient of {name}"
        torch.testing.assert_close(g_bad, g_good, atol=0, rtol=0)
        for p_name, index in poisons:
            if p_name == name:
                mask = torch.zeros(g_bad.shape, dtype=torch.bool)
                mask[index] = True
                assert (g_bad[mask] == 0).all(), f"{case}: gradient at a poisoned {name} entry"


# ------------------------------------------------------------------------------------ the plain scan's shortcut


@triton.jit
def _both_scans(p_a, p_b, p_c, p_out, T, BN: tl.constexpr, BT: tl.constexpr, FORM: tl.constexpr,
                REVERSE: tl.constexpr, NEXT: tl.constexpr):  # fmt: skip
    """One chunk of BN rows scanned from the carries p_c with plain combines and plain states (scan 0, as
    the first pass of core.late_rows), plain combines (1) and contained (2): x, xn, the new carry and the chunk's
    product of a of each, at p_out[scan, output]."""
    o_n = tl.arange(0, BN)
    o_row = o_n.to(tl.int64) * T
    _o_t, m, off, _o_nb, _m_nb = core.chunk(0, T, o_row, o_n, o_n < BN, BT, REVERSE, FORM)
    b_a = tl.load(p_a + off, mask=m, other=1.0)
    b_b = tl.load(p_b + off, mask=m, other=0.0)
    b_c = core.carry_tile(tl.load(p_c + o_n), BT, FORM)
    for SCAN in tl.static_range(3):
        x, xn, c, A = core.scan_states(b_a, b_b, b_c, BT, REVERSE, FORM, False, NEXT, SCAN == 2, SCAN > 0)
        p_o = p_out + SCAN * 4 * BN * T
        tl.store(p_o + off, x, mask=m)
        tl.store(p_o + BN * T + off, xn, mask=m)
        tl.store(p_o + 2 * BN * T + o_n, core.carry_row(c, FORM))
        tl.store(p_o + 3 * BN * T + o_n, A)


@pytest.mark.parametrize("next_", [False, True], ids=["x", "x-and-next"])
@pytest.mark.parametrize(
    "form, bt, reverse",
    [
        (Form.PLAIN, 32, True),
        (Form.PLAIN, 32, False),
        (Form.GROUPS4, 32, True),
        (Form.GROUPS8, 64, True),
        (Form.ENV_GROUPS, 8, True),
        (Form.DESCENDING, 32, True),
    ],  # fmt: skip
    ids=["plain", "plain-forward", "groups4", "groups8", "env-groups", "descending"],
)
def test_plain_scan_gives_the_contained_bits_on_finite_data(kernel_path, form, bt, reverse, next_):
    """The kernels scan a chunk plainly unless a value it reads is non-finite (kernels/core.py): on finite data
    (coefficients with exact zeros, as done steps give) the plain scan, with states applied by a select or by
    plain arithmetic, must give the contained scan's bits, up to the sign of a zero."""
    bn = 4
    g = torch.Generator().manual_seed(bt + 7 * int(form) + 100 * next_)
    a = torch.rand(bn, bt, generator=g, dtype=torch.float64)
    a[torch.rand(bn, bt, generator=g) < 0.2] = 0.0
    a = a.to(torch.float32).to(kernel_path.device)
    b = torch.randn(bn, bt, generator=g).to(kernel_path.device)
    c = torch.randn(bn, generator=g).to(kernel_path.device)
    out = torch.zeros(3, 4, bn, bt, device=kernel_path.device)
    _both_scans[(1,)](a, b, c, out, bt, BN=bn, BT=bt, FORM=int(form), REVERSE=reverse, NEXT=next_)
    plain, plain_combines, contained = out.cpu()
    assert torch.isfinite(plain).all()
    assert torch.equal(plain, contained)  # -0.0 == 0.0
    assert torch.equal(plain_combines, contained)
