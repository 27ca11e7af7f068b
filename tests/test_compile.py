"""torch.compile(fullgraph=True) of code that calls the public functions: no graph breaks, same
numbers and gradients as eager (the functions become the ``rl_triton::call`` custom op)."""

import pytest
import torch

import rl_triton as R
from rl_triton import _ops


def _data(device, n=3, t=37, a=4):
    g = torch.Generator().manual_seed(11)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    term = (torch.rand(n, t, generator=g) < 0.1).to(device)
    probs = torch.softmax(randn(n, t, a), -1)
    return {
        "r": randn(n, t), "v": randn(n, t), "nv": randn(n, t), "term": term, "boot": randn(n, t),
        "lp": 0.3 * randn(n, t), "probs": probs, "mu": probs[..., 0].clone(),
        "act": torch.zeros(n, t, dtype=torch.int64, device=device), "nq": randn(n, t, a), "seed": randn(n),
    }  # fmt: skip


def everything(x, v):
    out = [R.compute_gae(x["r"], v, x["term"], gamma=0.99, lambda_=0.95)]
    out += R.compute_vtrace(x["lp"], torch.zeros_like(x["lp"]), v, x["r"], x["term"], gamma=0.9, rho_bar=1.5)
    out += R.compute_retrace(x["probs"], x["mu"], v, x["nq"], x["act"], x["r"], x["term"], x["term"], gamma=0.9)
    out.append(R.compute_discounted_returns(x["r"], x["term"], gamma=0.9, bootstrap_values=x["boot"]))
    out.append(R.compute_lambda_returns(x["r"], v, x["term"], gamma=0.9, lambda_=0.7))
    out.append(R.compute_eligibility_traces(v, x["term"], gamma=0.9, lambda_=0.8, seed_values=x["seed"]))
    out.append(R.compute_episodic_prefix_sum(v, x["term"], boundary="starts_at"))
    return out


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_fullgraph_matches_eager(path, backend):
    x = _data(path.device)
    v = x["v"].clone().requires_grad_(True)
    compiled = torch.compile(everything, fullgraph=True, backend=backend)
    torch._dynamo.reset()
    got = compiled(x, v)
    want = everything(x, v)
    assert len(got) == len(want) == 9
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    weights = [torch.randn_like(w) for w in want]
    (g_got,) = torch.autograd.grad(sum((o * w).sum() for o, w in zip(got, weights, strict=True)), v)
    (g_want,) = torch.autograd.grad(sum((o * w).sum() for o, w in zip(want, weights, strict=True)), v)
    torch.testing.assert_close(g_got, g_want, atol=1e-5, rtol=1e-5)


def test_eager_calls_do_not_use_the_op(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("eager calls must not go through the custom op")

    monkeypatch.setattr(_ops, "call", boom)
    R.compute_gae(torch.ones(3), torch.zeros(3), torch.zeros(3), gamma=0.5, lambda_=1.0)


def test_registration_checks_the_slots():
    """A function with more tensor arguments than rl_triton::call has slots fails where it is registered."""
    params = ", ".join(f"t{i}: torch.Tensor" for i in range(_ops._MAX_TENSORS + 1))
    scope = {"torch": torch}
    exec(f"def too_many({params}): pass", scope)
    with pytest.raises(
        TypeError, match=rf"too_many takes {_ops._MAX_TENSORS + 1} tensor slots.*carries {_ops._MAX_TENSORS}"
    ):
        _ops.compilable(like="t0", n_out=1)(scope["too_many"])
    assert "too_many" not in _ops._REGISTRY


def test_opcheck():
    x = _data("cpu", n=2, t=6)
    args = (
        "compute_gae",
        *_ops._pad([x["r"], x["v"].requires_grad_(True), x["term"], None, None, None]),
        *_ops._pad_floats([0.9, 0.8]),
        "",
    )
    torch.library.opcheck(_ops._call, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
