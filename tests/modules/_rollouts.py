"""Rollout TensorDicts, critics and comparison helpers for the rl_triton.modules tests.

Rollouts are laid out as TorchRL collectors write them: root entries describe s_t, the "next"
sub-TensorDict holds what the environment returned after acting at step t (reward, done,
terminated, truncated, the next observation). ("next", "done") = terminated | truncated, and
obs[t+1] equals ("next", "obs")[t] unless the episode ended at step t, in which case obs[t+1] is a
fresh reset observation and "is_init" marks it.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

OBS_DIM = 3
# float32 results against TorchRL's float32 results: both accumulate in float32 but in a different
# order (TorchRL convolves with a geometric filter), so allow a few ulps of the largest entry.
ATOL = 1e-5
RTOL = 1e-5

# Batch layouts: (batch_size, time_dim passed to the estimator, dim names or None). time_dim None
# means "let the estimator find it" (the dim named "time", else the last one).
LAYOUTS = {
    "T": ((17,), None, None),
    "T-td0": ((17,), 0, None),
    "BT": ((3, 17), None, None),
    "BT-td1": ((3, 17), 1, None),
    "TB-td0": ((17, 3), 0, None),
    "BTA-td1": ((2, 17, 3), 1, None),
    "BTA-named": ((2, 17, 3), None, (None, "time", None)),
    "TB-named": ((17, 3), None, ("time", None)),
}


def time_axis(batch_size, time_dim, names) -> int:
    """The batch dim that holds time, resolved as TorchRL resolves it."""
    if time_dim is not None:
        return time_dim % len(batch_size)
    if names is not None and "time" in names:
        return names.index("time")
    return len(batch_size) - 1


def _time_last_to(x: torch.Tensor, n_lead: int, axis: int) -> torch.Tensor:
    """Moves the time dim of a time-last layout (at index n_lead) to batch dim `axis`."""
    return x.movedim(n_lead, axis).contiguous()


def rollout(
    batch_size,
    *,
    time_axis_: int | None = None,
    names=None,
    device="cpu",
    p_term: float = 0.12,
    p_trunc: float = 0.12,
    pattern: str = "random",
    reward_key="reward",
    done_key="done",
    terminated_key="terminated",
    truncated: bool = True,
    values: bool = False,
    value_key="state_value",
    is_init: bool = False,
    obs_shape=(OBS_DIM,),
    reward_shape=(1,),
    value_shape=(1,),
) -> TensorDict:
    """A random rollout with consistent observations and done/terminated/truncated flags.

    time_axis_: the batch dim holding time (default: the last). pattern: "random" (independent
    terminations/truncations), "none" (no done), "last" (every row terminated at T-1), "trunc"
    (truncations only). values=True adds precomputed V(s_t) under value_key and V(s_{t+1}) under
    ("next", value_key), consistent across steps within an episode.
    """
    batch_size = tuple(batch_size)
    axis = len(batch_size) - 1 if time_axis_ is None else time_axis_
    T = batch_size[axis]
    lead = batch_size[:axis] + batch_size[axis + 1 :]
    tl = (*lead, T)  # time-last layout
    n = len(lead)
    flag_shape = (*tl, 1)
    u = torch.rand(flag_shape)
    false = torch.zeros(flag_shape, dtype=torch.bool)
    if pattern == "random":
        term, trunc = u < p_term, (u >= p_term) & (u < p_term + p_trunc)
    elif pattern == "none":
        term, trunc = false, false.clone()
    elif pattern == "last":
        term, trunc = false.clone(), false.clone()
        term[..., -1, :] = True
    elif pattern == "trunc":
        term, trunc = false, u < 2 * p_trunc
    else:
        raise ValueError(pattern)
    done = term | trunc
    ended = done.squeeze(-1)  # (*lead, T)

    def carry(first_and_reset: torch.Tensor, nxt: torch.Tensor) -> torch.Tensor:
        """x[t+1] = nxt[t] within an episode, a fresh value after a done step."""
        e = ended.reshape(*ended.shape, *([1] * (nxt.dim() - ended.dim())))
        shifted = torch.where(e, first_and_reset, nxt).narrow(n, 0, T - 1)
        return torch.cat([first_and_reset.narrow(n, 0, 1), shifted], dim=n)

    next_obs = torch.randn(*tl, *obs_shape)
    obs = carry(torch.randn(*tl, *obs_shape), next_obs)
    init = torch.zeros(*tl, 1, dtype=torch.bool)
    init[..., 0, :] = True
    init[..., 1:, :] = done[..., :-1, :]

    root = {"obs": obs}
    nxt = {
        "obs": next_obs,
        reward_key: torch.randn(*tl, *reward_shape),
        done_key: done,
        terminated_key: term,
    }
    if truncated:
        nxt["truncated"] = trunc
    if is_init:
        root["is_init"] = init
        nxt["is_init"] = torch.zeros_like(init)
    if values:
        v_next = torch.randn(*tl, *value_shape)
        root[value_key] = carry(torch.randn(*tl, *value_shape), v_next)
        nxt[value_key] = v_next
    td = TensorDict(
        {
            **{k: _time_last_to(x, n, axis) for k, x in root.items()},
            "next": TensorDict({k: _time_last_to(x, n, axis) for k, x in nxt.items()}, batch_size),
        },
        batch_size,
    )
    if names is not None:
        td.refine_names(*names)
    return td.to(device)


def critic(device="cpu", value_key="state_value", in_dim=OBS_DIM, in_key="obs") -> TensorDictModule:
    """A small linear critic V(s) = w.s + b."""
    return TensorDictModule(nn.Linear(in_dim, 1), in_keys=[in_key], out_keys=[value_key]).to(device)


class _EpisodeMeanCritic(nn.Module):
    """V(s_t) = Linear(running mean of obs since the episode start): a recurrent-style critic.

    Its loop over time and Python branching on the data (`if is_init[..., t, :].any()`) cannot run
    under torch.vmap, which is what deactivate_vmap=True is for. Time is the last batch dim.
    """

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(OBS_DIM, 1)

    def forward(self, obs, is_init):
        outs = []
        acc = torch.zeros_like(obs[..., 0, :])
        count = torch.zeros_like(obs[..., 0, :1])
        for t in range(obs.shape[-2]):
            start = is_init[..., t, :]
            if bool(start.any()):  # data-dependent control flow: not vmap-able
                acc = torch.where(start, torch.zeros_like(acc), acc)
                count = torch.where(start, torch.zeros_like(count), count)
            acc = acc + obs[..., t, :]
            count = count + 1
            outs.append(self.lin(acc / count))
        return torch.stack(outs, dim=-2)


def recurrent_critic(device="cpu", value_key="state_value") -> TensorDictModule:
    return TensorDictModule(_EpisodeMeanCritic(), in_keys=["obs", "is_init"], out_keys=[value_key]).to(device)


def clone_pair(td: TensorDictBase) -> tuple[TensorDictBase, TensorDictBase]:
    """Two independent deep copies (names kept) for running ours and TorchRL's on the same data."""
    return td.clone(), td.clone()


def assert_tensor_close(actual: torch.Tensor, expected: torch.Tensor, *, atol=ATOL, rtol=RTOL, what=""):
    """Same shape, dtype and device; values within atol (scaled by the largest |expected|) + rtol."""
    assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual)}"
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    assert actual.device == expected.device, f"{what}: device {actual.device} != {expected.device}"
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    assert not torch.isnan(a).any(), f"{what}: NaN in the output"
    scale = max(1.0, e.abs().max().item()) if e.numel() else 1.0
    torch.testing.assert_close(a, e, atol=atol * scale, rtol=rtol, msg=lambda m: f"{what}: {m}")


def assert_td_close(ours: TensorDictBase, ref: TensorDictBase, keys=None, *, atol=ATOL, rtol=RTOL):
    """Both TensorDicts hold the same entries (all of them, or `keys`) with the same values."""
    if keys is None:
        ours_keys = set(ours.keys(True, True))
        ref_keys = set(ref.keys(True, True))
        assert ours_keys == ref_keys, (
            f"entries differ: only ours {ours_keys - ref_keys}, only TorchRL's {ref_keys - ours_keys}"
        )
        keys = sorted(ref_keys, key=str)
    for key in keys:
        assert key in ours.keys(True, True), f"{key!r} missing from our output"
        e = ref.get(key)
        a = ours.get(key)
        if e.dtype == torch.bool or not e.is_floating_point():
            assert a.dtype == e.dtype and torch.equal(a, e), f"{key!r}: {a} != {e}"
        else:
            assert_tensor_close(a, e, atol=atol, rtol=rtol, what=repr(key))


def grads(tensors) -> list:
    return [None if t.grad is None else t.grad.detach().clone() for t in tensors]


def assert_grads_close(ours: list, ref: list, *, atol=ATOL, rtol=RTOL, names=None):
    assert len(ours) == len(ref)
    for i, (a, e) in enumerate(zip(ours, ref, strict=True)):
        what = f"grad of {names[i] if names else i}"
        if e is None:
            assert a is None or not a.any(), f"{what}: TorchRL gives no gradient, ours is {a}"
            continue
        assert a is not None, f"{what}: TorchRL has a gradient, ours has none"
        assert_tensor_close(a, e, atol=atol, rtol=rtol, what=what)


def run_pair(ours_cls, ref_cls, td: TensorDictBase, *, keys=None, call=None, **kwargs):
    """Builds ours and TorchRL's estimator with the same arguments (and set_keys), runs each on its
    own clone of `td`, and returns (ours_out, ref_out, ours_module, ref_module). The forward must
    return the TensorDict it was given, as TorchRL's does."""
    ours, ref = ours_cls(**kwargs), ref_cls(**kwargs)
    if keys:
        ours.set_keys(**keys)
        ref.set_keys(**keys)
    td_ours, td_ref = clone_pair(td)
    out_ours = ours(td_ours, **(call or {}))
    out_ref = ref(td_ref, **(call or {}))
    assert out_ref is td_ref
    assert out_ours is td_ours, "forward must write into and return the input TensorDict"
    return out_ours, out_ref, ours, ref
