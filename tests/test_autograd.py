"""Autograd: gradcheck in float64 on every path, gradients equal to autograd through the float64
reference, and no gradient into probabilities / log-probabilities (they are constants)."""

import pytest
import torch

import rl_triton
from tests import reference
from tests._helpers import CONSTANTS, DIFFERENTIABLE, FUNCTIONS, valid_kwargs

CASES = [pytest.param(fn, False, id=fn.removeprefix("compute_")) for fn in FUNCTIONS] + [
    pytest.param("compute_gae", True, id="gae-last_value"),
    pytest.param("compute_vtrace", True, id="vtrace-last_value"),
]
SHAPES = [pytest.param((2, 6), id="N2-T6"), pytest.param((7,), id="T7-1d")]


def make_kwargs(fn, shape, *, last_value, device, dtype=torch.float64):
    """A valid call with at least one termination, one truncation (where the function has them)
    and one done, so gradients are checked across episode boundaries."""
    kwargs = valid_kwargs(fn, shape, device=device, dtype=dtype, p=0.15, last_value=last_value)
    first = (0, 2) if len(shape) == 2 else (2,)
    second = (1, 3) if len(shape) == 2 else (4,)
    if "dones" in kwargs:
        kwargs["dones"] = kwargs["dones"].clone()
        kwargs["dones"][first] = True
    else:
        kwargs["terminateds"] = kwargs["terminateds"].clone()
        kwargs["terminateds"][first] = True
        if "truncateds" in kwargs:
            kwargs["truncateds"] = kwargs["truncateds"].clone()
            kwargs["truncateds"][second] = True
            kwargs["terminateds"][second] = False
            if "bootstrap_values" in kwargs:
                kwargs["bootstrap_values"] = kwargs["bootstrap_values"].clone()
                kwargs["bootstrap_values"][second] = 0.75
    return kwargs


def split(fn, kwargs):
    """(names of the differentiable inputs present, the call as a function of those inputs)."""
    names = [n for n in DIFFERENTIABLE[fn] if kwargs.get(n) is not None]

    def f(*xs, impl=rl_triton):
        return getattr(impl, fn)(**{**kwargs, **dict(zip(names, xs, strict=True))})

    return names, f


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("fn, last_value", CASES)
def test_gradcheck(path, fn, last_value, shape):
    """Analytical against finite-difference gradients, in float64. A full gradcheck takes two calls per
    input element; under Triton's interpreter, where each kernel launch costs tens of milliseconds, the
    fast mode checks the same backward kernels (v^T J u for random u and v, against finite differences
    along u: a few calls per input), and test_gradients_match_reference compares their vector-Jacobian
    product for random cotangents with the reference's. The other paths check every Jacobian entry."""
    kwargs = make_kwargs(fn, shape, last_value=last_value, device=path.device)
    names, f = split(fn, kwargs)
    inputs = [kwargs[n].detach().clone().requires_grad_() for n in names]
    fast = path.name == "interpret"
    assert torch.autograd.gradcheck(f, inputs, eps=1e-6, atol=1e-7, rtol=1e-5, fast_mode=fast)


@pytest.mark.parametrize(
    "dtype, shape, tol",
    [
        pytest.param(torch.float64, (3, 9), 1e-10, id="f64-N3-T9"),
        pytest.param(torch.float32, (3, 40), 1e-5, id="f32-N3-T40"),
    ],
)
@pytest.mark.parametrize("fn, last_value", CASES)
def test_gradients_match_reference(path, fn, last_value, dtype, shape, tol):
    kwargs = make_kwargs(fn, shape, last_value=last_value, device=path.device, dtype=dtype)
    names, f = split(fn, kwargs)
    inputs = [kwargs[n].detach().clone().requires_grad_() for n in names]
    ref_inputs = [x.detach().clone().requires_grad_() for x in inputs]

    out = f(*inputs)
    ref = f(*ref_inputs, impl=reference)
    out = out if isinstance(out, tuple) else (out,)
    ref = ref if isinstance(ref, tuple) else (ref,)
    weights = [torch.randn(o.shape, dtype=torch.float64) for o in ref]
    loss = sum((o.double().cpu() * w).sum() for o, w in zip(out, weights, strict=True))
    ref_loss = sum((r * w).sum() for r, w in zip(ref, weights, strict=True))
    grads = torch.autograd.grad(loss, inputs)
    ref_grads = torch.autograd.grad(ref_loss, ref_inputs)
    for name, g, r in zip(names, grads, ref_grads, strict=True):
        assert g.shape == r.shape and g.dtype == dtype and g.device.type == path.device.type, name
        scale = max(1.0, r.abs().max().item())
        torch.testing.assert_close(g.double().cpu(), r.double().cpu(), atol=tol * scale, rtol=tol, msg=name)


@pytest.mark.parametrize("fn", sorted(CONSTANTS))
def test_no_gradient_into_probabilities(path, fn):
    kwargs = make_kwargs(fn, (2, 6), last_value=False, device=path.device)
    consts = [n for n in CONSTANTS[fn] if kwargs.get(n) is not None]
    diff = [n for n in DIFFERENTIABLE[fn] if kwargs.get(n) is not None]
    for n in consts + diff:
        kwargs[n] = kwargs[n].detach().clone().requires_grad_()
    outs = getattr(rl_triton, fn)(**kwargs)
    loss = sum(o.sum() for o in outs)
    grads = torch.autograd.grad(loss, [kwargs[n] for n in consts + diff], allow_unused=True)
    for n, g in zip(consts, grads, strict=False):
        assert g is None or not g.any(), f"gradient flowed into {n}"
    for n, g in zip(diff, grads[len(consts) :], strict=True):
        assert g is not None, f"no gradient for {n}"


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_no_grad_inputs_give_plain_outputs(path, fn):
    outs = getattr(rl_triton, fn)(**valid_kwargs(fn, (2, 6), device=path.device))
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert all(not o.requires_grad for o in outs)


@pytest.mark.parametrize("fn", ["compute_gae", "compute_discounted_returns", "compute_episodic_prefix_sum"])
def test_gradient_through_non_contiguous_input(path, fn):
    kwargs = make_kwargs(fn, (3, 8), last_value=False, device=path.device)
    first = DIFFERENTIABLE[fn][0]
    buf = torch.zeros(8, 3, dtype=torch.float64, device=path.device)
    buf.copy_(kwargs[first].t())
    buf.requires_grad_()
    kwargs[first] = buf.t()  # non-contiguous view of a leaf
    out = getattr(rl_triton, fn)(**kwargs)
    w = torch.randn(out.shape, dtype=torch.float64, device=path.device)
    (grad,) = torch.autograd.grad((out * w).sum(), buf)
    cpu_kwargs = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    ref_in = buf.detach().cpu().clone().requires_grad_()
    ref = getattr(reference, fn)(**{**cpu_kwargs, first: ref_in.t()})
    (ref_grad,) = torch.autograd.grad((ref * w.cpu()).sum(), ref_in)
    torch.testing.assert_close(grad.cpu(), ref_grad, atol=1e-10, rtol=1e-10)
