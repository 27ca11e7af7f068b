"""Call patterns of TorchRL's own losses and tests, and the errors for absent entries.

* Dreamer's and DreamerV3's actor losses call ``value_estimate`` on a tensordict with
  ``batch_size []`` (``lambda_target``), for which TorchRL's time dim is -1: the last dim of each
  tensor, counted from its end. The results must be TorchRL's, through the losses themselves with
  our classes registered and on the estimators directly.
* An entry an estimator needs that is absent raises :class:`MissingEntryError` naming the key and
  the estimator (not an ``AttributeError`` on ``None``).
"""

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.objectives import DreamerActorLoss, ValueEstimators
from torchrl.objectives import value as trl
from torchrl.objectives.dreamer_v3 import DreamerV3ActorLoss

from rl_triton import modules as rtm
from rl_triton.modules import MissingEntryError
from rl_triton.modules._common import from_rows, rows_shape, to_rows, to_rows_actions

# TorchRL's TD estimators warn when handed a tensor gamma (torch.tensor(tensor)); not ours to fix.
pytestmark = pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")

GAMMA, LMBDA = 0.9, 0.8

TD_PAIRS = {
    "TD0": (rtm.TD0Estimator, trl.TD0Estimator, {}),
    "TD1": (rtm.TD1Estimator, trl.TD1Estimator, {}),
    "TDLambda": (rtm.TDLambdaEstimator, trl.TDLambdaEstimator, {"lmbda": LMBDA}),
    "TDLambda-loop": (rtm.TDLambdaEstimator, trl.TDLambdaEstimator, {"lmbda": LMBDA, "vectorized": False}),
}


def _imagined(shape, device, seed=0, p_done=0.0) -> TensorDict:
    """What Dreamer's ``lambda_target`` builds: next reward, value, done and terminated, batch_size []."""
    g = torch.Generator().manual_seed(seed)
    done = torch.rand(shape, generator=g) < p_done
    entries = {
        ("next", "reward"): torch.randn(shape, generator=g),
        ("next", "state_value"): torch.randn(shape, generator=g),
        ("next", "done"): done,
        ("next", "terminated"): done.clone(),
    }
    return TensorDict(entries, []).to(device)


# ------------------------------------------------------------------------------------------------
# batch_size [] (time dim -1)


@pytest.mark.parametrize("name", list(TD_PAIRS))
@pytest.mark.parametrize("shape", [(6, 5, 1), (5, 1), (2, 3, 4), (7,)], ids=str)
@pytest.mark.parametrize("p_done", [0.0, 0.3])
def test_value_estimate_without_batch_dims(path, name, shape, p_done):
    ours_cls, ref_cls, extra = TD_PAIRS[name]
    kwargs = {"gamma": GAMMA, "value_network": None, **extra}
    td = _imagined(shape, path.device, seed=sum(shape), p_done=p_done)
    ours = ours_cls(**kwargs).value_estimate(td.clone())
    ref = ref_cls(**kwargs).value_estimate(td.clone())
    assert ours.shape == ref.shape == torch.Size(shape)
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("loss_cls", [DreamerActorLoss, DreamerV3ActorLoss])
@pytest.mark.parametrize("value_type", [None, ValueEstimators.TD0, ValueEstimators.TD1, ValueEstimators.TDLambda])
def test_dreamer_lambda_target(path, registered, loss_cls, value_type):
    """The losses' own ``lambda_target`` with our estimators registered, against TorchRL's."""
    actor = TensorDictModule(nn.Linear(3, 2), in_keys=["state"], out_keys=["action"])
    value = TensorDictModule(nn.Linear(3, 1), in_keys=["state"], out_keys=["state_value"])
    g = torch.Generator().manual_seed(1)
    reward, next_value = (torch.randn(6, 5, 1, generator=g).to(path.device) for _ in range(2))

    def target():
        loss = loss_cls(actor, value, None, imagination_horizon=5)
        if value_type is not None:
            loss.make_value_estimator(value_type)
        return type(loss.value_estimator), loss.lambda_target(reward, next_value)

    ours_cls, ours = target()
    registered.unregister_from_torchrl()
    ref_cls, ref = target()
    assert ours_cls.__module__.startswith("rl_triton.modules") and ref_cls.__module__.startswith("torchrl.")
    assert ours.shape == ref.shape == reward.shape
    torch.testing.assert_close(ours, ref, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "make",
    [
        lambda: rtm.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None),
        lambda: rtm.TD1Estimator(gamma=GAMMA, value_network=None),
        lambda: rtm.Retrace(gamma=GAMMA),
    ],
    ids=["GAE", "TD1-forward", "Retrace"],
)
def test_estimators_that_need_a_time_dim_reject_batch_size_empty(path, make):
    """As TorchRL's: a RuntimeError about the batch dims, not a reshape failure."""
    td = _imagined((6, 5, 1), path.device)
    td.set("state_value", torch.zeros(6, 5, 1, device=path.device))
    est = make()
    with pytest.raises(RuntimeError, match="dim"):
        est(td)


@pytest.mark.parametrize("shape", [(4, 5, 1), (4, 5), (2, 3, 5), (5,)], ids=str)
def test_layout_helpers_take_negative_dims(shape):
    x = torch.arange(torch.Size(shape).numel(), dtype=torch.float32).reshape(shape)
    for dim in range(-len(shape), len(shape)):
        positive = dim % len(shape)
        rows = to_rows(x, dim)
        assert torch.equal(rows, to_rows(x, positive))
        assert rows.shape[-1] == shape[positive]
        assert torch.equal(from_rows(rows, shape, dim), x)
        assert rows_shape(shape, dim) == rows_shape(shape, positive)
    q = torch.randn(*shape, 3)
    for dim in range(-len(shape), len(shape)):
        assert torch.equal(to_rows_actions(q, dim), to_rows_actions(q, dim % len(shape)))
    with pytest.raises(IndexError):
        to_rows(x, len(shape))


# ------------------------------------------------------------------------------------------------
# absent entries


def _rollout(device, batch=(3, 7)) -> TensorDict:
    g = torch.Generator().manual_seed(0)
    shape = (*batch, 1)
    done = torch.rand(shape, generator=g) < 0.2
    return TensorDict(
        {
            "state_value": torch.randn(shape, generator=g),
            "next": {
                "reward": torch.randn(shape, generator=g),
                "state_value": torch.randn(shape, generator=g),
                "done": done,
                "terminated": done.clone(),
            },
        },
        batch,
    ).to(device)


ESTIMATORS = {
    "GAE": lambda: rtm.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None),
    "MultiAgentGAE": lambda: rtm.MultiAgentGAE(gamma=GAMMA, lmbda=LMBDA, value_network=None),
    "TD0Estimator": lambda: rtm.TD0Estimator(gamma=GAMMA, value_network=None),
    "TD1Estimator": lambda: rtm.TD1Estimator(gamma=GAMMA, value_network=None),
    "TDLambdaEstimator": lambda: rtm.TDLambdaEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None),
}
# what each one cannot do without (TD(0), like TorchRL's, reads terminated alone when done is absent)
REQUIRED = {
    "GAE": ["state_value", ("next", "state_value"), ("next", "reward"), ("next", "done")],
    "TD0Estimator": ["state_value", ("next", "state_value"), ("next", "reward")],
}


def _assert_names(err: pytest.ExceptionInfo, key, estimator: str):
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)
    message = str(err.value)
    assert repr(key) in message and message.startswith(f"{estimator}:"), message


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize("call", ["forward", "value_estimate"])
def test_missing_entry_names_key_and_estimator(path, name, call):
    required = REQUIRED.get(name, REQUIRED["GAE"])
    if call == "value_estimate" and name not in ("GAE", "MultiAgentGAE"):
        required = [k for k in required if k != "state_value"]  # TD targets do not read V(s)
    for key in required:
        td = _rollout(path.device)
        td.del_(key)
        est = ESTIMATORS[name]()
        with pytest.raises(MissingEntryError) as err:
            getattr(est, call)(td)
        _assert_names(err, key, name)


def test_td0_reads_terminated_alone(path):
    td = _rollout(path.device)
    td.del_(("next", "done"))
    ours = rtm.TD0Estimator(gamma=GAMMA, value_network=None)(td.clone())
    ref = trl.TD0Estimator(gamma=GAMMA, value_network=None)(td.clone())
    torch.testing.assert_close(ours.get("value_target"), ref.get("value_target"))
    td.del_(("next", "terminated"))
    with pytest.raises(MissingEntryError) as err:
        rtm.TD0Estimator(gamma=GAMMA, value_network=None)(td)
    _assert_names(err, ("next", "done"), "TD0Estimator")


def test_missing_entry_names_renamed_key(path):
    td = _rollout(path.device).rename_key_(("next", "reward"), ("next", "r"))
    est = rtm.TDLambdaEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None)
    est.set_keys(reward="rew")
    with pytest.raises(MissingEntryError) as err:
        est(td)
    _assert_names(err, ("next", "rew"), "TDLambdaEstimator")
    assert "set_keys(reward=...)" in str(err.value)


def test_missing_entry_dreamer_pattern(path):
    """value_estimate on Dreamer's tensordict without its next value."""
    td = _imagined((6, 5, 1), path.device)
    td.del_(("next", "state_value"))
    with pytest.raises(MissingEntryError) as err:
        rtm.TD1Estimator(gamma=GAMMA, value_network=None).value_estimate(td)
    _assert_names(err, ("next", "state_value"), "TD1Estimator")


def test_vtrace_missing_action_and_log_prob(path):
    from tests.modules._rollouts import rollout
    from tests.modules.test_vtrace_module import LOG_MU, add_behaviour, make_actor

    actor = make_actor(device=path.device)
    for key in ("action", LOG_MU):
        td = rollout((3, 7), device=path.device, values=True)
        add_behaviour(td, actor)
        td.del_(key)
        with pytest.raises(MissingEntryError) as err:
            rtm.VTrace(gamma=GAMMA, actor_network=actor, value_network=None)(td)
        _assert_names(err, key, "VTrace")


def test_retrace_missing_entries(path):
    from tests.modules.test_retrace_module import retrace_rollout

    for key in ("action", ("next", "reward"), "action_value", ("next", "action_value"), "target_probs"):
        td = retrace_rollout((3, 7), device=path.device)
        td.del_(key)
        with pytest.raises(MissingEntryError) as err:
            rtm.Retrace(gamma=GAMMA)(td)
        _assert_names(err, key, "Retrace")
