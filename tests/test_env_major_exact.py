"""GAE, V-trace and the returns on env-major rows of exactly 4 or 8 steps (launch.scan_form; kernels/
fused.py): the row length as a constexpr (EXACT_T), in programs of several (steps, warps), against the
float64 reference (or, for the private next-value forms, the PyTorch path) and bit for bit against the
kernels without it (only the loads and the layout change, not the arithmetic). Rows of other lengths
(1, 2, 5) keep the form without it."""

import pytest
import torch

import rl_triton as R
from rl_triton.functional import gae_with_next_values, returns_with_advantages, vtrace_with_next_values
from tests import reference, test_discounted_returns, test_gae, test_lambda_returns, test_vtrace
from tests._helpers import F32_TOL, FLOAT_DTYPES, check, randn, term_trunc, to_flags


def _next_values_case(fn, kind):
    """A case of a private next-value form: (function, args, kwargs, launcher kind)."""

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

# (letters, steps per program, warps): E (launch._EXACT_T); None: the launcher's. Programs that give each
# thread half a row (1024, 8), a whole row (1024, 4; 512, 2) or two rows (2048, 4).
VARIANTS = [("E", None, None), ("E", None, 8), ("E", None, 4), ("E", 512, 2), ("E", 2048, 4)]
SHAPES = [(300, 8), (9, 4), (3, 8), (8,), (4,), (70, 5), (17, 2), (3, 1)]
# TD(lambda) with truncateds and bootstrap values sums two products, of which the compiler fuses one into an
# FMA, and which one depends on the layout; the form without EXACT_T fuses the other one where a thread holds
# exactly one element (fused.returns_kernel): there the two forms differ in the last bit.
_TWO_PRODUCTS = ("lambda-trunc", "returns-adv")


def _use(monkeypatch, variant):
    from rl_triton.kernels import launch

    flags, block, warps = variant
    monkeypatch.setattr(launch, "_EXACT_T", "E" in flags)
    # the form before EXACT_T also had no row divisor (launch._row_divisor: T = 4 and 8 would take one)
    monkeypatch.setattr(launch, "_ROW_DIVISOR", "E" in flags)
    monkeypatch.setattr(launch, "_EXACT_T_BLOCK", block)
    monkeypatch.setattr(launch, "_EXACT_T_WARPS", warps)
    return launch


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


def _checked(fn, args, kwargs, tol):
    """``fn(*args, **kwargs)`` as a tuple, checked against the float64 reference (a private next-value form: against
    the PyTorch path)."""
    if hasattr(reference, fn.__name__):
        return _as_tuple(check(fn.__name__, *args, **kwargs, **tol)[0])
    got = _as_tuple(fn(*args, **kwargs))
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


def _check_variant(path, monkeypatch, variant, case, shape, dtype=torch.float32, flag_dtype=torch.bool, tol=F32_TOL):
    make, kind = CASES[case]
    fn, args, kwargs = make(shape, device=path.device, dtype=dtype, flag_dtype=flag_dtype)
    n, t = (1, shape[0]) if len(shape) == 1 else shape
    launch = _use(monkeypatch, ("", None, None))
    before = _as_tuple(fn(*args, **kwargs))
    old = launch.scan_form(kind, n, t, dtype).layout.tiles
    launch = _use(monkeypatch, variant)
    form = launch.scan_form(kind, n, t, dtype)
    assert form.group == -4
    exact = "E" in variant[0] and t in (4, 8)
    assert form.exact_t == exact
    if exact:
        whole_rows = t == 8 and (kind == "vtrace" or dtype.itemsize == 2)
        assert form.layout.tiles.warps == variant[2] or (
            variant[2] is None and form.layout.tiles.warps == (4 if whole_rows else 8)
        )
    got = _checked(fn, args, kwargs, tol)
    one_each = old.bn * old.bt == 32 * old.warps
    loose = exact and case in _TWO_PRODUCTS and one_each and path.name == "cuda"
    _assert_same_bits(got, before, (1e-6 if dtype == torch.float32 else 1e-2) if loose else None)  # same arithmetic


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{v[1] or 'default'}-w{v[2] or 'default'}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", list(CASES))
def test_exact_rows(path, monkeypatch, variant, shape, case):
    if not path.is_kernel:
        pytest.skip("a kernel tile form")
    if shape[-1] not in (4, 8) and variant != ("E", None, None):
        pytest.skip("rows of other lengths take one form whatever the knobs")
    if variant[1] is not None and shape not in ((300, 8), (9, 4), (8,)):
        pytest.skip("other programs: three shapes keep CI short")
    _check_variant(path, monkeypatch, variant, case, shape)


@pytest.mark.parametrize("flag_dtype", [torch.uint8, torch.float32], ids=str)
@pytest.mark.parametrize("shape", [(64, 8), (33, 4)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", ["gae-trunc", "vtrace-next", "discounted-trunc", "lambda-trunc", "returns-adv"])
def test_exact_rows_flag_dtypes(path, monkeypatch, flag_dtype, shape, case):
    if not path.is_kernel:
        pytest.skip("a kernel tile form")
    _check_variant(path, monkeypatch, ("E", None, None), case, shape, flag_dtype=flag_dtype)


_BF16_CASES = ["gae-trunc", "gae-next", "vtrace-trunc", "vtrace-next", "lambda-noboot", "returns-adv"]


@pytest.mark.parametrize("variant", [("E", None, None), ("E", None, 8)], ids=["E", "E-w8"])
@pytest.mark.parametrize("shape", [(40, 8), (40, 4)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", _BF16_CASES)
def test_exact_rows_bfloat16(path, monkeypatch, variant, shape, case):
    if not path.is_kernel:
        pytest.skip("a kernel tile form")
    dtype, atol, rtol = next(p.values for p in FLOAT_DTYPES if p.values[0] == torch.bfloat16)
    _check_variant(
        path, monkeypatch, variant, case, shape, dtype=dtype, flag_dtype=dtype, tol={"atol": atol, "rtol": rtol}
    )


@pytest.mark.parametrize("t", [4, 8])
def test_exact_rows_round_alike_at_any_number_of_envs(path, t):
    """TD(lambda) with truncateds and bootstrap values on rows of exactly 4 or 8 steps: a row's returns do
    not depend on how many envs the call has (programs of 32 or 64 envs hold one element per thread, of
    300 envs four: layouts on which the compiler fused different products; fused.returns_kernel)."""
    if not path.is_kernel:
        pytest.skip("a kernel tile form")
    args, kwargs = test_lambda_returns.make_case((300, t), device=path.device)
    whole = R.compute_lambda_returns(*args, **kwargs)
    for n in (32, 64):
        part = R.compute_lambda_returns(
            *(a[:n] for a in args), **{**kwargs, "bootstrap_values": kwargs["bootstrap_values"][:n]}
        )
        assert torch.equal(part, whole[:n])


@pytest.mark.parametrize("shape", [(3, 1024), (2, 2048)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("case", list(CASES))
def test_one_chunk_rows(path, monkeypatch, shape, case):
    """Rows of exactly one chunk of 1024 or more steps, in programs of one env (launch._EXACT_T_ONE_CHUNK): the
    row length a constexpr and the env mask a constant (core.env_block), so that every mask of the chunk folds away.
    Against the reference, and against the form without them: the same bits, but where the compiler may fuse the
    other product of TD(lambda)'s sum (see above)."""
    if not path.is_kernel:
        pytest.skip("a kernel tile form")
    from rl_triton.kernels import launch

    make, kind = CASES[case]
    fn, args, kwargs = make(shape, device=path.device, dtype=torch.float32, flag_dtype=torch.bool)
    assert launch.scan_form(kind, *shape, torch.float32).exact_t == (kind in launch._EXACT_T_ONE_CHUNK)
    monkeypatch.setattr(launch, "_EXACT_T_ONE_CHUNK", ())
    assert not launch.scan_form(kind, *shape, torch.float32).exact_t
    before = _as_tuple(fn(*args, **kwargs))
    monkeypatch.setattr(launch, "_EXACT_T_ONE_CHUNK", (kind,))  # V-trace's too, which the policy leaves out
    form = launch.scan_form(kind, *shape, torch.float32)
    assert form.exact_t and form.layout.tiles.bn == 1 and form.layout.tiles.bt == shape[1] and form.group > 0
    got = _checked(fn, args, kwargs, F32_TOL)
    loose = (case in _TWO_PRODUCTS or kind == "vtrace") and path.name == "cuda"  # V-trace: contracted differently
    _assert_same_bits(got, before, 1e-6 if loose else None)


_WHOLE_CASES = [(c, (3, 6144)) for c in CASES if CASES[c][1] in ("returns", "returns_nv")] + [
    ("gae-trunc", (3, 3072)),  # kernels the policy leaves out: the form itself
    ("vtrace-trunc", (3, 6144)),
    ("retrace", (3, 3072)),
]


@pytest.mark.parametrize("case, shape", _WHOLE_CASES, ids=[f"{c}-{s[0]}x{s[1]}" for c, s in _WHOLE_CASES])
def test_whole_chunks(path, monkeypatch, case, shape):
    """Single-pass rows of several whole chunks in programs of one env (launch._WHOLE_CHUNKS): no time mask and a
    constant env mask (core.chunk, core.env_block). Rows kept unsplit (launch._TARGET_PROGRAMS) so that a few envs
    walk them. Against the reference, and against the form without them: the same bits (V-trace's and Retrace's
    products may be fused differently on the GPU, as with EXACT_T above)."""
    if not path.is_kernel:
        pytest.skip("a kernel tile form")
    from rl_triton.kernels import launch
    from tests import test_retrace

    monkeypatch.setattr(launch, "_TARGET_PROGRAMS", 2)
    if case == "retrace":
        kind = "retrace"
        fn, (args, kwargs) = R.compute_retrace, test_retrace.make_case(shape, device=path.device)
    else:
        make, kind = CASES[case]
        fn, args, kwargs = make(shape, device=path.device, dtype=torch.float32, flag_dtype=torch.bool)

    def form():
        if kind == "retrace":
            return launch.retrace_layout(*shape, 4, torch.float32)  # make_case's 4 actions
        return launch.scan_form(kind, *shape, torch.float32)

    assert form().whole == (4 in launch._WHOLE_CHUNKS.get(kind, ()))
    monkeypatch.setattr(launch, "_WHOLE_CHUNKS", {})
    assert not form().whole
    before = _as_tuple(fn(*args, **kwargs))
    monkeypatch.setattr(launch, "_WHOLE_CHUNKS", {kind: (4,)})  # float32: the policy's Retrace takes 2-byte dtypes
    layout = form().layout
    assert form().whole and layout.nk == 1 and layout.cpb > 1 and layout.tiles.bn == 1
    got = _checked(fn, args, kwargs, F32_TOL)
    _assert_same_bits(got, before, 1e-6 if kind in ("retrace", "vtrace") and path.name == "cuda" else None)
