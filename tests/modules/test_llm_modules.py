"""TokenGAE and GroupAdvantage (rl_triton.modules.llm) on the PyTorch path: against rl_triton.llm's functions and
the float64 loop references of tests/llm/reference.py, with TorchRL-style keys."""

from __future__ import annotations

import pytest
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict
from tensordict.nn import TensorDictModule
from torchrl.data import LazyTensorStorage, ReplayBuffer

import rl_triton
import rl_triton.llm as llm
from rl_triton.modules import GroupAdvantage, MissingEntryError, TokenGAE
from tests.llm import reference as ref
from tests.llm.conftest import token_batch

B, T = 6, 11
MASK = ("masks", "all_assistant_mask")


@pytest.fixture(autouse=True)
def _torch_path():
    with rl_triton.use_backend("torch"):
        yield


def _close(a, b, tol=1e-5):
    torch.testing.assert_close(a.double(), b.double(), rtol=tol, atol=tol)


def _td(r, v, m, trailing=True):
    e = (lambda x: x.unsqueeze(-1)) if trailing else (lambda x: x)
    return TensorDict({("next", "reward"): e(r), "state_value": e(v), MASK: m}, [r.shape[0]])


@pytest.mark.parametrize("trailing", [True, False])
def test_token_gae_default_keys(trailing):
    r, v, m = token_batch(B, T, "cpu")
    td = TokenGAE(gamma=0.9, lmbda=0.8)(_td(r, v, m, trailing))
    adv, ret = llm.compute_gae_advantage_return(r, v, m, 0.9, 0.8)
    ref_adv, ref_ret, _ = ref.gae(r, v, m, 0.9, 0.8)
    shape = (B, T, 1) if trailing else (B, T)
    assert td["advantage"].shape == shape and td["value_target"].shape == shape
    _close(td["advantage"].reshape(B, T), adv, 0)
    _close(td["value_target"].reshape(B, T), ret, 0)
    _close(td["advantage"].reshape(B, T), ref_adv)
    _close(td["value_target"].reshape(B, T), ref_ret)


def test_token_gae_no_whiten_per_row_gamma_and_nested_set_keys():
    r, v, m = token_batch(B, T, "cpu", dtype=torch.float64)
    gamma = torch.rand(B, dtype=torch.float64)
    td = TensorDict({("a", "r"): r, ("b", "c", "v"): v, ("b", "m"): m}, [B])
    mod = TokenGAE(gamma=gamma, lmbda=0.7, whiten=False).set_keys(
        reward=("a", "r"), value=("b", "c", "v"), mask=("b", "m"), advantage=("out", "adv"), value_target="vt"
    )
    assert mod.in_keys == [("a", "r"), ("b", "c", "v"), ("b", "m")]
    assert mod.out_keys == [("out", "adv"), "vt"]
    mod(td)
    _, ref_ret, ref_l = ref.gae(r, v, m, gamma, 0.7)
    _close(td["out", "adv"], ref_l, 1e-10)
    _close(td["vt"], ref_ret, 1e-10)
    assert "advantage" not in td.keys()


def test_token_gae_value_network():
    r, v, m = token_batch(B, T, "cpu")
    obs = torch.randn(B, T, 3)
    net = TensorDictModule(torch.nn.Linear(3, 1), in_keys=["obs"], out_keys=["state_value"])
    td = TensorDict({("next", "reward"): r.unsqueeze(-1), MASK: m, "obs": obs}, [B])
    TokenGAE(gamma=1.0, lmbda=0.95, value_network=net)(td)
    with torch.no_grad():
        values = net.module(obs).squeeze(-1)
    adv, ret = llm.compute_gae_advantage_return(r, values, m, 1.0, 0.95)
    _close(td["state_value"].squeeze(-1), values, 0)
    _close(td["advantage"].squeeze(-1), adv, 1e-6)
    _close(td["value_target"].squeeze(-1), ret, 1e-6)
    # an existing value entry is used as it is, not recomputed
    td2 = _td(r, v, m)
    TokenGAE(gamma=1.0, lmbda=0.95, value_network=net)(td2)
    _close(td2["state_value"].squeeze(-1), v, 0)


@pytest.mark.parametrize(("drop", "name"), [(("next", "reward"), "reward"), ("state_value", "value"), (MASK, "mask")])
def test_token_gae_missing_entry(drop, name):
    r, v, m = token_batch(B, T, "cpu")
    td = _td(r, v, m).exclude(drop)
    with pytest.raises(MissingEntryError, match=f"{drop!r}".replace("(", r"\(").replace(")", r"\)")) as err:
        TokenGAE(gamma=0.9, lmbda=0.9)(td)
    assert f"set_keys({name}=" in str(err.value)
    assert isinstance(err.value, KeyError) and isinstance(err.value, ValueError)


def test_set_keys_rejects_unknown_names():
    with pytest.raises(ValueError, match="rewards"):
        TokenGAE().set_keys(rewards="r")
    with pytest.raises(ValueError, match="not a key name"):
        GroupAdvantage().set_keys(prompt="p")
    with pytest.raises(ValueError, match="kind"):
        GroupAdvantage("ppo")


def _group_td(r, m, ids, trailing=True):
    td = TensorDict({("next", "reward"): r.unsqueeze(-1) if trailing else r, MASK: m}, [r.shape[0]])
    if isinstance(ids, torch.Tensor):
        td["query"] = ids
    else:
        td["query"] = NonTensorStack(*(NonTensorData(i) for i in ids))
    return td


@pytest.mark.parametrize("kind", ["grpo", "drgrpo", "rloo"])
def test_group_advantage_kinds(kind):
    r, _, m = token_batch(B + 1, T, "cpu")
    ids = torch.tensor([3, 3, 7, 3, 7, 7, 9])  # groups of 3, 3 and 1
    td = GroupAdvantage(kind)(_group_td(r, m, ids))
    assert td["advantage"].shape == (B + 1, T, 1)
    got = td["advantage"].squeeze(-1)
    if kind == "rloo":
        fn, _ = llm.compute_rloo_outcome_advantage(r, m, ids)
    else:
        fn, _ = llm.compute_grpo_outcome_advantage(r, m, ids, norm_adv_by_std_in_grpo=kind == "grpo")
    _close(got, fn, 0)
    _close(got, ref.outcome(kind, r, m, ids))


def test_group_advantage_string_ids_sequence_rewards_nested_keys():
    m = token_batch(4, T, "cpu")[2]
    score = torch.randn(4)
    ids = ["p0", "p1", "p0", "p1"]
    td = TensorDict({("traj", "score"): score.unsqueeze(-1), ("traj", "mask"): m}, [4])
    td["prompt"] = NonTensorStack(*(NonTensorData(i) for i in ids))
    mod = GroupAdvantage("grpo", epsilon=1e-4).set_keys(
        group="prompt", reward=("traj", "score"), mask=("traj", "mask"), advantage=("traj", "adv")
    )
    assert mod.in_keys == ["prompt", ("traj", "score"), ("traj", "mask")]
    mod(td)
    r = torch.zeros(4, T)
    r[:, 3] = score  # only the per-sequence sum matters
    _close(td["traj", "adv"], ref.outcome("grpo", r, m, ids, epsilon=1e-4))


def test_group_advantage_missing_entry():
    r, _, m = token_batch(4, T, "cpu")
    td = _group_td(r, m, torch.tensor([0, 0, 1, 1]))
    for drop, name in [("query", "group"), (("next", "reward"), "reward"), (MASK, "mask")]:
        with pytest.raises(MissingEntryError, match=f"set_keys\\({name}=") as err:
            GroupAdvantage()(td.exclude(drop))
        assert repr(drop) in str(err.value)


def test_group_advantage_on_replay_buffer_extend():
    r, _, m = token_batch(4, T, "cpu")
    ids = torch.tensor([0, 1, 0, 1])
    rb = ReplayBuffer(storage=LazyTensorStorage(8))
    rb.append_transform(GroupAdvantage("drgrpo"))
    rb.extend(_group_td(r, m, ids))
    stored = rb.storage.get(slice(0, 4))
    _close(stored["advantage"].squeeze(-1), ref.outcome("drgrpo", r, m, ids))
