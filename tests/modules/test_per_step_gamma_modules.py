"""TorchRL estimators with tensor ``gamma`` / ``lmbda`` (per-step ``[*B, T, 1]``, per-env ``[*B, 1, 1]``,
other broadcastable shapes) and with ``steps_to_next_obs`` (``gamma ** steps``, a per-step discount): the
numbers are TorchRL 0.14's, and they come from rl_triton (not from a fallback to TorchRL's functional)."""

import pytest
import torch
from torchrl.objectives import value as trl
from torchrl.objectives.value import functional as trl_fn

from rl_triton.modules import GAE, TD0Estimator, TD1Estimator, TDLambdaEstimator, VTrace
from tests.modules._rollouts import assert_td_close, assert_tensor_close, rollout, run_pair

# TorchRL's estimators warn when handed a tensor gamma (torch.tensor(tensor)); not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")

BATCH = (3, 13)  # [B, T]: entries [B, T, 1]


def _unit(shape, device, zeros=True) -> torch.Tensor:
    """Values in [0.4, 1] with a few exact 0s and 1s."""
    x = 0.4 + 0.6 * torch.rand(shape)
    if zeros:
        x = torch.where(torch.rand(shape) < 0.1, torch.zeros(shape), x)
    x = torch.where(torch.rand(shape) < 0.1, torch.ones(shape), x)
    return x.to(device)


SHAPES = {"step": (3, 13, 1), "env": (3, 1, 1), "time": (13, 1)}


def _discount(form, device):
    return _unit(SHAPES[form], device)


def _pairs(gamma_forms):
    """(gamma form, lmbda form) pairs with at least one tensor (None: a float)."""
    return [(g, lam) for g in gamma_forms for lam in (None, "step", "env") if g or lam]


@pytest.mark.parametrize("gamma_form,lmbda_form", _pairs((None, "step", "env")))  # TorchRL's GAE fails on [T, 1]
@pytest.mark.parametrize("vectorized", [True, False], ids=["vec", "loop"])
def test_gae(path, gamma_form, lmbda_form, vectorized, rl_triton_calls):
    gamma = 0.95 if gamma_form is None else _discount(gamma_form, path.device)
    lmbda = 0.9 if lmbda_form is None else _discount(lmbda_form, path.device)
    td = rollout(BATCH, device=path.device, values=True)
    ours, ref, *_ = run_pair(GAE, trl.GAE, td, gamma=gamma, lmbda=lmbda, value_network=None, vectorized=vectorized)
    assert_td_close(ours, ref)
    assert rl_triton_calls["gae_with_next_values"] == 1


def _td_lambda_ref(td, gamma, lmbda):
    """TorchRL's non-vectorized TD(lambda) (its vectorized form needs a scalar lambda and a full-shape gamma)."""
    nxt = td["next"]
    return trl_fn.td_lambda_return_estimate(
        gamma, lmbda, nxt["state_value"], nxt["reward"], nxt["done"], nxt["terminated"]
    )


@pytest.mark.parametrize("gamma_form,lmbda_form", _pairs((None, "step", "env", "time")))
def test_td_lambda(path, gamma_form, lmbda_form, rl_triton_calls):
    gamma = 0.95 if gamma_form is None else _discount(gamma_form, path.device)
    lmbda = 0.9 if lmbda_form is None else _discount(lmbda_form, path.device)
    td = rollout(BATCH, device=path.device, values=True)
    ours = TDLambdaEstimator(gamma=gamma, lmbda=lmbda, value_network=None)(td.clone())
    assert rl_triton_calls["compute_lambda_returns"] == 1
    want = _td_lambda_ref(td, gamma, lmbda)
    assert_tensor_close(ours["value_target"], want)
    assert_tensor_close(ours["advantage"], want - td["state_value"])
    if gamma_form == "step" and lmbda_form is None:  # TorchRL's own estimator (vectorized) takes this one
        _, ref, *_ = run_pair(
            TDLambdaEstimator, trl.TDLambdaEstimator, td, gamma=gamma, lmbda=lmbda, value_network=None
        )
        assert_td_close(ours, ref)


@pytest.mark.parametrize("gamma_form", ["step", "env", "time"])
@pytest.mark.parametrize("name", ["TD0", "TD1"])
def test_td0_td1(path, name, gamma_form, rl_triton_calls):
    gamma = _discount(gamma_form, path.device)
    td = rollout(BATCH, device=path.device, values=True)
    cls, ref_cls = {"TD0": (TD0Estimator, trl.TD0Estimator), "TD1": (TD1Estimator, trl.TD1Estimator)}[name]
    ours = cls(gamma=gamma, value_network=None)(td.clone())
    assert sum(rl_triton_calls.values()) == 1
    nxt = td["next"]
    if name == "TD0":
        want = nxt["reward"] + gamma * (~nxt["terminated"]) * nxt["state_value"]
    else:
        want = trl_fn.td1_return_estimate(gamma, nxt["state_value"], nxt["reward"], nxt["done"], nxt["terminated"])
    assert_tensor_close(ours["value_target"], want)
    if gamma_form == "step" or name == "TD0":  # TorchRL's vectorized TD(1) needs a full-shape gamma
        _, ref, *_ = run_pair(cls, ref_cls, td, gamma=gamma, value_network=None)
        assert_td_close(ours, ref)


@pytest.mark.parametrize("name", ["GAE", "TD0", "TD1", "TDLambda", "VTrace"])
def test_steps_to_next_obs(path, name, rl_triton_calls):
    """gamma ** steps_to_next_obs is a per-step discount: rl_triton computes it, with TorchRL's numbers."""
    td = rollout(BATCH, device=path.device, values=True)
    td.set("steps_to_next_obs", torch.randint(1, 4, (*BATCH, 1), device=path.device))
    if name == "VTrace":
        td.set("action_log_prob", 0.3 * torch.randn(*BATCH, 1, device=path.device))
        td.set("action", torch.randn(*BATCH, 1, device=path.device))
        kwargs = {"gamma": 0.9, "value_network": None, "actor_network": _actor(path.device)}
        ours_td, ref_td = td.clone(), td.clone()
        VTrace(**kwargs)(ours_td)
        assert rl_triton_calls["vtrace_with_next_values"] == 1
        # TorchRL's VTrace scores a sampled action (see VTrace's docstring): compare with its functional
        nxt = ref_td["next"]
        log_pi = _actor(path.device).get_dist(ref_td).log_prob(ref_td["action"])
        adv, vs = trl_fn.vtrace_advantage_estimate(
            0.9 ** ref_td["steps_to_next_obs"], log_pi, ref_td["action_log_prob"], ref_td["state_value"],
            nxt["state_value"], nxt["reward"], nxt["done"], nxt["terminated"],
        )  # fmt: skip
        assert_tensor_close(ours_td["value_target"], vs)
        assert_tensor_close(ours_td["advantage"], adv)
        return
    cls, ref_cls, kw = {
        "GAE": (GAE, trl.GAE, {"lmbda": 0.9}),
        "TD0": (TD0Estimator, trl.TD0Estimator, {}),
        "TD1": (TD1Estimator, trl.TD1Estimator, {}),
        "TDLambda": (TDLambdaEstimator, trl.TDLambdaEstimator, {"lmbda": 0.9}),
    }[name]
    ours, ref, *_ = run_pair(cls, ref_cls, td, gamma=0.9, value_network=None, **kw)
    assert_td_close(ours, ref)
    assert sum(rl_triton_calls.values()) == 1


def _actor(device):
    """A fixed Gaussian policy over a 1-D action from the observation, its log-prob of the stored action."""
    from tensordict.nn import NormalParamExtractor, ProbabilisticTensorDictModule, TensorDictModule
    from tensordict.nn import ProbabilisticTensorDictSequential as Seq
    from torch import nn
    from torch.distributions import Normal

    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(3, 2), NormalParamExtractor()).to(device)
    body = TensorDictModule(net, in_keys=["obs"], out_keys=["loc", "scale"])
    head = ProbabilisticTensorDictModule(in_keys=["loc", "scale"], out_keys=["action"], distribution_class=Normal)
    return Seq(body, head)


@pytest.mark.parametrize("name", ["GAE", "TDLambda"])
def test_fallbacks(path, name, rl_triton_calls):
    """What rl_triton does not take stays TorchRL's: a gamma that requires grad (TorchRL differentiates it),
    one of a wider dtype than the entries, a CPU gamma with values outside [0, 1], one that does not broadcast
    to the entries."""
    cls, ref_cls = {"GAE": (GAE, trl.GAE), "TDLambda": (TDLambdaEstimator, trl.TDLambdaEstimator)}[name]
    td = rollout(BATCH, device=path.device, values=True)
    kw = {"vectorized": False} if name == "TDLambda" else {}
    if name == "GAE":  # TorchRL's TD estimators copy a tensor gamma (torch.tensor(gamma)): no grad left
        # GAE keeps gamma.to(default device): on CUDA a CPU buffer that TorchRL moves back under no_grad
        grad = _unit((3, 13, 1), path.device).requires_grad_(True)
        ours, ref, *_ = run_pair(cls, ref_cls, td, gamma=grad, lmbda=0.9, value_network=None, **kw)
        assert_td_close(ours, ref)
        steps = td.clone()  # gamma ** steps_to_next_obs of a gamma that requires grad
        steps.set("steps_to_next_obs", torch.randint(1, 4, (*BATCH, 1), device=path.device))
        ours, ref, *_ = run_pair(cls, ref_cls, steps, gamma=grad, lmbda=0.9, value_network=None, **kw)
        assert_td_close(ours, ref)
    wide = _unit((3, 13, 1), path.device).double()  # TorchRL's dtype rules decide the outputs' dtype
    ours, ref, *_ = run_pair(cls, ref_cls, td, gamma=wide, lmbda=0.9, value_network=None, **kw)
    assert_td_close(ours, ref)
    if path.device.type == "cpu":  # not checked on a GPU (a host sync): rl_triton computes it
        above = _unit((3, 13, 1), path.device) * 1.5
        ours, ref, *_ = run_pair(cls, ref_cls, td, gamma=above, lmbda=0.9, value_network=None, **kw)
        assert_td_close(ours, ref)
    assert sum(rl_triton_calls.values()) == 0
    with pytest.raises(RuntimeError):  # TorchRL's own error for a gamma that does not broadcast
        cls(gamma=torch.full((4, 13, 1), 0.9, device=path.device), lmbda=0.9, value_network=None)(td.clone())


def test_gradients_through_values(path):
    """Per-step gamma with a differentiable rollout: the gradients are TorchRL's."""
    td = rollout(BATCH, device=path.device, values=True)
    gamma = _discount("step", path.device)
    outs = []
    for cls in (GAE, trl.GAE):
        d = td.clone()
        v = d["state_value"].detach().clone().requires_grad_(True)
        d["state_value"] = v
        cls(gamma=gamma, lmbda=0.9, value_network=None, differentiable=True)(d)
        (g,) = torch.autograd.grad((d["value_target"] * torch.arange(13.0, device=path.device)[:, None]).sum(), v)
        outs.append(g)
    assert_tensor_close(outs[0], outs[1])


@pytest.mark.parametrize("forms", [("step", "env"), ("env", "step"), ("time", None)], ids=str)
def test_retrace(path, forms, rl_triton_calls):
    """rl_triton's Retrace estimator with tensor gamma/lmbda, against the float64 loop reference."""
    from rl_triton.modules import Retrace
    from tests import reference
    from tests.modules.test_retrace_module import retrace_rollout

    td = retrace_rollout(BATCH, device=path.device)
    gamma = _discount(forms[0], path.device)
    lmbda = 1.0 if forms[1] is None else _discount(forms[1], path.device)
    out = Retrace(gamma=gamma, lmbda=lmbda)(td.clone())
    assert rl_triton_calls["compute_retrace"] == 1
    nxt = td["next"]
    term, done = nxt["terminated"].squeeze(-1), nxt["done"].squeeze(-1)
    trunc = (done | nxt.get("truncated", torch.zeros_like(nxt["done"])).squeeze(-1)) & ~term
    act = td["action"]
    q = td["action_value"].gather(-1, act.unsqueeze(-1)).squeeze(-1)
    full = (3, 13, 1)
    qt, adv = reference.compute_retrace(
        td["target_probs"], td["action_log_prob"].exp(), q, nxt["action_value"], act, nxt["reward"].squeeze(-1),
        term, trunc, gamma=gamma.expand(full).squeeze(-1),
        lambda_=lmbda if forms[1] is None else lmbda.expand(full).squeeze(-1),
    )  # fmt: skip
    assert_tensor_close(out["value_target"], qt.unsqueeze(-1).to(torch.float32).to(path.device))
    assert_tensor_close(out["advantage"], adv.unsqueeze(-1).to(torch.float32).to(path.device))


def test_retrace_errors(path):
    from rl_triton.modules import Retrace
    from tests.modules.test_retrace_module import retrace_rollout

    with pytest.raises(ValueError, match=r"^Retrace: 'gamma' must be in \[0, 1\], got values in \[1.5, 1.5\]"):
        Retrace(gamma=torch.full((3, 13, 1), 1.5))
    with pytest.raises(ValueError, match=r"^Retrace: 'lmbda' must be in \[0, 1\], got -0.5"):
        Retrace(gamma=0.9, lmbda=-0.5)
    with pytest.raises(ValueError, match="c_bar must be a scalar"):
        Retrace(gamma=0.9, c_bar=torch.ones(3))
    with pytest.raises(ValueError, match="does not broadcast"):
        Retrace(gamma=torch.full((4, 13, 1), 0.9, device=path.device))(retrace_rollout(BATCH, device=path.device))
