"""rl_triton.modules.TD0Estimator / TD1Estimator / TDLambdaEstimator against TorchRL 0.14's classes.

Same style as test_gae_module.py: identical arguments, cloned rollouts, every output entry compared.
"""

import inspect

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives import value as trl

from rl_triton.modules import TD0Estimator, TD1Estimator, TDLambdaEstimator
from tests.modules._rollouts import (
    LAYOUTS,
    assert_grads_close,
    assert_td_close,
    assert_tensor_close,
    critic,
    grads,
    recurrent_critic,
    rollout,
    run_pair,
    time_axis,
)

# TorchRL's TD estimators warn when handed a tensor gamma (torch.tensor(tensor)); not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")

GAMMA = 0.95
ESTIMATORS = {
    "TD0": (TD0Estimator, trl.TD0Estimator, {}),
    "TD1": (TD1Estimator, trl.TD1Estimator, {}),
    "TDLambda": (TDLambdaEstimator, trl.TDLambdaEstimator, {"lmbda": 0.9}),
}
WITH_TIME_DIM = ("TD1", "TDLambda")  # TorchRL's TD0Estimator has no time_dim (it is elementwise)


def _build_kwargs(name, **kwargs):
    return {"gamma": GAMMA, **ESTIMATORS[name][2], **kwargs}


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_is_a_drop_in_subclass(name):
    cls, ref_cls, _ = ESTIMATORS[name]
    assert issubclass(cls, ref_cls)
    ours = inspect.signature(cls.__init__).parameters
    for arg, p in inspect.signature(ref_cls.__init__).parameters.items():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        assert arg in ours or any(q.kind == q.VAR_KEYWORD for q in ours.values()), f"missing argument {arg}"
        if arg in ours:
            assert ours[arg].default == p.default, f"default of {arg}"


@pytest.mark.parametrize("source", ["net", "values"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_parity_layouts(path, name, layout, source, rl_triton_calls):
    cls, ref_cls, _ = ESTIMATORS[name]
    bs, time_dim, names = LAYOUTS[layout]
    td = rollout(
        bs, time_axis_=time_axis(bs, time_dim, names), names=names, device=path.device, values=source == "values"
    )
    net = critic(path.device) if source == "net" else None
    extra = {"time_dim": time_dim} if name in WITH_TIME_DIM else {}
    ours, ref, *_ = run_pair(cls, ref_cls, td, value_network=net, **_build_kwargs(name, **extra))
    assert_td_close(ours, ref)
    assert sum(rl_triton_calls.values()) > 0, "no rl_triton function ran"


@pytest.mark.parametrize("pattern", ["none", "last", "trunc", "random"])
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_done_patterns(path, name, pattern):
    cls, ref_cls, _ = ESTIMATORS[name]
    td = rollout((4, 23), device=path.device, pattern=pattern, p_term=0.2, p_trunc=0.2)
    ours, ref, *_ = run_pair(cls, ref_cls, td, value_network=critic(path.device), **_build_kwargs(name))
    assert_td_close(ours, ref)


# (id, constructor kwargs, rollout options, sources, estimators)
ALL = tuple(ESTIMATORS)
OPTIONS = [
    ("gamma.99", {"gamma": 0.99}, {}, ("values",), ALL),
    ("gamma1", {"gamma": 1.0}, {}, ("values",), ALL),
    ("lmbda.3", {"lmbda": 0.3}, {}, ("values",), ("TDLambda",)),
    ("lmbda1", {"lmbda": 1.0}, {}, ("values",), ("TDLambda",)),
    ("tensor-hparams", {"gamma": torch.tensor(0.9)}, {}, ("values",), ALL),
    ("average_rewards", {"average_rewards": True}, {}, ("net", "values"), ALL),
    ("average_rewards-group", {"average_rewards": True, "group_key": "task"}, {"task": True}, ("values",), ALL),
    ("vectorized-False", {"vectorized": False}, {}, ("values",), ("TDLambda",)),
    ("differentiable", {"differentiable": True}, {}, ("net",), ALL),
    ("steps_to_next_obs", {}, {"steps_to_next_obs": True}, ("values",), ALL),
    ("value_chunk_size", {"value_chunk_size": 2}, {}, ("net",), ALL),
    ("deactivate_vmap", {"deactivate_vmap": True}, {}, ("net",), ALL),
    ("shifted", {"shifted": True}, {}, ("net",), ALL),
    ("shifted-trunc-heavy", {"shifted": True}, {"pattern": "trunc"}, ("net",), ALL),
    ("shifted-budget3", {"shifted": True, "shifted_budget": 3}, {"pattern": "trunc"}, ("net",), ALL),
]
OPTION_CASES = [
    pytest.param(est, kw, rkw, src, id=f"{est}-{name}-{src}")
    for name, kw, rkw, srcs, ests in OPTIONS
    for est in ests
    for src in srcs
]


@pytest.mark.parametrize("name, kwargs, rollout_kwargs, source", OPTION_CASES)
def test_options(path, name, kwargs, rollout_kwargs, source):
    cls, ref_cls, _ = ESTIMATORS[name]
    rkw = {k: v for k, v in rollout_kwargs.items() if k not in ("task", "steps_to_next_obs")}
    td = rollout((3, 19), device=path.device, values=source == "values", **rkw)
    if rollout_kwargs.get("task"):
        td.set("task", torch.randint(0, 2, (3, 1), device=path.device).expand(3, 19))
    if rollout_kwargs.get("steps_to_next_obs"):
        td.set("steps_to_next_obs", torch.randint(1, 4, (3, 19, 1), device=path.device))
    kwargs = {k: v.to(path.device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    net = critic(path.device) if source == "net" else None
    ours, ref, *_ = run_pair(cls, ref_cls, td, value_network=net, **_build_kwargs(name, **kwargs))
    assert_td_close(ours, ref)


def test_td_lambda_zero_is_td0(path):
    """TD(lambda=0) is the one-step target. (TorchRL 0.14's own TDLambdaEstimator raises an
    IndexError for lmbda=0 in its vectorised path, so the comparison is against its TD0Estimator.)"""
    td = rollout((3, 19), device=path.device, values=True)
    ours = TDLambdaEstimator(gamma=GAMMA, lmbda=0.0, value_network=None)(td.clone())
    ref = trl.TD0Estimator(gamma=GAMMA, value_network=None)(td.clone())
    assert_td_close(ours, ref)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_set_keys(path, name):
    cls, ref_cls, _ = ESTIMATORS[name]
    keys = {
        "reward": "my_reward",
        "done": "my_done",
        "terminated": "my_terminated",
        "value": "my_value",
        "advantage": "my_adv",
        "value_target": ("out", "target"),
    }
    td = rollout(
        (3, 19), device=path.device, reward_key="my_reward", done_key="my_done", terminated_key="my_terminated"
    )
    net = critic(path.device, value_key="my_value")
    ours, ref, *_ = run_pair(cls, ref_cls, td, keys=keys, value_network=net, **_build_kwargs(name))
    assert_td_close(ours, ref)
    assert "advantage" not in ours.keys() and "my_adv" in ours.keys()


@pytest.mark.parametrize("source", ["net", "values"])
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_value_estimate(path, name, source):
    """value_estimate alone; with a network and no next_value it evaluates V on the next states."""
    cls, ref_cls, _ = ESTIMATORS[name]
    td = rollout((3, 19), device=path.device, values=source == "values")
    net = critic(path.device) if source == "net" else None
    kw = _build_kwargs(name, value_network=net)
    ours, ref = cls(**kw), ref_cls(**kw)
    if source == "values":
        nv = td["next", "state_value"]
        got, exp = ours.value_estimate(td.clone(), next_value=nv), ref.value_estimate(td.clone(), next_value=nv)
    else:
        a, b = td.clone(), td.clone()
        got, exp = ours.value_estimate(a), ref.value_estimate(b)
        assert_td_close(a, b)
    assert_tensor_close(got, exp, what="value_estimate")


@pytest.mark.parametrize("name", WITH_TIME_DIM)
def test_value_estimate_time_dim(path, name):
    cls, ref_cls, _ = ESTIMATORS[name]
    td = rollout((17, 3), time_axis_=0, device=path.device, values=True)
    kw = _build_kwargs(name, value_network=None)
    nv = td["next", "state_value"]
    got = cls(**kw).value_estimate(td.clone(), next_value=nv, time_dim=0)
    assert_tensor_close(got, ref_cls(**kw).value_estimate(td.clone(), next_value=nv, time_dim=0), what="value_estimate")


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_keyword_call_form(path, name):
    cls, ref_cls, _ = ESTIMATORS[name]
    td = rollout((2, 13), device=path.device)
    net = critic(path.device)
    kwargs = {
        "obs": td["obs"],
        "next_obs": td["next", "obs"],
        "next_reward": td["next", "reward"],
        "next_done": td["next", "done"],
        "next_terminated": td["next", "terminated"],
    }
    ours = cls(value_network=net, **_build_kwargs(name))(**kwargs)
    ref = ref_cls(value_network=net, **_build_kwargs(name))(**kwargs)
    assert isinstance(ours, tuple) and len(ours) == len(ref) == 2
    for a, b in zip(ours, ref, strict=True):
        assert_tensor_close(a, b, what="keyword call")


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_functional_params(path, name):
    cls, ref_cls, _ = ESTIMATORS[name]
    td = rollout((3, 19), device=path.device)
    net = critic(path.device)
    params = TensorDict.from_module(net).detach()
    target = params.apply(lambda p: p * 0.5 + 0.1)
    for call in ({"params": params}, {"params": params, "target_params": target}):
        ours, ref, *_ = run_pair(cls, ref_cls, td, value_network=net, call=call, **_build_kwargs(name))
        assert_td_close(ours, ref)


@pytest.mark.parametrize("source", ["net", "values"])
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_differentiable_gradients(path, name, source):
    cls_pair = ESTIMATORS[name]
    td = rollout((3, 19), device=path.device, values=source == "values")
    net = critic(path.device)
    w = torch.randn(td.shape + (1,), device=path.device)

    def run(cls):
        data = td.clone()
        leaves, names = [data["next", "reward"].requires_grad_()], ["reward"]
        if source == "values":
            leaves += [data["state_value"].requires_grad_(), data["next", "state_value"].requires_grad_()]
            names += ["state_value", "next_state_value"]
        net.zero_grad(set_to_none=True)
        mod = cls(value_network=net if source == "net" else None, differentiable=True, **_build_kwargs(name))
        out = mod(data)
        ((out["advantage"] * w).sum() + out["value_target"].square().sum()).backward()
        return out, grads(leaves) + grads(list(net.parameters())), names + ["weight", "bias"]

    ours, g_ours, names = run(cls_pair[0])
    ref, g_ref, _ = run(cls_pair[1])
    assert_td_close(ours, ref)
    assert_grads_close(g_ours, g_ref, names=names)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_deactivate_vmap_recurrent_critic(path, name):
    cls, ref_cls, _ = ESTIMATORS[name]
    td = rollout((3, 19), device=path.device, is_init=True)
    net = recurrent_critic(path.device)
    ours, ref, *_ = run_pair(cls, ref_cls, td, value_network=net, deactivate_vmap=True, **_build_kwargs(name))
    assert_td_close(ours, ref)


@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_float64(path, name):
    cls, ref_cls, _ = ESTIMATORS[name]
    td = rollout((3, 19), device=path.device, values=True).apply(lambda x: x.double() if x.is_floating_point() else x)
    # float64 hyper-parameters too (TorchRL's float32 buffers would round them)
    kw = {k: torch.tensor(v, dtype=torch.float64, device=path.device) for k, v in _build_kwargs(name).items()}
    ours, ref, *_ = run_pair(cls, ref_cls, td, value_network=None, **kw)
    assert ours["value_target"].dtype == torch.float64
    assert_td_close(ours, ref, atol=1e-10, rtol=1e-10)
