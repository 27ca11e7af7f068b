"""rl_triton.modules.GAE / MultiAgentGAE against TorchRL 0.14's GAE / MultiAgentGAE.

Every test builds ours and TorchRL's estimator with identical arguments, runs each on its own clone
of one rollout and compares every entry of the two output TensorDicts (advantage, value_target,
state_value, ("next", "state_value"), shifted_valid, ...).
"""

import inspect

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives import value as trl

from rl_triton.modules import GAE, MultiAgentGAE
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

GAMMA, LMBDA = 0.95, 0.9


def _rollout_for(layout, device, **kw):
    bs, time_dim, names = LAYOUTS[layout]
    return rollout(bs, time_axis_=time_axis(bs, time_dim, names), names=names, device=device, **kw), time_dim


@pytest.mark.parametrize("cls, ref_cls", [(GAE, trl.GAE), (MultiAgentGAE, trl.MultiAgentGAE)], ids=["GAE", "MAGAE"])
def test_is_a_drop_in_subclass(cls, ref_cls):
    assert issubclass(cls, ref_cls)
    ours = inspect.signature(cls.__init__).parameters
    theirs = inspect.signature(ref_cls.__init__).parameters
    for name, p in theirs.items():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        assert name in ours or any(q.kind == q.VAR_KEYWORD for q in ours.values()), f"missing argument {name}"
        if name in ours:
            assert ours[name].default == p.default, f"default of {name}"


@pytest.mark.parametrize("source", ["net", "values"])
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_parity_layouts(path, layout, source, rl_triton_calls):
    """Batch shapes [T], [B,T], [T,B], [B,T,A]; time_dim given, inferred, or a dim named "time"."""
    td, time_dim = _rollout_for(layout, path.device, values=source == "values")
    net = critic(path.device) if source == "net" else None
    ours, ref, *_ = run_pair(GAE, trl.GAE, td, gamma=GAMMA, lmbda=LMBDA, value_network=net, time_dim=time_dim)
    assert_td_close(ours, ref)
    assert sum(rl_triton_calls.values()) > 0, "no rl_triton function ran"
    if LAYOUTS[layout][2] is not None:
        assert ours.names == ref.names


@pytest.mark.parametrize("layout", ["T-td0", "TB-td0", "BTA-td1", "BT-td1"])
def test_time_dim_in_forward(path, layout):
    """time_dim passed to forward instead of the constructor."""
    td, time_dim = _rollout_for(layout, path.device)
    net = critic(path.device)
    ours, ref, *_ = run_pair(GAE, trl.GAE, td, gamma=GAMMA, lmbda=LMBDA, value_network=net, call={"time_dim": time_dim})
    assert_td_close(ours, ref)


@pytest.mark.parametrize("pattern", ["none", "last", "trunc", "random"])
@pytest.mark.parametrize("truncated_key", [True, False], ids=["with-truncated", "no-truncated"])
def test_done_patterns(path, pattern, truncated_key):
    td = rollout((4, 23), device=path.device, pattern=pattern, truncated=truncated_key, p_term=0.2, p_trunc=0.2)
    ours, ref, *_ = run_pair(GAE, trl.GAE, td, gamma=GAMMA, lmbda=LMBDA, value_network=critic(path.device))
    assert_td_close(ours, ref)


# (id, constructor kwargs, rollout kwargs, sources): option combinations on a [B, T] rollout.
OPTIONS = [
    ("gamma.99-lmbda.95", {"gamma": 0.99, "lmbda": 0.95}, {}, ("net", "values")),
    ("lmbda0", {"lmbda": 0.0}, {}, ("net", "values")),
    ("lmbda1", {"lmbda": 1.0}, {}, ("net", "values")),
    ("gamma1-lmbda1", {"gamma": 1.0, "lmbda": 1.0}, {}, ("values",)),
    ("tensor-hparams", {"gamma": torch.tensor(0.9), "lmbda": torch.tensor(0.8)}, {}, ("values",)),
    ("gamma-above-1", {"gamma": 1.05}, {}, ("values",)),  # outside the kernels' range: TorchRL's path
    ("average_gae", {"average_gae": True}, {}, ("net", "values")),
    ("average_gae-group", {"average_gae": True, "group_key": "task"}, {"task": True}, ("values",)),
    ("auto_reset_env", {"auto_reset_env": True}, {}, ("net", "values")),
    ("vectorized-False", {"vectorized": False}, {}, ("values",)),
    ("differentiable", {"differentiable": True}, {}, ("net",)),
    ("steps_to_next_obs", {}, {"steps_to_next_obs": True}, ("values",)),
    ("value_chunk_size", {"value_chunk_size": 2}, {}, ("net",)),
    ("num_chunks", {"num_chunks": 2}, {}, ("net",)),
    ("deactivate_vmap", {"deactivate_vmap": True}, {}, ("net",)),
    ("shifted", {"shifted": True}, {}, ("net",)),
    ("shifted-trunc-heavy", {"shifted": True}, {"pattern": "trunc"}, ("net",)),
    ("shifted-budget3", {"shifted": True, "shifted_budget": 3}, {"pattern": "trunc"}, ("net",)),
    ("shifted-no-done", {"shifted": True}, {"pattern": "none"}, ("net",)),
    ("shifted-average_gae", {"shifted": True, "average_gae": True}, {"pattern": "trunc"}, ("net",)),
]
OPTION_CASES = [
    pytest.param(kw, rkw, src, id=f"{name}-{src}") for name, kw, rkw, src_list in OPTIONS for src in src_list
]


def _decorate(td: TensorDict, rkw: dict) -> TensorDict:
    """Adds the extra entries some options read."""
    if rkw.get("task"):
        td.set("task", torch.randint(0, 2, td.batch_size[:1], device=td.device).unsqueeze(-1).expand(td.batch_size))
    if rkw.get("steps_to_next_obs"):
        td.set("steps_to_next_obs", torch.randint(1, 4, (*td.batch_size, 1), device=td.device))
    return td


@pytest.mark.parametrize("kwargs, rollout_kwargs, source", OPTION_CASES)
def test_options(path, kwargs, rollout_kwargs, source):
    rkw = {k: v for k, v in rollout_kwargs.items() if k not in ("task", "steps_to_next_obs")}
    td = _decorate(rollout((3, 19), device=path.device, values=source == "values", **rkw), rollout_kwargs)
    kwargs = {"gamma": GAMMA, "lmbda": LMBDA, **kwargs}
    kwargs = {k: v.to(path.device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    net = critic(path.device) if source == "net" else None
    ours, ref, *_ = run_pair(GAE, trl.GAE, td, value_network=net, **kwargs)
    assert_td_close(ours, ref)


@pytest.mark.parametrize("layout", ["TB-named", "BTA-named"])
def test_shifted_named_time_dim(path, layout):
    """shifted=True finds the time dim by its name."""
    td, _ = _rollout_for(layout, path.device, pattern="trunc")
    ours, ref, *_ = run_pair(
        GAE, trl.GAE, td, gamma=GAMMA, lmbda=LMBDA, value_network=critic(path.device), shifted=True
    )
    assert_td_close(ours, ref)


@pytest.mark.parametrize("source", ["net", "values"])
def test_set_keys(path, source):
    """Renamed reward / done / terminated / value / advantage / value_target entries."""
    keys = {
        "reward": "my_reward",
        "done": "my_done",
        "terminated": "my_terminated",
        "value": "my_value",
        "advantage": ("out", "adv"),
        "value_target": "my_target",
    }
    td = rollout(
        (3, 19),
        device=path.device,
        reward_key="my_reward",
        done_key="my_done",
        terminated_key="my_terminated",
        values=source == "values",
        value_key="my_value",
    )
    net = critic(path.device, value_key="my_value") if source == "net" else None
    ours, ref, ours_mod, ref_mod = run_pair(GAE, trl.GAE, td, keys=keys, gamma=GAMMA, lmbda=LMBDA, value_network=net)
    assert_td_close(ours, ref)
    assert ("out", "adv") in ours.keys(True) and "advantage" not in ours.keys()
    assert ours_mod.in_keys == ref_mod.in_keys and ours_mod.out_keys == ref_mod.out_keys


@pytest.mark.parametrize("skip_existing", [True, False, None], ids=["skip", "noskip", "default"])
def test_skip_existing(path, skip_existing):
    """Precomputed state values plus a critic: skip_existing=True keeps the stored values."""
    td = rollout((3, 19), device=path.device, values=True)
    net = critic(path.device)
    ours, ref, *_ = run_pair(GAE, trl.GAE, td, gamma=GAMMA, lmbda=LMBDA, value_network=net, skip_existing=skip_existing)
    assert_td_close(ours, ref)
    if skip_existing:
        torch.testing.assert_close(ours["state_value"], td["state_value"])


@pytest.mark.parametrize("source", ["net", "values"])
def test_value_estimate(path, source):
    td = rollout((3, 19), device=path.device, values=source == "values")
    net = critic(path.device) if source == "net" else None
    ours, ref = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=net), trl.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=net)
    a, b = td.clone(), td.clone()
    assert_tensor_close(ours.value_estimate(a), ref.value_estimate(b), what="value_estimate")
    assert_td_close(a, b)


def test_value_estimate_time_dim(path):
    td, time_dim = _rollout_for("TB-td0", path.device)
    net = critic(path.device)
    ours, ref = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=net), trl.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=net)
    got = ours.value_estimate(td.clone(), time_dim=time_dim)
    assert_tensor_close(got, ref.value_estimate(td.clone(), time_dim=time_dim), what="value_estimate")


def test_keyword_call_form(path):
    """module(obs=..., next_reward=..., ...) returns (advantage, value_target) as TorchRL's does."""
    td = rollout((2, 13), device=path.device)
    net = critic(path.device)
    kwargs = {
        "obs": td["obs"],
        "next_obs": td["next", "obs"],
        "next_reward": td["next", "reward"],
        "next_done": td["next", "done"],
        "next_terminated": td["next", "terminated"],
    }
    ours = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=net)(**kwargs)
    ref = trl.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=net)(**kwargs)
    assert isinstance(ours, tuple) and len(ours) == len(ref) == 2
    for a, b in zip(ours, ref, strict=True):
        assert_tensor_close(a, b, what="keyword call")


def test_functional_params(path):
    """params / target_params passed explicitly (as loss modules do) instead of the module's own."""
    td = rollout((3, 19), device=path.device)
    net = critic(path.device)
    params = TensorDict.from_module(net).detach()
    target = params.apply(lambda p: p * 0.5 + 0.1)
    for call in ({"params": params}, {"params": params, "target_params": target}):
        ours, ref, *_ = run_pair(GAE, trl.GAE, td, gamma=GAMMA, lmbda=LMBDA, value_network=net, call=call)
        assert_td_close(ours, ref)


@pytest.mark.parametrize("source", ["net", "values"])
def test_differentiable_gradients(path, source):
    """differentiable=True: gradients reach the rewards, the stored values and the critic exactly
    as with TorchRL's GAE (same graph cut: the critic is held out, next values detached)."""
    td = rollout((3, 19), device=path.device, values=source == "values")
    net = critic(path.device)
    w_adv = torch.randn(td.shape + (1,), device=path.device)
    w_vt = torch.randn(td.shape + (1,), device=path.device)

    def run(cls):
        data = td.clone()
        leaves = [data["next", "reward"].requires_grad_()]
        names = ["reward"]
        if source == "values":
            leaves += [data["state_value"].requires_grad_(), data["next", "state_value"].requires_grad_()]
            names += ["state_value", "next_state_value"]
        net.zero_grad(set_to_none=True)
        out = cls(gamma=GAMMA, lmbda=LMBDA, value_network=net if source == "net" else None, differentiable=True)(data)
        loss = (out["advantage"] * w_adv).sum() + (out["value_target"] * w_vt).sum()
        requires = (out["advantage"].requires_grad, out["value_target"].requires_grad)
        loss.backward()
        return out, grads(leaves) + grads(list(net.parameters())), names + ["weight", "bias"], requires

    ours, g_ours, names, req_ours = run(GAE)
    ref, g_ref, _, req_ref = run(trl.GAE)
    assert req_ours == req_ref
    assert_td_close(ours, ref)
    assert_grads_close(g_ours, g_ref, names=names)


def test_not_differentiable_by_default(path):
    """differentiable=False (default): outputs carry no graph, as TorchRL's."""
    td = rollout((3, 19), device=path.device, values=True)
    td["next", "reward"].requires_grad_()
    ours, ref, *_ = run_pair(GAE, trl.GAE, td, gamma=GAMMA, lmbda=LMBDA, value_network=None)
    assert ours["advantage"].requires_grad == ref["advantage"].requires_grad
    assert ours["value_target"].requires_grad == ref["value_target"].requires_grad


def test_deactivate_vmap_recurrent_critic(path):
    """A critic with data-dependent control flow (recurrent-style, reset at "is_init") cannot run
    under vmap; with deactivate_vmap=True both estimators call it in a loop and agree."""
    td = rollout((3, 19), device=path.device, is_init=True)
    net = recurrent_critic(path.device)
    ours, ref, *_ = run_pair(GAE, trl.GAE, td, gamma=GAMMA, lmbda=LMBDA, value_network=net, deactivate_vmap=True)
    assert_td_close(ours, ref)
    with pytest.raises(Exception):  # noqa: B017 - documents why the option exists
        trl.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=net)(td.clone())


def test_float64(path):
    td = rollout((3, 19), device=path.device, values=True)
    td = td.apply(lambda x: x.double() if x.is_floating_point() else x)
    # float64 hyper-parameters too: with Python floats TorchRL keeps gamma and lmbda in float32
    # buffers and multiplies them in float32, which alone moves its results by ~1e-7.
    g, lm = (torch.tensor(x, dtype=torch.float64, device=path.device) for x in (GAMMA, LMBDA))
    ours, ref, *_ = run_pair(GAE, trl.GAE, td, gamma=g, lmbda=lm, value_network=None)
    assert ours["advantage"].dtype == torch.float64
    assert_td_close(ours, ref, atol=1e-10, rtol=1e-10)


# ------------------------------------------------------------------------------------ multi-agent

N_AGENTS = 3


def _ma_rollout(device, *, per_agent_reward=False, values=False, pattern="random"):
    """Team reward / done / terminated [B, T, 1]; per-agent observations [B, T, n, 3] and values
    [B, T, n, 1] (or per-agent rewards [B, T, n, 1] for the competitive layout)."""
    return rollout(
        (3, 19),
        device=device,
        pattern=pattern,
        obs_shape=(N_AGENTS, 3),
        reward_shape=(N_AGENTS, 1) if per_agent_reward else (1,),
        values=values,
        value_shape=(N_AGENTS, 1),
    )


@pytest.mark.parametrize("average_gae", [False, True], ids=["raw", "average_gae"])
@pytest.mark.parametrize("per_agent_reward", [False, True], ids=["team-reward", "agent-reward"])
@pytest.mark.parametrize("source", ["net", "values"])
def test_multi_agent_gae(path, source, per_agent_reward, average_gae, rl_triton_calls):
    td = _ma_rollout(path.device, per_agent_reward=per_agent_reward, values=source == "values")
    net = critic(path.device) if source == "net" else None
    ours, ref, *_ = run_pair(
        MultiAgentGAE, trl.MultiAgentGAE, td, gamma=GAMMA, lmbda=LMBDA, value_network=net, average_gae=average_gae
    )
    assert ours["advantage"].shape == (3, 19, N_AGENTS, 1)
    assert_td_close(ours, ref)
    assert sum(rl_triton_calls.values()) > 0, "no rl_triton function ran"


def test_multi_agent_gae_agent_dim_and_value_estimate(path):
    """agent_dim given explicitly (the value tensor's dim -2 = 2) and value_estimate."""
    td = _ma_rollout(path.device, values=True, pattern="trunc")
    kw = {"gamma": GAMMA, "lmbda": LMBDA, "value_network": None, "agent_dim": 2}
    ours, ref, ours_mod, ref_mod = run_pair(MultiAgentGAE, trl.MultiAgentGAE, td, **kw)
    assert_td_close(ours, ref)
    assert_tensor_close(ours_mod.value_estimate(td.clone()), ref_mod.value_estimate(td.clone()), what="value_estimate")


def test_multi_agent_gae_differentiable(path):
    td = _ma_rollout(path.device, values=True)

    def run(cls):
        data = td.clone()
        leaves = [data["next", "reward"].requires_grad_(), data["state_value"].requires_grad_()]
        out = cls(gamma=GAMMA, lmbda=LMBDA, value_network=None, differentiable=True, average_gae=True)(data)
        (out["advantage"].square().sum() + out["value_target"].sum()).backward()
        return out, grads(leaves)

    ours, g_ours = run(MultiAgentGAE)
    ref, g_ref = run(trl.MultiAgentGAE)
    assert_td_close(ours, ref)
    assert_grads_close(g_ours, g_ref, names=["reward", "state_value"])
