"""register_with_torchrl() / unregister_from_torchrl(): TorchRL's value-estimator registry."""

from dataclasses import asdict

import pytest
from torchrl.objectives import ClipPPOLoss, ValueEstimators
from torchrl.objectives import value as trl
from torchrl.objectives.utils import default_value_kwargs, get_value_estimator_entry

from rl_triton import modules as rtm
from tests.modules.test_losses import actor_critic

OURS = {
    ValueEstimators.GAE: (rtm.GAE, trl.GAE),
    ValueEstimators.VTrace: (rtm.VTrace, trl.VTrace),
    ValueEstimators.TDLambda: (rtm.TDLambdaEstimator, trl.TDLambdaEstimator),
    ValueEstimators.TD1: (rtm.TD1Estimator, trl.TD1Estimator),
    ValueEstimators.TD0: (rtm.TD0Estimator, trl.TD0Estimator),
}


def _torchrl_defaults():
    return {vt: default_value_kwargs(vt) for vt in OURS}


@pytest.mark.parametrize("value_type", list(OURS), ids=lambda v: v.name)
def test_register_points_the_registry_at_ours(registered, value_type):
    ours, _ = OURS[value_type]
    assert get_value_estimator_entry(value_type).cls is ours
    assert get_value_estimator_entry(value_type.name.lower()).cls is ours  # string alias ("gae")


def test_default_hyper_parameters_kept():
    before = _torchrl_defaults()
    rtm.register_with_torchrl()
    try:
        assert _torchrl_defaults() == before
    finally:
        rtm.unregister_from_torchrl()


def test_unregister_restores_torchrl():
    rtm.register_with_torchrl()
    rtm.register_with_torchrl()  # idempotent
    rtm.unregister_from_torchrl()
    for value_type, (_, theirs) in OURS.items():
        assert get_value_estimator_entry(value_type).cls is theirs
    rtm.unregister_from_torchrl()  # a second undo changes nothing
    for value_type, (_, theirs) in OURS.items():
        assert get_value_estimator_entry(value_type).cls is theirs


def test_registration_handle_undo():
    """register_with_torchrl() returns something that can undo it, directly or as a context manager."""
    handle = rtm.register_with_torchrl()
    assert get_value_estimator_entry(ValueEstimators.GAE).cls is rtm.GAE
    handle.undo()
    assert get_value_estimator_entry(ValueEstimators.GAE).cls is trl.GAE
    with rtm.torchrl_registered():
        assert get_value_estimator_entry(ValueEstimators.GAE).cls is rtm.GAE
    assert get_value_estimator_entry(ValueEstimators.GAE).cls is trl.GAE


@pytest.mark.parametrize("value_type", list(OURS), ids=lambda v: v.name)
def test_loss_builds_ours_with_torchrl_defaults(registered, value_type):
    """make_value_estimator(<enum>) with no hyper-parameters builds ours with the same
    hyper-parameters TorchRL's registry gives its own class."""
    ours_cls, _ = OURS[value_type]
    actor, critic = actor_critic("cpu")
    loss = ClipPPOLoss(actor_network=actor, critic_network=critic)
    loss.make_value_estimator(value_type)
    est = loss.value_estimator
    assert type(est) is ours_cls
    rtm.unregister_from_torchrl()
    ref_loss = ClipPPOLoss(actor_network=actor, critic_network=critic)
    ref_loss.make_value_estimator(value_type)
    ref = ref_loss.value_estimator
    assert type(ref) is OURS[value_type][1]
    for name in ("gamma", "lmbda", "rho_thresh", "c_thresh"):
        if hasattr(ref, name):
            assert float(getattr(est, name)) == float(getattr(ref, name)), name
    assert est.differentiable == ref.differentiable
    ours_keys, ref_keys = asdict(est.tensor_keys), asdict(ref.tensor_keys)
    assert {k: ours_keys.get(k) for k in ref_keys} == ref_keys  # ours may add keys (VTrace: "action")


def test_does_not_leak_between_tests():
    """The fixture-based registration of the other tests is gone here."""
    for value_type, (_, theirs) in OURS.items():
        assert get_value_estimator_entry(value_type).cls is theirs
