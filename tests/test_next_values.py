"""The private next-value forms used by rl_triton.modules (TorchRL's convention: V(s_{t+1}) given
at every step, ``dones`` cut the recursion, ``terminateds`` zero the bootstrap), against float64
loops written from TorchRL's documented recursions, with next values that differ from
``values[t+1]`` so that reading the wrong one fails."""

import pytest
import torch

import rl_triton as R
from rl_triton.functional import gae_with_next_values, returns_with_advantages, vtrace_with_next_values


def _data(n, t, device):
    g = torch.Generator().manual_seed(n * 1000 + t)
    r, v, nv = (torch.randn(n, t, dtype=torch.float64, generator=g) for _ in range(3))
    done = torch.rand(n, t, generator=g) < 0.2
    term = done & (torch.rand(n, t, generator=g) < 0.5)
    lpt, lpb = (0.5 * torch.randn(n, t, dtype=torch.float64, generator=g) for _ in range(2))
    return [x.to(device) for x in (r, v, nv, done, term, lpt, lpb)]


def _gae_loop(r, v, nv, done, term, gamma, lam):
    done, term = done.double(), term.double()
    out = torch.zeros_like(r)
    acc = torch.zeros(r.shape[0], dtype=r.dtype)
    for t in reversed(range(r.shape[1])):
        delta = r[:, t] + gamma * (1 - term[:, t]) * nv[:, t] - v[:, t]
        acc = delta + gamma * lam * (1 - done[:, t]) * acc
        out[:, t] = acc
    return out


def _vtrace_loop(r, v, nv, done, term, lpt, lpb, gamma, rho_bar, c_bar):
    done_f, term = done.double(), term.double()
    ratio = torch.exp(lpt - lpb)
    rho, c = ratio.clamp(max=rho_bar), ratio.clamp(max=c_bar)
    n, t_len = r.shape
    d = torch.zeros_like(r)
    acc = torch.zeros(n, dtype=r.dtype)
    for t in reversed(range(t_len)):
        delta = rho[:, t] * (r[:, t] + gamma * (1 - term[:, t]) * nv[:, t] - v[:, t])
        acc = delta + gamma * c[:, t] * (1 - done_f[:, t]) * acc
        d[:, t] = acc
    vs = v + d
    adv = torch.zeros_like(r)
    for t in range(t_len):
        last = t == t_len - 1
        nxt = torch.where(done[:, t] | last, nv[:, t], vs[:, t + 1] if not last else nv[:, t])
        adv[:, t] = rho[:, t] * (r[:, t] + gamma * (1 - term[:, t]) * nxt - v[:, t])
    return vs, adv


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 300)], ids=lambda s: f"N{s[0]}-T{s[1]}")
def test_gae_with_next_values(path, shape):
    r, v, nv, done, term, _, _ = _data(*shape, path.device)
    got = gae_with_next_values(r, v, nv, term, done, gamma=0.97, lambda_=0.9)
    want = _gae_loop(*(x.cpu() for x in (r, v, nv, done, term)), 0.97, 0.9)
    torch.testing.assert_close(got.cpu(), want, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 300)], ids=lambda s: f"N{s[0]}-T{s[1]}")
def test_vtrace_with_next_values(path, shape):
    r, v, nv, done, term, lpt, lpb = _data(*shape, path.device)
    vs, adv = vtrace_with_next_values(lpt, lpb, v, nv, r, term, done, gamma=0.97, rho_bar=1.2, c_bar=0.9)
    want_vs, want_adv = _vtrace_loop(*(x.cpu() for x in (r, v, nv, done, term, lpt, lpb)), 0.97, 1.2, 0.9)
    torch.testing.assert_close(vs.cpu(), want_vs, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(adv.cpu(), want_adv, atol=1e-10, rtol=1e-10)


def _typed_data(shape, dtype, device):
    """``_data`` as ``(N, T)`` or, for a 1-D ``shape``, one row of ``(T,)``; floats in ``dtype``."""
    n, t = (1, shape[0]) if len(shape) == 1 else shape
    r, v, nv, done, term, _, _ = (x.reshape(shape) for x in _data(n, t, device))
    return (n, t), *(x.to(dtype) for x in (r, v, nv)), done, term


def _assert_rounded_once(path, got, want):
    """``got`` (the kernel's second output) equals ``want`` (the separate op) bit for bit; under
    Triton's interpreter, which casts float32 to bfloat16 toward zero (compiled kernels round to
    nearest even), to one bfloat16 ulp."""
    if path.name == "interpret" and got.dtype == torch.bfloat16:
        torch.testing.assert_close(got, want, atol=0, rtol=2**-7)
    else:
        assert torch.equal(got, want)


def _assert_same_gradients(path, fused, separate):
    """``fused(r, v, nv)`` and ``separate(r, v, nv)`` (two outputs each) give the same gradients."""
    r, v, nv, _, _, _, _ = _data(3, 40, path.device)
    cotangents = list(torch.randn(2, 3, 40, dtype=torch.float64).to(path.device))
    grads = []
    for fn in (fused, separate):
        leaves = [x.clone().requires_grad_(True) for x in (r, v, nv)]
        grads.append(torch.autograd.grad(list(fn(*leaves)), leaves, cotangents))
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 300), (300,)], ids=lambda s: "x".join(map(str, s)))
def test_gae_targets_are_advantages_plus_values(path, dtype, shape):
    """``targets=True`` (the GAE modules' value targets from the same launch) gives the advantages of
    the plain call and ``A + values`` bit for bit, rounded once to the inputs' dtype."""
    (n, t), r, v, nv, done, term = _typed_data(shape, dtype, path.device)
    adv, tgt = gae_with_next_values(r, v, nv, term, done, gamma=0.97, lambda_=0.9, targets=True)
    plain = gae_with_next_values(r, v, nv, term, done, gamma=0.97, lambda_=0.9)
    assert adv.shape == tgt.shape == r.shape and adv.dtype == tgt.dtype == dtype
    assert torch.equal(adv, plain)
    _assert_rounded_once(path, tgt, adv + v)
    rows = [x.cpu().reshape(n, t) for x in (r, v, nv, done, term)]
    want = _gae_loop(*(x.double() for x in rows[:3]), *rows[3:], 0.97, 0.9) + rows[1].double()
    tol = {torch.float64: 1e-10, torch.float32: 1e-5}.get(dtype, 5e-2)
    torch.testing.assert_close(tgt.cpu().double().reshape(n, t), want, atol=tol, rtol=tol)


def test_gae_targets_gradients(path):
    """Gradients through both outputs of ``targets=True`` equal those of the plain call plus ``values``."""
    _, _, _, done, term, _, _ = _data(3, 40, path.device)
    kw = dict(gamma=0.97, lambda_=0.9)

    def separate(r, v, nv):
        adv = gae_with_next_values(r, v, nv, term, done, **kw)
        return adv, adv + v

    _assert_same_gradients(
        path, lambda r, v, nv: gae_with_next_values(r, v, nv, term, done, targets=True, **kw), separate
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 300), (300,)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("form", ["lambda", "discounted"])
def test_returns_with_advantages(path, dtype, shape, form):
    """The TD(1) / TD(lambda) modules' ``(G, G - values)`` from one launch: ``G`` is the public
    function's result bit for bit, the advantages are ``G - values`` rounded once."""
    _, r, v, nv, done, term = _typed_data(shape, dtype, path.device)
    if form == "lambda":
        g, adv = returns_with_advantages(r, v, term, done, gamma=0.97, lambda_=0.8, next_values=nv, bootstrap_values=nv)
        want = R.compute_lambda_returns(r, nv, term, done, gamma=0.97, lambda_=0.8, bootstrap_values=nv)
    else:
        g, adv = returns_with_advantages(r, v, term, done, gamma=0.97, lambda_=1.0, bootstrap_values=nv)
        want = R.compute_discounted_returns(r, term, done, gamma=0.97, bootstrap_values=nv)
    assert g.shape == adv.shape == r.shape and g.dtype == adv.dtype == dtype
    assert torch.equal(g, want)
    _assert_rounded_once(path, adv, g - v)


def test_returns_with_advantages_gradients(path):
    """Gradients through both outputs equal those of compute_lambda_returns and ``G - values``."""
    _, _, _, done, term, _, _ = _data(3, 40, path.device)
    kw = dict(gamma=0.97, lambda_=0.8)

    def fused(r, v, nv):
        return returns_with_advantages(r, v, term, done, next_values=nv, bootstrap_values=nv, **kw)

    def separate(r, v, nv):
        g = R.compute_lambda_returns(r, nv, term, done, bootstrap_values=nv, **kw)
        return g, g - v

    _assert_same_gradients(path, fused, separate)


def _fused(form, r, v, nv, term, done, **kw):
    """The modules' one-launch call: GAE with its value targets, or TD(lambda) returns with advantages."""
    if form == "gae":
        return gae_with_next_values(r, v, nv, term, done, gamma=0.97, lambda_=0.8, targets=True, **kw)
    return returns_with_advantages(r, v, term, done, gamma=0.97, lambda_=0.8, next_values=nv, bootstrap_values=nv, **kw)


@pytest.mark.parametrize("form", ["gae", "lambda"])
@pytest.mark.parametrize("layout", [(4, 30, 1), (2, 2, 30), (2, 2, 30, 1)], ids=lambda s: "x".join(map(str, s)))
def test_rows_keeps_the_callers_shape(path, form, layout):
    """``rows=(N, T)`` (the modules' form): inputs of one shape whose ``reshape(rows)`` is their
    ``(N, T)`` form give the 2-D call's numbers in that shape, first call and cache hits alike, with
    or without autograd; non-contiguous inputs (not cached) give them as ``(N, T)``."""
    rows = (4, 30)
    r, v, nv, done, term, _, _ = _data(*rows, path.device)
    want = _fused(form, r, v, nv, term, done)
    flags = [x.reshape(layout) for x in (term, done)]
    shaped = [x.reshape(layout) for x in (r, v, nv)]
    for _ in range(2):  # the first call fills the validation cache, the second hits it
        for g, w in zip(_fused(form, *shaped, *flags, rows=rows), want, strict=True):
            assert g.shape == layout and torch.equal(g.reshape(rows), w)
    strided = [torch.stack([x, x], -1)[..., 0] for x in shaped]  # non-contiguous: copied, not cached
    for g, w in zip(_fused(form, *strided, *flags, rows=rows), want, strict=True):
        assert g.shape == rows and torch.equal(g, w)
    grads = []
    for inputs, fl, kw in ((shaped, flags, {"rows": rows}), ((r, v, nv), (term, done), {})):
        leaves = [x.clone().requires_grad_(True) for x in inputs]
        outs = _fused(form, *leaves, *fl, **kw)
        grads.append([g.reshape(rows) for g in torch.autograd.grad([o.sum() for o in outs], leaves)])
    for g, w in zip(*grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-12, rtol=1e-12)


def test_rows_takes_per_step_tensors_only():
    from rl_triton import _validation

    x = torch.zeros(2, 3, 1)
    with pytest.raises(ValueError, match="per-step tensors and flags only"):
        _validation.prepare(
            "t", steps={"rewards": x}, flags={"terminateds": x}, per_env={"last_value": torch.zeros(2)}, rows=(2, 3)
        )


def test_rows_data_checks(path, monkeypatch):
    """The opt-in data checks read a ``rows=`` call's tensors in their ``(N, T)`` form: bootstrap
    values set at the last step only are not reported, whatever the callers' layout."""
    import warnings

    from rl_triton import _config

    monkeypatch.setattr(_config, "CORRECTNESS_WARNINGS", True)
    r, v, nv, done, term, _, _ = _data(4, 30, path.device)
    nv = torch.zeros_like(nv)
    nv[:, -1] = 1.0
    done = term = torch.zeros_like(done)
    shaped = [x.reshape(2, 2, 30) for x in (r, v, nv, term, done)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        _fused("lambda", *shaped, rows=(4, 30))
    nv[:, 3] = 1.0  # read nowhere: reported
    # recorded by hand, not with pytest.warns: that re-emits every other warning it caught as the test's own, which
    # the pyproject filter of the interpreter's numpy DeprecationWarning (attributed to triton) then misses
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _fused("lambda", *shaped, rows=(4, 30))
    want = "nonzero at steps that are neither truncated nor the last step"
    assert any(issubclass(w.category, UserWarning) and want in str(w.message) for w in caught)
