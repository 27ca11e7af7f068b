"""Per-env and per-step ``gamma`` / ``lambda_`` tensors (docs/semantics.md, "Per-step gamma and lambda"):
every function against the float64 loop references with gamma_t / lambda_t at each step, 1-D calls, a 0-d
tensor equal to the float it holds bit for bit, the conventions pinned by hand-computed values, the errors,
autograd and torch.compile. On the kernel paths the kernels read the tensor discounts; the modules' internal forms
(``*_with_next_values``, ``returns_with_advantages``, ``rows=``) take every tensor on the path's device."""

import re

import pytest
import torch

import rl_triton as R
from rl_triton.functional import gae_with_next_values, returns_with_advantages, vtrace_with_next_values
from tests import reference
from tests._helpers import F32_TOL, F64_TOL, assert_close, check, uniform
from tests.test_discounted_returns import make_case as returns_case
from tests.test_gae import make_case as gae_case
from tests.test_lambda_returns import make_case as lambda_case
from tests.test_retrace import make_case as retrace_case
from tests.test_vtrace import make_case as vtrace_case

MAKE = {
    "compute_gae": gae_case,
    "compute_vtrace": vtrace_case,
    "compute_retrace": retrace_case,
    "compute_discounted_returns": returns_case,
    "compute_lambda_returns": lambda_case,
}
FNS = list(MAKE)
HAS_LAMBDA = {"compute_gae", "compute_retrace", "compute_lambda_returns"}


def discounts(shape, form: str, device, dtype=torch.float32) -> torch.Tensor:
    """A gamma/lambda tensor for a call of per-step ``shape``: "env" (N,), "step" (N, T) (or (T,) for 1-D
    calls), "step-T" (N, T) as the transposed view of a (T, N) tensor. Values spread over [0, 1] with exact 0s
    and 1s among them (a zero discount cuts the recursion as a done step does)."""
    n, t = (1, shape[0]) if len(shape) == 1 else shape
    full = shape if form == "step" else (n,) if form == "env" else (t, n)
    x = uniform(full, 0.3, 1.0, torch.float64)
    x = torch.where(torch.rand(full) < 0.1, torch.zeros_like(x), x)
    x = torch.where(torch.rand(full) < 0.1, torch.ones_like(x), x)
    x = x.to(dtype).to(device)
    return x.T if form == "step-T" else x


def _outs(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def inputs(fn, shape, device, dtype=torch.float32):
    kw = {"dtype": dtype, "device": device}
    if fn == "compute_retrace":
        return retrace_case(shape, **kw)
    return MAKE[fn](shape, **kw)


# (gamma form, lambda_ form): None keeps the make_case float
FORMS = [("env", None), ("step", None), (None, "env"), (None, "step"), ("step", "env"), ("step-T", "step")]


def _apply(fn, kwargs, shape, device, gamma_form, lambda_form, dtype=torch.float32):
    if gamma_form is not None:
        kwargs["gamma"] = discounts(shape, gamma_form, device, dtype)
    if lambda_form is not None and fn in HAS_LAMBDA:
        kwargs["lambda_"] = discounts(shape, lambda_form, device, dtype)
    return kwargs


# every function with each form its arguments have (V-trace and the discounted returns have no lambda_)
FN_FORMS = [
    pytest.param(fn, forms, id=f"{fn}-g-{forms[0]}-l-{forms[1]}")
    for fn in FNS
    for forms in dict.fromkeys(f if fn in HAS_LAMBDA else (f[0], None) for f in FORMS if f[0] or fn in HAS_LAMBDA)
]


@pytest.mark.parametrize("fn,forms", FN_FORMS)
@pytest.mark.parametrize("shape", [(4, 23), (1, 5)], ids=lambda s: f"N{s[0]}-T{s[1]}")
def test_matches_reference(path, fn, shape, forms):
    args, kwargs = inputs(fn, shape, path.device)
    _apply(fn, kwargs, shape, path.device, *forms)
    check(fn, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("shape", [(1,), (2,), (31,)], ids=lambda s: f"T{s[0]}-1d")
@pytest.mark.parametrize("fn", FNS)
def test_one_d_calls(path, fn, shape):
    args, kwargs = inputs(fn, shape, path.device)
    _apply(fn, kwargs, shape, path.device, "step", "step")
    out, _ = check(fn, *args, **kwargs, **F32_TOL)
    assert all(o.shape == shape for o in (out if isinstance(out, tuple) else (out,)))


@pytest.mark.parametrize(
    "dtype,gamma_dtype",
    [(torch.float64, torch.float64), (torch.float64, torch.float32), (torch.float32, torch.float64),
     (torch.float16, torch.float32), (torch.bfloat16, torch.bfloat16)],
    ids=["f64", "f64-g32", "f32-g64", "f16-g32", "bf16"],
)  # fmt: skip
@pytest.mark.parametrize("fn", FNS)
def test_dtypes(path, fn, dtype, gamma_dtype):
    """The discounts may have any float dtype: they are read in the accumulation dtype."""
    shape = (3, 19)
    args, kwargs = inputs(fn, shape, path.device, dtype)
    _apply(fn, kwargs, shape, path.device, "step", "env", gamma_dtype)
    tol = {torch.float64: F64_TOL, torch.float32: F32_TOL}.get(dtype, {"atol": 2e-2, "rtol": 2e-2})
    if dtype == torch.float64 and gamma_dtype == torch.float32:
        tol = F64_TOL  # float32 discounts are exact in float64
    check(fn, *args, **kwargs, **tol)


@pytest.mark.parametrize("fn", FNS)
def test_zero_d_tensor_is_the_float_bit_for_bit(path, fn):
    """A 0-d tensor keeps today's scalar path: the same bits as the float it holds (twice, so that the
    kernel paths' cached fast path is taken too)."""
    args, kwargs = inputs(fn, (3, 21), path.device)
    floats = dict(kwargs, gamma=0.93, **({"lambda_": 0.71} if fn in HAS_LAMBDA else {}))
    tensors = dict(floats, gamma=torch.tensor(0.93, dtype=torch.float64, device=path.device))
    if fn in HAS_LAMBDA:
        tensors["lambda_"] = torch.tensor(0.71, dtype=torch.float64, device=path.device)
    for _ in range(2):
        want = getattr(R, fn)(*args, **floats)
        got = getattr(R, fn)(*args, **tensors)
        for g, w in zip(_outs(got), _outs(want), strict=True):
            assert torch.equal(g, w)


@pytest.mark.parametrize("form", ["env", "step"])
@pytest.mark.parametrize("fn", FNS)
def test_constant_tensor_is_the_float(path, fn, form):
    """A per-env or per-step tensor holding one value everywhere gives the float call's numbers."""
    shape = (3, 17)
    args, kwargs = inputs(fn, shape, path.device, torch.float64)
    floats = dict(kwargs, gamma=0.9, **({"lambda_": 0.8} if fn in HAS_LAMBDA else {}))
    full = (3,) if form == "env" else shape
    tensors = dict(floats, gamma=torch.full(full, 0.9, dtype=torch.float64, device=path.device))
    if fn in HAS_LAMBDA:
        tensors["lambda_"] = torch.full(full, 0.8, dtype=torch.float64, device=path.device)
    got, want = getattr(R, fn)(*args, **tensors), getattr(R, fn)(*args, **floats)
    for g, w in zip(_outs(got), _outs(want), strict=True):
        assert_close(g, w, **F64_TOL)


def test_fast_path_signature_then_tensor(path):
    """A signature cached by float calls (the kernel paths' fast path) still takes a tensor gamma right."""
    args, kwargs = inputs("compute_gae", (2, 9), path.device)
    R.compute_gae(*args, **kwargs)
    R.compute_gae(*args, **kwargs)
    kwargs["gamma"] = discounts((2, 9), "step", path.device)
    kwargs["lambda_"] = discounts((2, 9), "env", path.device)
    check("compute_gae", *args, **kwargs, **F32_TOL)


# ------------------------------------------------------------------------------------------
# The conventions, by hand


def test_gamma_t_discounts_step_t_to_t_plus_1(path):
    # G_2 = 1; G_1 = 1 + 0.25 G_2 = 1.25; G_0 = 1 + 0.5 G_1 = 1.625
    d = path.device
    gamma = torch.tensor([0.5, 0.25, 0.0], device=d)
    out = R.compute_discounted_returns(torch.ones(3, device=d), torch.zeros(3, device=d), gamma=gamma)
    torch.testing.assert_close(out.cpu(), torch.tensor([1.625, 1.25, 1.0]))
    # GAE with V = 0: A_t = r_t + gamma_t lambda_t A_{t+1}; A_1 = 1 + 0.25 * 0.5 = 1.125, A_0 = 1 + 0.5 * 1 * A_1
    adv = R.compute_gae(
        torch.ones(3, device=d), torch.zeros(3, device=d), torch.zeros(3, device=d), gamma=gamma,
        lambda_=torch.tensor([1.0, 0.5, 0.0], device=d),
    )  # fmt: skip
    torch.testing.assert_close(adv.cpu(), torch.tensor([1.5625, 1.125, 1.0]))


def test_per_env_gamma(path):
    # env 0 never discounts, env 1 stops after one step
    d = path.device
    out = R.compute_discounted_returns(
        torch.ones(2, 3, device=d), torch.zeros(2, 3, device=d), gamma=torch.tensor([1.0, 0.0], device=d)
    )
    torch.testing.assert_close(out.cpu(), torch.tensor([[3.0, 2.0, 1.0], [1.0, 1.0, 1.0]]))


def test_retrace_c_uses_lambda_of_its_own_step(path):
    """Delta_t's carry is gamma_t c_{t+1}, c_{t+1} = lambda_{t+1} min(c_bar, ratio_{t+1}): lambda_0 never
    matters, lambda_1 = 0 cuts the trace into step 0."""
    args, kwargs = inputs("compute_retrace", (2, 6), path.device, torch.float64)
    args[6] = torch.zeros_like(args[6])
    args[7] = torch.zeros_like(args[7])
    lam = torch.full((2, 6), 0.9, dtype=torch.float64, device=path.device)
    base = R.compute_retrace(*args, **dict(kwargs, lambda_=lam))[0]
    first = lam.clone()
    first[:, 0] = 0.0
    torch.testing.assert_close(R.compute_retrace(*args, **dict(kwargs, lambda_=first))[0], base)
    second = lam.clone()
    second[:, 1] = 0.0
    q = R.compute_retrace(*args, **dict(kwargs, lambda_=second))[0]
    assert not torch.allclose(q[:, 0], base[:, 0])
    torch.testing.assert_close(q[:, 1:], base[:, 1:])
    check("compute_retrace", *args, **dict(kwargs, lambda_=second), **F64_TOL)


# ------------------------------------------------------------------------------------------
# The modules' internal forms (TorchRL's convention), against float64 loops with per-step discounts


def _gae_loop(r, v, nv, done, term, g, lam):
    out, acc = torch.zeros_like(r), torch.zeros(r.shape[0], dtype=r.dtype)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + g[:, t] * (~term[:, t]) * nv[:, t] - v[:, t]
        acc = delta + g[:, t] * lam[:, t] * (~done[:, t]) * acc
        out[:, t] = acc
    return out


def _vtrace_loop(r, v, nv, done, term, lpt, lpb, g, rho_bar, c_bar):
    ratio = torch.exp(lpt - lpb)
    rho, c = ratio.clamp(max=rho_bar), ratio.clamp(max=c_bar)
    n, t_len = r.shape
    d, acc = torch.zeros_like(r), torch.zeros(n, dtype=r.dtype)
    for t in reversed(range(t_len)):
        delta = rho[:, t] * (r[:, t] + g[:, t] * (~term[:, t]) * nv[:, t] - v[:, t])
        acc = delta + g[:, t] * c[:, t] * (~done[:, t]) * acc
        d[:, t] = acc
    vs = v + d
    nxt = torch.where(done, nv, torch.cat([vs[:, 1:], nv[:, -1:]], 1))
    nxt[:, -1] = nv[:, -1]
    return vs, rho * (r + g * (~term) * nxt - v)


def _next_data(n, t, device):
    """(rewards, values, next values, dones, terminateds, target and behaviour log-probs) on ``device``."""
    r, v, nv, lpt, lpb = (torch.randn(n, t, dtype=torch.float64) for _ in range(5))
    done = torch.rand(n, t) < 0.2
    term = done & (torch.rand(n, t) < 0.5)
    return tuple(x.to(device) for x in (r, v, nv, done, term, 0.5 * lpt, 0.5 * lpb))


@pytest.mark.parametrize("targets", [False, True])
def test_gae_with_next_values(path, targets):
    r, v, nv, done, term, _, _ = _next_data(3, 15, "cpu")
    g, lam = discounts((3, 15), "step", "cpu", torch.float64), discounts((3, 15), "env", "cpu", torch.float64)
    want = _gae_loop(r, v, nv, done, term, g, lam[:, None].expand(3, 15))
    d = path.device
    got = gae_with_next_values(
        *(x.to(d) for x in (r, v, nv, term, done)), gamma=g.to(d), lambda_=lam.to(d), targets=targets
    )
    if targets:
        got, tgt = got
        torch.testing.assert_close(tgt.cpu(), got.cpu() + v)
    torch.testing.assert_close(got.cpu(), want, **{"atol": 1e-10, "rtol": 1e-10})


def test_vtrace_with_next_values(path):
    r, v, nv, done, term, lpt, lpb = _next_data(3, 15, "cpu")
    g = discounts((3, 15), "step", "cpu", torch.float64)
    want = _vtrace_loop(r, v, nv, done, term, lpt, lpb, g, 1.2, 0.9)
    d = path.device
    got = vtrace_with_next_values(
        *(x.to(d) for x in (lpt, lpb, v, nv, r, term, done)), gamma=g.to(d), rho_bar=1.2, c_bar=0.9
    )
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a.cpu(), b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("form", ["td1", "tdlambda"])
def test_returns_with_advantages(path, form):
    r, v, nv, done, term, _, _ = _next_data(3, 15, path.device)
    g = discounts((3, 15), "env", path.device, torch.float64)
    lam = discounts((3, 15), "step", path.device, torch.float64) if form == "tdlambda" else 1.0
    extra = {"next_values": nv} if form == "tdlambda" else {}
    got, adv = returns_with_advantages(r, v, term, done, gamma=g, lambda_=lam, bootstrap_values=nv, **extra)
    assert got.device == adv.device == r.device
    cpu = lambda x: x.cpu() if isinstance(x, torch.Tensor) else x  # noqa: E731 - the loop references run on the CPU
    r, nv, term, done, g, lam = map(cpu, (r, nv, term, done, g, lam))
    if form == "tdlambda":
        want = reference.compute_lambda_returns(r, nv, term, done, gamma=g, lambda_=lam, bootstrap_values=nv)
    else:
        want = reference.compute_discounted_returns(r, term, done, gamma=g, bootstrap_values=nv)
    torch.testing.assert_close(got.cpu(), want, atol=1e-10, rtol=1e-10)
    assert torch.equal(adv, got - v)


def test_rows_form(path):
    """A ``rows=`` call (the modules' [..., T, 1] tensors) takes (N, T) discounts and keeps the callers' shape."""
    r, v, nv, done, term, _, _ = _next_data(4, 7, path.device)
    g = discounts((4, 7), "step", path.device, torch.float64)
    shaped = [x.reshape(2, 2, 7, 1) for x in (r, v, nv, term, done)]
    adv, tgt = gae_with_next_values(*shaped, gamma=g, lambda_=0.9, targets=True, rows=(4, 7))
    assert adv.shape == tgt.shape == (2, 2, 7, 1) and adv.device == r.device
    want = gae_with_next_values(r, v, nv, term, done, gamma=g, lambda_=0.9)
    torch.testing.assert_close(adv.reshape(4, 7), want, atol=0, rtol=0)
    lam = torch.full((4, 7), 0.9, dtype=torch.float64)
    loop = _gae_loop(*(x.cpu() for x in (r, v, nv, done, term, g)), lam)
    torch.testing.assert_close(adv.reshape(4, 7).cpu(), loop, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(tgt.reshape(4, 7), adv.reshape(4, 7) + v, atol=1e-12, rtol=1e-12)


# ------------------------------------------------------------------------------------------
# Layouts, autograd, empty calls


@pytest.mark.parametrize("fn", ["compute_gae", "compute_lambda_returns"])
def test_time_major_inputs(path, fn):
    """Per-step inputs as x.T views of [T, N] buffers, with a per-step gamma of the same layout."""
    shape = (5, 12)
    args, kwargs = inputs(fn, shape, path.device)
    tm = lambda x: x.T.contiguous().T if isinstance(x, torch.Tensor) and x.dim() == 2 else x  # noqa: E731
    args, kwargs = [tm(a) for a in args], {k: tm(x) for k, x in kwargs.items()}
    kwargs["gamma"] = discounts(shape, "step-T", path.device)
    check(fn, *args, **kwargs, **F32_TOL)


@pytest.mark.parametrize("fn", ["compute_gae", "compute_vtrace", "compute_lambda_returns"])
def test_gradients(path, fn):
    """Gradients of the differentiable inputs against the reference's; the discounts get none."""
    shape = (2, 6)
    args, kwargs = inputs(fn, shape, path.device, torch.float64)
    at = {"compute_gae": 0, "compute_vtrace": 3, "compute_lambda_returns": 0}[fn]  # rewards
    gamma = discounts(shape, "step", path.device, torch.float64).requires_grad_(True)
    kwargs["gamma"] = gamma
    if fn in HAS_LAMBDA:
        kwargs["lambda_"] = discounts(shape, "env", path.device, torch.float64)
    grads = []
    for impl in (getattr(R, fn), getattr(reference, fn)):
        x = args[at].detach().clone().requires_grad_(True)
        call = list(args)
        call[at] = x
        out = impl(*call, **kwargs)
        out = out[0] if isinstance(out, tuple) else out
        w = torch.linspace(-1, 1, out.numel(), dtype=torch.float64).reshape(out.shape)
        (grad,) = torch.autograd.grad((out.cpu() * w).sum(), x)
        grads.append(grad.cpu())
    torch.testing.assert_close(grads[0], grads[1], atol=1e-10, rtol=1e-10)
    out = getattr(R, fn)(*args, **kwargs)
    assert not (out[0] if isinstance(out, tuple) else out).requires_grad  # nothing else requires grad


@pytest.mark.parametrize("fn", FNS)
def test_empty(path, fn):
    args, kwargs = inputs(fn, (0, 5), path.device)
    kwargs["gamma"] = torch.zeros(0, device=path.device)
    out = getattr(R, fn)(*args, **kwargs)
    assert all(o.shape == (0, 5) for o in (out if isinstance(out, tuple) else (out,)))


# ------------------------------------------------------------------------------------------
# Errors


@pytest.mark.parametrize(
    "bad",
    [(5,), (4, 22), (4, 23, 1), (23,), (1, 23), (2, 2)],
    ids=["N+1", "T-1", "rank3", "T", "1xT", "2x2"],
)
@pytest.mark.parametrize("fn", FNS)
def test_wrong_shape(fn, bad):
    args, kwargs = inputs(fn, (4, 23), "cpu")
    for name in ("gamma", "lambda_") if fn in HAS_LAMBDA else ("gamma",):
        kw = dict(kwargs, **{name: torch.full(bad, 0.5)})
        expected = rf"'{name}' must be .* shape \(4,\) .* shape \(4, 23\), got a tensor of shape {re.escape(str(bad))}"
        with pytest.raises(ValueError, match=expected):
            getattr(R, fn)(*args, **kw)


@pytest.mark.parametrize("fn", FNS)
def test_wrong_shape_one_d(fn):
    args, kwargs = inputs(fn, (9,), "cpu")
    with pytest.raises(ValueError, match=r"'gamma'.*\(9,\).*shape \(8,\)"):
        getattr(R, fn)(*args, **dict(kwargs, gamma=torch.full((8,), 0.5)))


@pytest.mark.parametrize("value", [1.5, -0.25, float("nan")], ids=["above1", "neg", "nan"])
@pytest.mark.parametrize("fn", FNS)
def test_out_of_range_on_cpu(fn, value):
    args, kwargs = inputs(fn, (3, 8), "cpu")
    for name in ("gamma", "lambda_") if fn in HAS_LAMBDA else ("gamma",):
        x = torch.full((3, 8), 0.5)
        x[1, 4] = value
        with pytest.raises(ValueError, match=rf"'{name}' must be in \[0, 1\]"):
            getattr(R, fn)(*args, **dict(kwargs, **{name: x}))


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_non_float_tensor(dtype):
    args, kwargs = inputs("compute_gae", (3, 8), "cpu")
    with pytest.raises(TypeError, match="gamma"):
        R.compute_gae(*args, **dict(kwargs, gamma=torch.ones(3, 8, dtype=dtype)))


def test_wrong_device():
    args, kwargs = inputs("compute_lambda_returns", (3, 8), "cpu")
    with pytest.raises(ValueError, match="'lambda_' is on meta"):
        R.compute_lambda_returns(*args, **dict(kwargs, lambda_=torch.ones(3, device="meta")))


def test_vtrace_has_no_lambda():
    args, kwargs = inputs("compute_vtrace", (3, 8), "cpu")
    with pytest.raises(TypeError, match="lambda_"):
        R.compute_vtrace(*args, **kwargs, lambda_=torch.ones(3))


# ------------------------------------------------------------------------------------------
# torch.compile


def test_compile(path):
    """torch.compile(fullgraph=True) of calls with tensor discounts: the custom op carries them as tensors."""
    args, kwargs = inputs("compute_gae", (3, 11), path.device)
    kwargs.update(gamma=discounts((3, 11), "step", path.device), lambda_=discounts((3, 11), "env", path.device))
    r_args, r_kwargs = inputs("compute_retrace", (3, 11), path.device)
    r_kwargs.update(gamma=discounts((3, 11), "env", path.device), lambda_=discounts((3, 11), "step", path.device))
    values = args[1].clone().requires_grad_(True)

    def f(v, gamma, lam):
        a = R.compute_gae(args[0], v, *args[2:], **dict(kwargs, gamma=gamma, lambda_=lam))
        q, adv = R.compute_retrace(*r_args, **r_kwargs)
        return a, q, adv

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True, backend="aot_eager")(values, kwargs["gamma"], kwargs["lambda_"])
    want = f(values, kwargs["gamma"], kwargs["lambda_"])
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-6, rtol=1e-6)
    (g_got,) = torch.autograd.grad(got[0].sum(), values)
    (g_want,) = torch.autograd.grad(want[0].sum(), values)
    torch.testing.assert_close(g_got, g_want)


def test_kernel_hand_off():
    """What the kernel launchers will get (rl_triton._discounts.kernel_discount of the (N, T) views): a float
    with zero strides, a per-env tensor with time stride 0, a per-step one with its own strides."""
    from rl_triton._discounts import kernel_discount, per_step_view

    assert kernel_discount(0.9) == (None, 0.9, 0, 0)
    env = torch.rand(4)
    view, f, s_n, s_t = kernel_discount(per_step_view("f", "gamma", env, 4, 6, False, env.device))
    assert (view.shape, f, s_n, s_t, view.data_ptr()) == ((4, 6), 0.0, 1, 0, env.data_ptr())
    step = torch.rand(6, 4).T  # a time-major per-step tensor, read in place
    view, _, s_n, s_t = kernel_discount(per_step_view("f", "gamma", step, 4, 6, False, step.device))
    assert (s_n, s_t, view.data_ptr()) == (1, 4, step.data_ptr())
    one_d = torch.rand(6)
    view, _, s_n, s_t = kernel_discount(per_step_view("f", "gamma", one_d, 1, 6, True, one_d.device))
    assert view.shape == (1, 6) and s_t == 1


@pytest.mark.parametrize(
    "fn", ["compute_gae", "compute_vtrace", "compute_discounted_returns", "compute_lambda_returns"]
)
def test_containment(path, fn):
    """Bootstrap values away from boundary steps are not read, with per-step discounts too: NaN there changes
    nothing (docs/semantics.md, Containment)."""
    shape = (3, 16)
    args, kwargs = inputs(fn, shape, path.device)
    _apply(fn, kwargs, shape, path.device, "step", "env")
    boot = kwargs["bootstrap_values"]
    interior = boot == 0
    interior[:, -1] = False
    poisoned = torch.where(interior, torch.full_like(boot, float("nan")), boot)
    want = getattr(R, fn)(*args, **kwargs)
    got = getattr(R, fn)(*args, **dict(kwargs, bootstrap_values=poisoned))
    for g, w in zip(_outs(got), _outs(want), strict=True):
        assert torch.equal(g, w)
