"""GAE, V-trace and the returns on env-major rows of exactly 4 or 8 steps (Plan.exact_t; rl_triton/ops): the row
length as a constexpr, under the launcher's plan and under explicit plans of other (steps, warps), against the
float64 reference (or, for the private next-value forms, the PyTorch path) and bit for bit against the plan without
it (only the loads and the layout change, not the arithmetic). Rows of other lengths (1, 2, 5) keep the plan without
it. Then the other constexpr row forms: one chunk of 1024 or more steps (exact_t), several whole chunks (whole)."""

from dataclasses import replace

import pytest
import torch

import rl_triton as R
from rl_triton.functional import gae_with_next_values, returns_with_advantages, vtrace_with_next_values
from rl_triton.kernels import launch, plans
from rl_triton.kernels.plans import Form, Split
from tests import reference, test_discounted_returns, test_gae, test_lambda_returns, test_retrace, test_vtrace
from tests._helpers import F32_TOL, FLOAT_DTYPES, assert_close, call_unmutated, randn, term_trunc, to_flags

F32 = torch.float32
BF16_TOL = next({"atol": p.values[1], "rtol": p.values[2]} for p in FLOAT_DTYPES if p.values[0] == torch.bfloat16)


def _next_values_case(fn, kind):
    """A case of a private next-value form: (make, launcher kind); make gives (function, args, kwargs)."""

    def make(shape, *, device, dtype, flag_dtype):
        r, v, nv, lpt, lpb = (randn(shape, dtype, device) for _ in range(5))
        term, trunc = term_trunc(shape, 0.1, 0.1)
        term, done = to_flags(term, flag_dtype, device), to_flags(term | trunc, flag_dtype, device)
        if fn == "gae":
            return gae_with_next_values, (r, v, nv, term, done), {"gamma": 0.97, "lambda_": 0.9, "targets": True}
        if fn == "vtrace":
            return vtrace_with_next_values, (lpt, lpb, v, nv, r, term, done), {"gamma": 0.97, "rho_bar": 1.2}
        kwargs = {"gamma": 0.97, "lambda_": 0.8, "next_values": nv, "bootstrap_values": nv}
        return returns_with_advantages, (r, v, term, done), kwargs

    return make, kind


def _public_case(module, variant, kind, **extra):
    def make(shape, *, device, dtype, flag_dtype):
        args, kwargs = module.make_case(shape, device=device, dtype=dtype, flag_dtype=flag_dtype, variant=variant)
        return getattr(R, module.FN), args, kwargs | extra

    return make, kind


CASES = {
    "gae-trunc": _public_case(test_gae, "trunc", "gae"),
    "gae-last": _public_case(test_gae, "last_value", "gae"),
    "gae-boot": _public_case(test_gae, "boot", "gae"),
    "gae-plain": _public_case(test_gae, "plain", "gae"),
    "gae-next": _next_values_case("gae", "gae"),
    "vtrace-trunc": _public_case(test_vtrace, "trunc", "vtrace", rho_bar=1.2, c_bar=0.9),
    "vtrace-last": _public_case(test_vtrace, "last_value", "vtrace"),
    "vtrace-next": _next_values_case("vtrace", "vtrace"),
    "discounted-trunc": _public_case(test_discounted_returns, "trunc", "returns"),
    "discounted-plain": _public_case(test_discounted_returns, "plain", "returns"),
    "lambda-trunc": _public_case(test_lambda_returns, "trunc", "returns_nv"),
    "lambda-noboot": _public_case(test_lambda_returns, "trunc-noboot", "returns_nv"),
    "lambda-boot": _public_case(test_lambda_returns, "boot", "returns_nv"),
    "returns-adv": _next_values_case("returns", "returns_nv"),
}

# TD(lambda) with truncateds and bootstrap values sums two products, of which the compiler fuses one into an FMA,
# and which one depends on the layout; the plan without exact_t fuses the other one where a thread holds exactly
# one element (fused.returns_kernel): there the two differ in the last bit.
_TWO_PRODUCTS = ("lambda-trunc", "returns-adv")


def _rows(shape):
    return (1, shape[0]) if len(shape) == 1 else shape


def _shape_id(shape):
    return f"T{shape[0]}-1d" if len(shape) == 1 else f"N{shape[0]}-T{shape[1]}"


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _checked(fn, args, kwargs, tol, plan):
    """``fn(*args, **kwargs, plan=plan)`` as a tuple, inputs unmodified, checked against the float64 reference (a
    private next-value form: against the PyTorch path)."""
    got = _as_tuple(call_unmutated(fn, *args, **kwargs, plan=plan))
    if hasattr(reference, fn.__name__):
        want = _as_tuple(getattr(reference, fn.__name__)(*args, **kwargs))
        inputs = [a.untyped_storage().data_ptr() for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        for g, w in zip(got, want, strict=True):
            assert_close(g, w, **tol, dtype=args[0].dtype, device=args[0].device)
            assert g.untyped_storage().data_ptr() not in inputs  # a fresh output, never a view of an input
        return got
    with R.use_backend("torch"):
        cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        want = _as_tuple(fn(*(a.cpu() for a in args), **cpu))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu().double(), w.double(), atol=tol["atol"], rtol=tol["rtol"])
    return got


def _assert_same_bits(got, before, last_bit=None):
    """``got`` equals ``before`` bit for bit or, with ``last_bit``, to that relative precision (where the compiler
    may fuse other products into FMAs)."""
    for g, b in zip(got, before, strict=True):
        if last_bit is None:
            assert torch.equal(g, b)
        else:
            torch.testing.assert_close(g, b, atol=last_bit * b.abs().max().item(), rtol=last_bit)


# ---------------------------------------------------------------------------------------- rows of 4 or 8 steps


def _without_exact(n, t):
    """The plan of these rows without exact_t, as the launcher had it: the walked tiles in env-major groups, with
    neither the row length nor a row divisor (which rows of 4 and 8 steps would otherwise take)."""
    return replace(plans.tile(n, t), form=Form.ENV_GROUPS)


SHAPES = [(300, 8), (9, 4), (3, 8), (8,), (4,), (70, 5), (17, 2), (3, 1)]
# Explicit exact plans beside the launcher's: name -> (steps per program, None for the launcher's; warps). Programs
# that give each thread half a row (1024 steps, 8 warps), a whole row (1024, 4; 512, 2) or two rows (2048, 4); the
# other step counts on three shapes only, to keep CI short.
VARIANTS = {"w8": (None, 8), "w4": (None, 4), "b512-w2": (512, 2), "b2048-w4": (2048, 4)}
_PROGRAM_SHAPES = ((300, 8), (9, 4), (8,))


def _cases(cases, shapes, variants, dtype=F32):
    """(case, shape, plan) params: the launcher's plan (None), and for rows of 4 or 8 steps each variant that is not
    the launcher's plan (that would be the same launch again)."""
    out = []
    for case in cases:
        for shape in shapes:
            out.append(pytest.param(case, shape, None, id=f"{case}-{_shape_id(shape)}-chosen"))
            n, t = _rows(shape)
            if t not in (4, 8):
                continue
            chosen = plans.choose(CASES[case][1], n, t, dtype)
            for name, (block, warps) in variants.items():
                if block and shape not in _PROGRAM_SHAPES:
                    continue
                plan = replace(chosen, bn=plans.tile(n, t, block).bn if block else chosen.bn, warps=warps)
                if plan != chosen:
                    out.append(pytest.param(case, shape, plan, id=f"{case}-{_shape_id(shape)}-{name}"))
    return out


def _check_exact(kernel_path, case, shape, plan, dtype=F32, flag_dtype=torch.bool, tol=F32_TOL):
    """``plan`` (None: the launcher's, whose choice is checked) against the reference and against the plan without
    exact_t."""
    make, kind = CASES[case]
    n, t = _rows(shape)
    exact = t in (4, 8)
    before = _without_exact(n, t)
    if plan is None:
        chosen = plans.choose(kind, n, t, dtype)
        if exact:  # rows of 8 a whole row per thread (4 warps) for V-trace and 2-byte floats
            whole_rows = t == 8 and (kind == "vtrace" or dtype.itemsize == 2)
            assert chosen == replace(before, warps=4 if whole_rows else 8, exact_t=True)
        else:
            assert chosen == before
    else:
        assert plan.exact_t and plan.form is Form.ENV_GROUPS and plan.bt == t
    fn, args, kwargs = make(shape, device=kernel_path.device, dtype=dtype, flag_dtype=flag_dtype)
    got = _checked(fn, args, kwargs, tol, plan)
    if not exact:  # the launcher's plan is the one without exact_t
        return
    old = _as_tuple(fn(*args, **kwargs, plan=before))
    one_each = before.bn * before.bt == 32 * before.warps
    loose = case in _TWO_PRODUCTS and one_each and kernel_path.name == "cuda"
    # V-trace with two rows per thread: the compiler fuses other products of the plain scan into FMAs than under
    # the plan without exact_t (the last bit of 3 cases differed on an H200)
    two_rows = plan is not None and plan.bn * plan.bt > 32 * plan.warps * t
    loose = loose or (kind == "vtrace" and two_rows and kernel_path.name == "cuda")
    _assert_same_bits(got, old, (1e-6 if dtype == F32 else 1e-2) if loose else None)  # the same arithmetic


@pytest.mark.parametrize("case, shape, plan", _cases(CASES, SHAPES, VARIANTS))
def test_exact_rows(kernel_path, case, shape, plan):
    _check_exact(kernel_path, case, shape, plan)


@pytest.mark.parametrize("flag_dtype", [torch.uint8, torch.float32], ids=["uint8", "float32"])
@pytest.mark.parametrize(
    "case, shape, plan",
    _cases(["gae-trunc", "vtrace-next", "discounted-trunc", "lambda-trunc", "returns-adv"], [(64, 8), (33, 4)], {}),
)
def test_exact_rows_flag_dtypes(kernel_path, case, shape, plan, flag_dtype):
    _check_exact(kernel_path, case, shape, plan, flag_dtype=flag_dtype)


_BF16_CASES = ["gae-trunc", "gae-next", "vtrace-trunc", "vtrace-next", "lambda-noboot", "returns-adv"]


@pytest.mark.parametrize(
    "case, shape, plan", _cases(_BF16_CASES, [(40, 8), (40, 4)], {"w8": VARIANTS["w8"]}, dtype=torch.bfloat16)
)
def test_exact_rows_bfloat16(kernel_path, case, shape, plan):
    bf16 = torch.bfloat16
    _check_exact(kernel_path, case, shape, plan, dtype=bf16, flag_dtype=bf16, tol=BF16_TOL)


@pytest.mark.parametrize("t", [4, 8])
def test_exact_rows_round_alike_at_any_number_of_envs(kernel_path, t):
    """TD(lambda) with truncateds and bootstrap values on rows of exactly 4 or 8 steps: a row's returns do
    not depend on how many envs the call has (programs of 32 or 64 envs hold one element per thread, of
    300 envs four: layouts on which the compiler fused different products; fused.returns_kernel)."""
    args, kwargs = test_lambda_returns.make_case((300, t), device=kernel_path.device)
    whole = R.compute_lambda_returns(*args, **kwargs)
    for n in (32, 64):
        part = R.compute_lambda_returns(
            *(a[:n] for a in args), **{**kwargs, "bootstrap_values": kwargs["bootstrap_values"][:n]}
        )
        assert torch.equal(part, whole[:n])


# ---------------------------------------------------------------------------------------- longer rows

# The kinds whose rows of one chunk of 1024-4096 steps the launcher gives exact_t (V-trace's ran slower).
_EXACT_ONE_CHUNK = ("gae", "returns", "returns_nv")


@pytest.mark.parametrize(
    "case, shape", [pytest.param(c, s, id=f"{c}-{_shape_id(s)}") for c in CASES for s in [(3, 1024), (2, 2048)]]
)
def test_one_chunk_rows(kernel_path, case, shape):
    """Rows of exactly one chunk of 1024 or more steps, in programs of one env: with exact_t the row length is a
    constexpr and the env mask a constant (core.env_block), so that every mask of the chunk folds away. Against the
    reference, and against the plan without it: the same bits, but where the compiler may fuse the other product
    of TD(lambda)'s sum (see above), or contract V-trace's differently."""
    make, kind = CASES[case]
    fn, args, kwargs = make(shape, device=kernel_path.device, dtype=F32, flag_dtype=torch.bool)
    chosen = plans.choose(kind, *shape, F32)
    assert chosen.exact_t == (kind in _EXACT_ONE_CHUNK)
    exact = replace(chosen, exact_t=True)  # V-trace's too, which the launcher leaves out
    assert exact.split is Split.SINGLE and exact.bn == 1 and exact.bt == shape[1]
    assert exact.form in (Form.GROUPS4, Form.GROUPS8)
    before = _as_tuple(fn(*args, **kwargs, plan=replace(chosen, exact_t=False)))
    got = _checked(fn, args, kwargs, F32_TOL, exact)
    loose = (case in _TWO_PRODUCTS or kind == "vtrace") and kernel_path.name == "cuda"
    _assert_same_bits(got, before, 1e-6 if loose else None)


# Single-pass rows of several whole chunks take the whole constexpr for these kinds and element sizes (Retrace:
# only 2-byte floats): the launcher's plans of rows of 512 envs, which fill the GPU unsplit.
_WHOLE_POLICY = [
    ("returns", 6144, F32, True),
    ("returns_nv", 6144, F32, True),
    ("returns", 6144, torch.bfloat16, True),
    ("returns_nv", 6144, torch.float16, True),
    ("gae", 3072, F32, False),
    ("vtrace", 6144, F32, False),
    ("retrace", 3072, F32, False),
    ("retrace", 3072, torch.bfloat16, True),
]


@pytest.mark.parametrize(
    "kind, t, dtype, whole",
    [pytest.param(*c, id=f"{c[0]}-T{c[1]}-{str(c[2]).removeprefix('torch.')}") for c in _WHOLE_POLICY],
)
def test_whole_chunks_policy(kind, t, dtype, whole):
    plan = plans.choose(kind, 512, t, dtype, num_actions=4)
    assert plan.split is Split.SINGLE and plan.bn == 1 and t % plan.bt == 0 and t > plan.bt
    assert plan.whole == whole


# Rows of one 512-step chunk: for 2-byte floats one-env programs of 2 warps (GAE, V-trace capped at 72 registers,
# both returns), else two-env programs of 4 warps (GAE capped at 48 registers in float32).
_TILE_POLICY = [
    ("returns", torch.bfloat16, 1, 2, None),
    ("returns", torch.float16, 1, 2, None),
    ("returns", F32, 2, 4, None),
    ("returns_nv", torch.bfloat16, 1, 2, None),
    ("returns_nv", F32, 2, 4, None),
    ("gae", torch.bfloat16, 1, 2, None),
    ("gae", torch.float16, 1, 2, None),
    ("gae", F32, 2, 4, 48),
    ("vtrace", torch.bfloat16, 1, 2, 72),
    ("vtrace", F32, 2, 4, None),
    ("forward", torch.bfloat16, 2, 4, None),
    ("retrace", torch.bfloat16, 2, 8, None),
]


@pytest.mark.parametrize(
    "kind, dtype, bn, warps, maxnreg",
    [pytest.param(*c, id=f"{c[0]}-{str(c[1]).removeprefix('torch.')}") for c in _TILE_POLICY],
)
def test_tile_policy(kind, dtype, bn, warps, maxnreg):
    plan = plans.choose(kind, 16384, 512, dtype, num_actions=4 if kind == "retrace" else 0)
    assert (plan.split, plan.bn, plan.bt) == (Split.SINGLE, bn, 512)
    assert (plan.warps, plan.maxnreg) == (warps, maxnreg)


# Which single-pass launches store their plain outputs first and test them after (Plan.late), with their caps:
# programs of one env, of one chunk or walked, where plans._LATE or plans._LATE_WALKED lists their chunk, warps and
# element size; GAE tests before the scan, its float32 rows walked in 1024-step chunks with a cap of 56 registers.
_LATE_POLICY = [
    ("returns", 8192, 4096, F32, True, 64),
    ("returns", 2048, 3000, torch.bfloat16, True, 64),
    ("returns", 4096, 2048, torch.bfloat16, True, 56),
    ("returns", 16384, 512, torch.bfloat16, True, None),  # one env in 2 warps (plans._TILE_16BIT)
    ("returns", 16384, 512, F32, False, None),  # two envs a program
    ("returns", 1024, 8192, F32, True, 48),
    ("returns_nv", 8192, 4096, torch.bfloat16, True, 64),
    ("returns_nv", 8192, 4096, F32, True, 64),
    ("forward", 8192, 4096, torch.float16, True, None),
    ("forward", 4096, 2048, F32, False, None),
    ("forward", 4096, 2048, torch.bfloat16, True, None),
    ("gae", 8192, 4096, F32, False, 56),
    ("gae", 1024, 8192, F32, False, 56),
    ("gae", 8192, 4096, torch.bfloat16, False, None),
    ("vtrace", 8192, 4096, F32, True, None),
    ("vtrace", 4096, 2048, torch.bfloat16, False, 80),
    ("vtrace", 4096, 2048, F32, True, 80),
    ("vtrace", 16384, 512, torch.bfloat16, False, 72),
    ("returns", 64, 262144, F32, False, 64),  # the look-back: never late
]


@pytest.mark.parametrize(
    "kind, n, t, dtype, late, maxnreg",
    [pytest.param(*c, id=f"{c[0]}-{c[1]}x{c[2]}-{str(c[3]).removeprefix('torch.')}") for c in _LATE_POLICY],
)
def test_late_policy(kind, n, t, dtype, late, maxnreg):
    plan = plans.choose(kind, n, t, dtype)
    assert (plan.late, plan.maxnreg) == (late, maxnreg)
    assert not plans.choose(kind, n, t, dtype, time_major=True).late


def test_late_refused_where_blocks_publish():
    """Look-back blocks publish their aggregate before their outputs are tested: they never take Plan.late, which
    single-pass and two-pass launches of either layout may."""
    for time_major in (False, True):
        lookback = plans.Plan(1, 32, 4, Form.GROUPS4, Split.LOOKBACK, window=4, late=True)
        with pytest.raises(ValueError, match="late needs a single pass or two passes"):
            launch.check_plan(lookback, "gae", 2, 160, F32, time_major)
        launch.check_plan(plans.Plan(1, 32, 4, Form.GROUPS4, Split.TWO_PASS, late=True), "gae", 2, 160, F32, time_major)
        launch.check_plan(plans.Plan(1, 32, 4, late=True), "gae", 64, 160, F32, time_major)


_WHOLE_CASES = [(c, (3, 6144)) for c in CASES if CASES[c][1] in ("returns", "returns_nv")] + [
    ("gae-trunc", (3, 3072)),  # kinds the launcher leaves out: the form itself
    ("vtrace-trunc", (3, 6144)),
    ("retrace", (3, 3072)),
]


@pytest.mark.parametrize("case, shape", [pytest.param(c, s, id=f"{c}-{_shape_id(s)}") for c, s in _WHOLE_CASES])
def test_whole_chunks(kernel_path, case, shape):
    """Single-pass rows of several whole chunks in programs of one env: whole drops the time mask and makes the env
    mask a constant (core.chunk, core.env_block). The plan the launcher gives 512 such rows (one pass), on 3 rows (a
    few envs walk them), float32 whatever the launcher's element sizes. Against the reference, and against the plan
    without whole: the same bits (V-trace's and Retrace's products may be fused differently on the GPU)."""
    if case == "retrace":
        kind = "retrace"
        fn, (args, kwargs) = R.compute_retrace, test_retrace.make_case(shape, device=kernel_path.device)
    else:
        make, kind = CASES[case]
        fn, args, kwargs = make(shape, device=kernel_path.device, dtype=F32, flag_dtype=torch.bool)
    plan = plans.choose(kind, 512, shape[1], F32, num_actions=4)  # make_case's 4 actions
    assert plan.split is Split.SINGLE and plan.bn == 1 and shape[1] // plan.bt > 1
    before = _as_tuple(fn(*args, **kwargs, plan=replace(plan, whole=False)))
    got = _checked(fn, args, kwargs, F32_TOL, replace(plan, whole=True))
    _assert_same_bits(got, before, 1e-6 if kind in ("retrace", "vtrace") and kernel_path.name == "cuda" else None)
