"""rl_triton.modules.VTrace.

TorchRL 0.14's VTrace computes log pi by scoring a *freshly drawn* action (the actor's mode under
its default deterministic interaction, a new sample under RANDOM) instead of the action stored in
the rollout, which makes its importance ratios meaningless. Ours deliberately scores the stored
action. So the reference here is TorchRL's functional ``vtrace_advantage_estimate`` fed with the
correct log pi = actor_dist.log_prob(stored action); where the stored action happens to be the
actor's mode everywhere, ours must also equal TorchRL's module exactly.
"""

import copy
import inspect

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type
from torch import nn
from torch.distributions import Categorical, OneHotCategorical
from torchrl.modules import IndependentNormal, ProbabilisticActor
from torchrl.objectives import value as trl
from torchrl.objectives.value.functional import vtrace_advantage_estimate

from rl_triton.modules import VTrace
from tests.modules._rollouts import (
    LAYOUTS,
    OBS_DIM,
    assert_grads_close,
    assert_td_close,
    assert_tensor_close,
    critic,
    grads,
    rollout,
    run_pair,
    time_axis,
)

GAMMA = 0.95
N_ACTIONS = 4
LOG_MU = trl.VTrace(gamma=0.9, actor_network=None, value_network=None).tensor_keys.sample_log_prob


class _LocScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(OBS_DIM, 4)

    def forward(self, obs):
        loc, scale = self.lin(obs).chunk(2, -1)
        return loc, nn.functional.softplus(scale) + 0.1


def make_actor(kind="categorical", device="cpu"):
    """A small policy: Categorical over logits (index actions), OneHotCategorical, or a diagonal
    Gaussian (2-d continuous actions)."""
    if kind == "normal":
        net = TensorDictModule(_LocScale(), in_keys=["obs"], out_keys=["loc", "scale"])
        actor = ProbabilisticActor(
            net, in_keys=["loc", "scale"], distribution_class=IndependentNormal, return_log_prob=True
        )
    else:
        net = TensorDictModule(nn.Linear(OBS_DIM, N_ACTIONS), in_keys=["obs"], out_keys=["logits"])
        dist = Categorical if kind == "categorical" else OneHotCategorical
        actor = ProbabilisticActor(net, in_keys=["logits"], distribution_class=dist, return_log_prob=True)
    return actor.to(device)


def add_behaviour(td, actor, *, mode_actions=False, noise=0.7):
    """Stores the behaviour policy's action and its log-probability under LOG_MU. The behaviour
    policy is the actor with perturbed parameters; mode_actions=True stores the target actor's
    mode instead (with the behaviour policy's log-prob of it)."""
    behaviour = _perturbed(actor, noise)
    with torch.no_grad():
        if mode_actions:
            with set_interaction_type(InteractionType.DETERMINISTIC):
                action = actor(td.select(*actor.in_keys).clone())["action"]
        else:
            with set_interaction_type(InteractionType.RANDOM):
                action = behaviour(td.select("obs").clone())["action"]
        log_mu = behaviour.get_dist(td.select("obs").clone()).log_prob(action)
    td.set("action", action)
    td.set(LOG_MU, log_mu)
    return td


def _perturbed(actor, noise):
    b = copy.deepcopy(actor)
    with torch.no_grad():
        for p in b.parameters():
            p.add_(noise * torch.randn_like(p))
    return b


def reference(td, actor, value_net, *, gamma=GAMMA, rho=1.0, c=1.0, axis=None, values_from_td=False):
    """The V-trace numbers TorchRL's functional gives with log pi of the *stored* action."""
    axis = td.ndim - 1 if axis is None else axis
    with torch.no_grad():
        log_pi = actor.get_dist(td.select(*actor.in_keys, strict=False).clone()).log_prob(td["action"])
        if values_from_td:
            v, nv = td["state_value"], td["next", "state_value"]
        else:
            v = value_net(td.select("obs").clone())["state_value"]
            nv = value_net(td["next"].select("obs").clone())["state_value"]
        log_mu = td[LOG_MU]
        r, d, te = td["next", "reward"], td["next", "done"], td["next", "terminated"]

        def t(x):  # time to dim -2, as the functional expects
            x = x.reshape(v.shape)
            return x.movedim(axis, -2)

        adv, vs = vtrace_advantage_estimate(
            gamma, t(log_pi), t(log_mu), t(v), t(nv), t(r), t(d), t(te), rho_thresh=rho, c_thresh=c, time_dim=-2
        )
    return adv.movedim(-2, axis), vs.movedim(-2, axis)


def test_is_a_drop_in_subclass():
    assert issubclass(VTrace, trl.VTrace)
    ours = inspect.signature(VTrace.__init__).parameters
    for arg, p in inspect.signature(trl.VTrace.__init__).parameters.items():
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        assert arg in ours or any(q.kind == q.VAR_KEYWORD for q in ours.values()), f"missing argument {arg}"
        if arg in ours:
            assert ours[arg].default == p.default, f"default of {arg}"


@pytest.mark.parametrize("source", ["net", "values"])
@pytest.mark.parametrize("layout", ["T", "T-td0", "BT", "BT-td1", "TB-td0", "BTA-td1", "BTA-named"])
def test_stored_action_matches_functional(path, layout, source, rl_triton_calls):
    bs, time_dim, names = LAYOUTS[layout]
    axis = time_axis(bs, time_dim, names)
    td = rollout(bs, time_axis_=axis, names=names, device=path.device, values=source == "values")
    actor = make_actor(device=path.device)
    add_behaviour(td, actor)
    net = critic(path.device)
    mod = VTrace(gamma=GAMMA, actor_network=actor, value_network=net if source == "net" else None, time_dim=time_dim)
    data = td.clone()
    out = mod(data)
    assert out is data
    adv, vs = reference(td, actor, net, axis=axis, values_from_td=source == "values")
    assert_tensor_close(out["advantage"], adv, what="advantage")
    assert_tensor_close(out["value_target"], vs, what="value_target")
    assert sum(rl_triton_calls.values()) > 0, "no rl_triton function ran"


@pytest.mark.parametrize("kind", ["categorical", "one-hot", "normal"])
def test_action_spaces(path, kind):
    td = rollout((3, 19), device=path.device)
    actor = make_actor(kind, path.device)
    add_behaviour(td, actor, noise=0.3)
    net = critic(path.device)
    out = VTrace(gamma=GAMMA, actor_network=actor, value_network=net)(td.clone())
    adv, vs = reference(td, actor, net)
    assert_tensor_close(out["advantage"], adv, what="advantage")
    assert_tensor_close(out["value_target"], vs, what="value_target")


@pytest.mark.parametrize("rho, c", [(1.0, 1.0), (0.5, 0.7), (2.0, 1.5), (1.5, 0.5)], ids=lambda x: str(x))
def test_clipping_thresholds(path, rho, c):
    td = rollout((3, 19), device=path.device)
    actor = make_actor(device=path.device)
    add_behaviour(td, actor, noise=1.0)
    net = critic(path.device)
    out = VTrace(gamma=GAMMA, actor_network=actor, value_network=net, rho_thresh=rho, c_thresh=c)(td.clone())
    adv, vs = reference(td, actor, net, rho=rho, c=c)
    assert_tensor_close(out["advantage"], adv, what="advantage")
    assert_tensor_close(out["value_target"], vs, what="value_target")


@pytest.mark.parametrize("pattern", ["none", "last", "trunc"])
def test_done_patterns(path, pattern):
    td = rollout((3, 19), device=path.device, pattern=pattern, p_trunc=0.2)
    actor = make_actor(device=path.device)
    add_behaviour(td, actor)
    net = critic(path.device)
    out = VTrace(gamma=GAMMA, actor_network=actor, value_network=net)(td.clone())
    adv, vs = reference(td, actor, net)
    assert_tensor_close(out["advantage"], adv, what="advantage")
    assert_tensor_close(out["value_target"], vs, what="value_target")


def test_equals_torchrl_when_stored_action_is_the_mode(path):
    """Where the stored action is what TorchRL's module re-draws (the actor's mode), the documented
    difference vanishes and every output entry equals TorchRL's."""
    td = rollout((3, 19), device=path.device)
    actor = make_actor(device=path.device)
    add_behaviour(td, actor, mode_actions=True)
    net = critic(path.device)
    ours, ref, *_ = run_pair(VTrace, trl.VTrace, td, gamma=GAMMA, actor_network=actor, value_network=net)
    assert_td_close(ours, ref)


def test_torchrl_scores_a_redrawn_action(path):
    """Documents the fix: TorchRL's module equals the functional fed with log pi of the actor's
    *mode*, not of the stored action; ours equals the functional with the stored action, and the
    two differ wherever the stored action is not the mode."""
    td = rollout((3, 19), device=path.device)
    actor = make_actor(device=path.device)
    add_behaviour(td, actor, noise=1.0)
    with torch.no_grad():
        mode = actor(td.select("obs").clone())["action"]
    assert (mode != td["action"]).any(), "test needs some stored actions that differ from the mode"
    net = critic(path.device)
    ours, ref, *_ = run_pair(VTrace, trl.VTrace, td, gamma=GAMMA, actor_network=actor, value_network=net)

    adv_stored, vs_stored = reference(td, actor, net)
    adv_mode, vs_mode = reference(td.clone().set("action", mode), actor, net)
    assert_tensor_close(ref["advantage"], adv_mode, what="TorchRL advantage")  # what TorchRL does
    assert_tensor_close(ours["advantage"], adv_stored, what="our advantage")  # what we do
    assert_tensor_close(ours["value_target"], vs_stored, what="our value_target")
    assert not torch.allclose(ours["advantage"], ref["advantage"])


def test_interaction_type_does_not_matter(path):
    """Ours never draws an action, so RANDOM interaction (under which TorchRL's samples a new one)
    gives the same numbers as the default."""
    td = rollout((3, 19), device=path.device)
    actor = make_actor(device=path.device)
    add_behaviour(td, actor)
    net = critic(path.device)
    mod = VTrace(gamma=GAMMA, actor_network=actor, value_network=net)
    default = mod(td.clone())
    with set_interaction_type(InteractionType.RANDOM):
        random = mod(td.clone())
    assert_td_close(random, default, atol=0, rtol=0)


VTRACE_OPTIONS = {
    "average_adv": ({"average_adv": True}, {}),
    "average_adv-group": ({"average_adv": True, "group_key": "task"}, {}),
    "shifted": ({"shifted": True}, {"pattern": "trunc"}),
    "value_chunk_size": ({"value_chunk_size": 2}, {}),
    "gamma.99": ({"gamma": 0.99}, {}),
    "steps_to_next_obs": ({}, {"steps_to_next_obs": True}),
    "tensor-thresholds": ({"rho_thresh": torch.tensor(1.5), "c_thresh": torch.tensor(0.8)}, {}),
}


@pytest.mark.parametrize("kwargs, extra", list(VTRACE_OPTIONS.values()), ids=list(VTRACE_OPTIONS))
def test_options_parity_on_mode_actions(path, kwargs, extra):
    td = rollout((3, 19), device=path.device, pattern=extra.get("pattern", "random"))
    if extra.get("steps_to_next_obs"):
        td.set("steps_to_next_obs", torch.randint(1, 4, (3, 19, 1), device=path.device))
    if "group_key" in kwargs:
        td.set("task", torch.randint(0, 2, (3, 1), device=path.device).expand(3, 19))
    actor = make_actor(device=path.device)
    add_behaviour(td, actor, mode_actions=True)
    net = critic(path.device)
    kwargs = {"gamma": GAMMA, **kwargs}
    kwargs = {k: v.to(path.device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    ours, ref, *_ = run_pair(VTrace, trl.VTrace, td, actor_network=actor, value_network=net, **kwargs)
    assert_td_close(ours, ref)


def test_set_keys(path):
    keys = {
        "reward": "my_reward",
        "done": "my_done",
        "terminated": "my_terminated",
        "value": "my_value",
        "advantage": "my_adv",
        "value_target": "my_target",
        "sample_log_prob": "behaviour_lp",
    }
    td = rollout(
        (3, 19), device=path.device, reward_key="my_reward", done_key="my_done", terminated_key="my_terminated"
    )
    actor = make_actor(device=path.device)
    add_behaviour(td, actor, mode_actions=True)
    td.rename_key_(LOG_MU, "behaviour_lp")
    net = critic(path.device, value_key="my_value")
    ours, ref, *_ = run_pair(VTrace, trl.VTrace, td, keys=keys, gamma=GAMMA, actor_network=actor, value_network=net)
    assert_td_close(ours, ref)
    assert "my_adv" in ours.keys() and "advantage" not in ours.keys()


def test_functional_params(path):
    td = rollout((3, 19), device=path.device)
    actor = make_actor(device=path.device)
    add_behaviour(td, actor, mode_actions=True)
    net = critic(path.device)
    params = TensorDict.from_module(net).detach()
    target = params.apply(lambda p: p * 0.5 + 0.1)
    for call in ({"params": params}, {"params": params, "target_params": target}):
        ours, ref, *_ = run_pair(VTrace, trl.VTrace, td, gamma=GAMMA, actor_network=actor, value_network=net, call=call)
        assert_td_close(ours, ref)


def test_next_values_not_equal_to_shifted_values(path):
    """("next", "state_value")[t] need not equal state_value[t+1] (a target critic, a recurrent
    critic, values stored by different networks). TorchRL's advantage bootstraps inside an episode
    from vs_{t+1} = state_value[t+1] + (vs - V)[t+1], and from ("next", "state_value")[t] only at
    done steps and at the window end."""
    td = rollout((3, 19), device=path.device, values=True)
    td["next", "state_value"] = td["next", "state_value"] + torch.randn_like(td["next", "state_value"])
    actor = make_actor(device=path.device)
    add_behaviour(td, actor, mode_actions=True)
    ours, ref, *_ = run_pair(VTrace, trl.VTrace, td, gamma=GAMMA, actor_network=actor, value_network=None)
    assert_td_close(ours, ref)


@pytest.mark.parametrize("source", ["net", "values"])
def test_differentiable_gradients(path, source):
    """Gradients to rewards and stored values match TorchRL's (ratios are constants: the actor gets
    no gradient from the estimator in either)."""
    td = rollout((3, 19), device=path.device, values=source == "values")
    actor = make_actor(device=path.device)
    add_behaviour(td, actor, mode_actions=True)
    net = critic(path.device)

    def run(cls):
        data = td.clone()
        leaves, names = [data["next", "reward"].requires_grad_()], ["reward"]
        if source == "values":
            leaves += [data["state_value"].requires_grad_(), data["next", "state_value"].requires_grad_()]
            names += ["state_value", "next_state_value"]
        actor.zero_grad(set_to_none=True)
        net.zero_grad(set_to_none=True)
        mod = cls(gamma=GAMMA, actor_network=actor, value_network=net if source == "net" else None, differentiable=True)
        out = mod(data)
        (out["advantage"].square().sum() + out["value_target"].sum()).backward()
        params = list(net.parameters()) + list(actor.parameters())
        return out, grads(leaves) + grads(params), names + [f"param{i}" for i in range(len(params))]

    ours, g_ours, names = run(VTrace)
    ref, g_ref, _ = run(trl.VTrace)
    assert_td_close(ours, ref)
    assert_grads_close(g_ours, g_ref, names=names)
