"""rl_triton.modules.Reward2GoTransform against torchrl.envs.transforms.Reward2GoTransform.

Both are inverse-only transforms: they run on data written into a replay buffer (``t.inv(td)``,
``ReplayBuffer(transform=t).extend(td)``) or as a collector's ``postproc``.
"""

import inspect

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs.transforms import Reward2GoTransform as TorchRLReward2Go

from rl_triton.modules import Reward2GoTransform
from tests.modules._rollouts import assert_td_close, assert_tensor_close


def episodes(batch_size, pattern, device, *, reward_key="reward", done_key="done", p=0.2):
    """Rewards and done flags under "next"; every row has at least one done (TorchRL requires it)."""
    T = batch_size[-1]
    if pattern == "random":
        done = torch.rand(*batch_size, 1) < p
        done[..., T // 2, :] = True  # at least one episode end per row
    elif pattern == "ends-at-last":
        done = torch.rand(*batch_size, 1) < p
        done[..., -1, :] = True
    elif pattern == "only-last":
        done = torch.zeros(*batch_size, 1, dtype=torch.bool)
        done[..., -1, :] = True
    elif pattern == "every-step":
        done = torch.ones(*batch_size, 1, dtype=torch.bool)
    elif pattern == "first-step":  # one step, then a partial episode that runs off the end
        done = torch.zeros(*batch_size, 1, dtype=torch.bool)
        done[..., 0, :] = True
    else:
        raise ValueError(pattern)
    trunc = done & (torch.rand(*batch_size, 1) < 0.3)
    nxt = {reward_key: torch.randn(*batch_size, 1), done_key: done, "terminated": done & ~trunc, "truncated": trunc}
    return TensorDict({"obs": torch.randn(*batch_size, 3), "next": nxt}, batch_size, device=device)


def test_same_constructor():
    ours = inspect.signature(Reward2GoTransform.__init__).parameters
    theirs = inspect.signature(TorchRLReward2Go.__init__).parameters
    assert list(ours) == list(theirs)
    assert all(ours[k].default == theirs[k].default for k in theirs)
    t = Reward2GoTransform(gamma=0.9)
    r = TorchRLReward2Go(gamma=0.9)
    assert t.in_keys_inv == r.in_keys_inv and t.out_keys_inv == r.out_keys_inv and t.done_key == r.done_key


@pytest.mark.parametrize("gamma", [0.5, 0.9, 0.99, 1.0])
@pytest.mark.parametrize("pattern", ["random", "ends-at-last", "only-last", "every-step", "first-step"])
def test_inv_parity(path, gamma, pattern, rl_triton_calls):
    td = episodes((3, 29), pattern, path.device)
    out_keys = ["reward_to_go"]
    ours = Reward2GoTransform(gamma=gamma, out_keys=out_keys).inv(td.clone())
    ref = TorchRLReward2Go(gamma=gamma, out_keys=out_keys).inv(td.clone())
    assert_td_close(ours, ref)
    assert sum(rl_triton_calls.values()) > 0, "no rl_triton function ran"


@pytest.mark.parametrize("batch_size", [(31,), (3, 29), (2, 3, 17)], ids=["T", "BT", "BBT"])
def test_batch_shapes(path, batch_size):
    td = episodes(batch_size, "random", path.device)
    ours = Reward2GoTransform(gamma=0.95).inv(td.clone())
    ref = TorchRLReward2Go(gamma=0.95).inv(td.clone())
    assert_td_close(ours, ref)


def test_in_place_default_keys(path):
    """Default keys: ("next", "reward") is replaced by its reward-to-go."""
    td = episodes((3, 29), "random", path.device)
    ours = Reward2GoTransform(gamma=0.9).inv(td.clone())
    ref = TorchRLReward2Go(gamma=0.9).inv(td.clone())
    assert_td_close(ours, ref)
    assert not torch.equal(ours["next", "reward"], td["next", "reward"])


def test_keys_and_tensor_gamma(path):
    """Several in/out keys, a renamed done entry, gamma as a tensor."""
    td = episodes((3, 29), "random", path.device, reward_key="r1", done_key="my_done")
    td["next", "r2"] = torch.randn(3, 29, 1, device=path.device)
    kw = {
        "gamma": torch.tensor(0.97),
        "in_keys": [("next", "r1"), ("next", "r2")],
        "out_keys": ["r2go_1", ("stats", "r2go_2")],
        "done_key": "my_done",
    }
    ours = Reward2GoTransform(**kw).inv(td.clone())
    ref = TorchRLReward2Go(**kw).inv(td.clone())
    assert_td_close(ours, ref)


def test_replay_buffer(path):
    """As a replay-buffer transform: what extend() stores is identical."""
    td = episodes((4, 25), "random", path.device)
    stored = []
    for cls in (Reward2GoTransform, TorchRLReward2Go):
        rb = ReplayBuffer(storage=LazyTensorStorage(16, device=path.device), transform=cls(0.99, out_keys=["r2go"]))
        rb.extend(td.clone())
        stored.append(rb[:])
    assert_td_close(stored[0], stored[1])


def test_float64(path):
    td = episodes((3, 29), "random", path.device)
    td["next", "reward"] = td["next", "reward"].double()
    ours = Reward2GoTransform(gamma=torch.tensor(0.9, dtype=torch.float64)).inv(td.clone())
    ref = TorchRLReward2Go(gamma=torch.tensor(0.9, dtype=torch.float64)).inv(td.clone())
    assert ours["next", "reward"].dtype == torch.float64
    assert_td_close(ours, ref, atol=1e-10, rtol=1e-10)


def test_gradients(path):
    """The reward-to-go is differentiable in the rewards, as TorchRL's is."""
    td = episodes((3, 29), "random", path.device)
    w = torch.randn(3, 29, 1, device=path.device)
    got = []
    for cls in (Reward2GoTransform, TorchRLReward2Go):
        data = td.clone()
        r = data["next", "reward"].requires_grad_()
        out = cls(gamma=0.9, out_keys=["r2go"]).inv(data)
        (out["r2go"] * w).sum().backward()
        got.append((out["r2go"], r.grad))
    assert_tensor_close(got[0][0], got[1][0], what="reward-to-go")
    assert_tensor_close(got[0][1], got[1][1], what="grad of reward")


def test_gamma_zero_returns_the_reward(path):
    """Documented fix: TorchRL 0.14 returns zeros for gamma=0; the reward-to-go is the reward."""
    td = episodes((3, 29), "random", path.device)
    ours = Reward2GoTransform(gamma=0.0, out_keys=["r2go"]).inv(td.clone())
    assert_tensor_close(ours["r2go"], td["next", "reward"], what="reward-to-go")


def test_same_errors_and_forward(path):
    no_done = episodes((2, 9), "random", path.device)
    no_done["next", "done"] = torch.zeros_like(no_done["next", "done"])
    for cls in (Reward2GoTransform, TorchRLReward2Go):
        with pytest.raises(RuntimeError):  # a row with no episode end
            cls(gamma=0.9).inv(no_done.clone())
        with pytest.raises(KeyError):  # none of the in_keys present
            cls(gamma=0.9, in_keys=[("next", "missing")]).inv(episodes((2, 9), "random", path.device))
        td = episodes((2, 9), "random", path.device)
        assert cls(gamma=0.9)(td.clone()).get(("next", "reward")).equal(td["next", "reward"])  # forward: identity
