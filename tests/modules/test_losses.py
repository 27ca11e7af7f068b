"""TorchRL losses (ClipPPOLoss, A2CLoss) driven by our estimators give TorchRL's losses and gradients.

Three ways of putting our GAE into an unmodified loss, each against the same loss with TorchRL's
GAE on the same data and the same initial parameters:

* instance: ``loss.make_value_estimator(GAE(...))``
* class: ``loss.make_value_estimator(GAE, gamma=..., lmbda=..., value_network=...)``
* registry: ``register_with_torchrl()`` then ``loss.make_value_estimator(ValueEstimators.GAE, ...)``
  (and the loss's lazily built default estimator).
"""

import copy

import pytest
import torch
from tensordict.nn import InteractionType, TensorDictModule, set_interaction_type
from torch import nn
from torch.distributions import Categorical
from torchrl.modules import ProbabilisticActor, ValueOperator
from torchrl.objectives import A2CLoss, ClipPPOLoss, ValueEstimators
from torchrl.objectives import value as trl

from rl_triton import modules as rtm
from tests.modules._rollouts import OBS_DIM, assert_tensor_close, rollout

GAMMA, LMBDA = 0.9, 0.95
LOSSES = {"ClipPPO": ClipPPOLoss, "A2C": A2CLoss}


def actor_critic(device):
    logits = TensorDictModule(nn.Linear(OBS_DIM, 4), in_keys=["obs"], out_keys=["logits"])
    actor = ProbabilisticActor(logits, in_keys=["logits"], distribution_class=Categorical, return_log_prob=True)
    critic = ValueOperator(nn.Linear(OBS_DIM, 1), in_keys=["obs"])
    return actor.to(device), critic.to(device)


def batch(actor, device, steps: int = 19):
    """A rollout whose actions and log-probs come from a perturbed copy of the actor."""
    td = rollout((4, steps), device=device)
    behaviour = copy.deepcopy(actor)
    with torch.no_grad():
        for p in behaviour.parameters():
            p.add_(0.3 * torch.randn_like(p))
        with set_interaction_type(InteractionType.RANDOM):
            behaviour(td)
    return td.exclude("logits")


def loss_outputs(loss, td):
    """Every entry of the loss output and the gradient of the summed loss_* terms for every
    parameter of the loss module."""
    loss.zero_grad(set_to_none=True)
    out = loss(td.clone())
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    total.backward()
    grads = {n: p.grad.detach().clone() for n, p in loss.named_parameters() if p.grad is not None}
    return out, grads


def assert_same_losses(ours, ref):
    (out_o, g_o), (out_r, g_r) = ours, ref
    assert set(out_o.keys()) == set(out_r.keys())
    for k in out_r.keys():
        assert_tensor_close(out_o[k], out_r[k], what=k)
    assert set(g_o) == set(g_r), f"gradients reach different parameters: {set(g_o) ^ set(g_r)}"
    assert g_r, "the reference loss produced no gradient at all"
    for n in g_r:
        assert_tensor_close(g_o[n], g_r[n], what=f"grad of {n}")


@pytest.mark.parametrize("route", ["instance", "class"])
@pytest.mark.parametrize("loss_name", list(LOSSES))
def test_explicit_estimator(path, loss_name, route, rl_triton_calls):
    actor, critic = actor_critic(path.device)
    td = batch(actor, path.device)
    results = []
    for gae_cls in (rtm.GAE, trl.GAE):
        loss = LOSSES[loss_name](actor_network=copy.deepcopy(actor), critic_network=copy.deepcopy(critic))
        if route == "instance":
            loss.make_value_estimator(gae_cls(gamma=GAMMA, lmbda=LMBDA, value_network=loss.critic_network))
        else:
            loss.make_value_estimator(gae_cls, gamma=GAMMA, lmbda=LMBDA, value_network=loss.critic_network)
        assert type(loss.value_estimator) is gae_cls
        results.append(loss_outputs(loss, td))
    assert_same_losses(*results)
    assert rl_triton_calls["gae_with_next_values"] > 0


@pytest.mark.parametrize("explicit", [True, False], ids=["make_value_estimator", "default-estimator"])
@pytest.mark.parametrize("loss_name", list(LOSSES))
def test_registry_route(path, loss_name, explicit):
    """After register_with_torchrl(), unmodified loss code builds our GAE and computes the same
    losses and gradients as before registration."""
    actor, critic = actor_critic(path.device)
    td = batch(actor, path.device)

    def build():
        loss = LOSSES[loss_name](actor_network=copy.deepcopy(actor), critic_network=copy.deepcopy(critic))
        if explicit:
            loss.make_value_estimator(ValueEstimators.GAE, gamma=GAMMA, lmbda=LMBDA)
        return loss

    ref_loss = build()
    ref = loss_outputs(ref_loss, td)
    assert type(ref_loss.value_estimator) is trl.GAE
    rtm.register_with_torchrl()
    try:
        ours_loss = build()
        ours = loss_outputs(ours_loss, td)
        assert type(ours_loss.value_estimator) is rtm.GAE
    finally:
        rtm.unregister_from_torchrl()
    assert_same_losses(ours, ref)


@pytest.mark.parametrize(
    "value_type", [ValueEstimators.TD0, ValueEstimators.TD1, ValueEstimators.TDLambda, ValueEstimators.VTrace]
)
def test_registry_route_other_estimators(path, value_type):
    """ClipPPOLoss with the other registered estimators. For V-trace the stored actions are the
    actor's mode, where TorchRL's re-drawn action and the stored one coincide."""
    actor, critic = actor_critic(path.device)
    td = batch(actor, path.device)
    if value_type is ValueEstimators.VTrace:
        with torch.no_grad():
            td.set("action", actor(td.select("obs").clone())["action"])

    def build():
        loss = ClipPPOLoss(actor_network=copy.deepcopy(actor), critic_network=copy.deepcopy(critic))
        loss.make_value_estimator(value_type, gamma=GAMMA)
        return loss

    ref_loss = build()
    ref = loss_outputs(ref_loss, td)
    rtm.register_with_torchrl()
    try:
        ours_loss = build()
        ours = loss_outputs(ours_loss, td)
    finally:
        rtm.unregister_from_torchrl()
    assert type(ours_loss.value_estimator).__module__.startswith("rl_triton.modules")
    assert type(ours_loss.value_estimator).__name__ == type(ref_loss.value_estimator).__name__
    assert_same_losses(ours, ref)


def test_ppo_normalized_advantage_and_set_keys(path):
    """Loss-level options that go through the estimator: renamed loss keys forwarded with
    set_keys, advantage normalisation on top of our advantages."""
    actor, critic = actor_critic(path.device)
    td = batch(actor, path.device)
    td.rename_key_(("next", "reward"), ("next", "rew"))
    results = []
    for gae_cls in (rtm.GAE, trl.GAE):
        loss = ClipPPOLoss(
            actor_network=copy.deepcopy(actor), critic_network=copy.deepcopy(critic), normalize_advantage=True
        )
        loss.make_value_estimator(gae_cls, gamma=GAMMA, lmbda=LMBDA, value_network=loss.critic_network)
        loss.set_keys(reward="rew", advantage="adv", value_target="vt")
        assert loss.value_estimator.tensor_keys.reward == "rew"
        results.append(loss_outputs(loss, td))
    assert_same_losses(*results)
