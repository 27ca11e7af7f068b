"""The estimators' fast path against their general path.

``est(tensordict)`` without a value network, on a TensorDict whose value / next value / reward /
done / terminated entries are plain tensors of one shape, runs without TorchRL's decorators and
shifted-tensordict copies (``_fast_forward``). Everything else takes the decorated, general forward
(``_forward``); V-trace and Retrace have the decorated path alone. These tests check that the fast
path writes exactly what the general path writes (bit for bit), that it hands over every case it
does not cover, and that it keeps TorchRL's grad mode, keys (``set_keys``, nested keys) and errors.
"""

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict

from rl_triton.modules import GAE, MultiAgentGAE, TD0Estimator, TD1Estimator, TDLambdaEstimator

GAMMA, LMBDA = 0.95, 0.9

ESTIMATORS = {
    "GAE": lambda **kw: GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None, **kw),
    "MAGAE": lambda **kw: MultiAgentGAE(gamma=GAMMA, lmbda=LMBDA, value_network=None, **kw),
    "TD0": lambda **kw: TD0Estimator(gamma=GAMMA, value_network=None, **kw),
    "TD1": lambda **kw: TD1Estimator(gamma=GAMMA, value_network=None, **kw),
    "TDLambda": lambda **kw: TDLambdaEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None, **kw),
}


def _td(batch=(3, 11), feature=(1,), dtype=torch.float32, device="cpu", seed=0) -> TensorDict:
    """Values, next values, rewards and flags of shape batch + feature (time = the last batch dim)."""
    g = torch.Generator().manual_seed(seed)
    shape = (*batch, *feature)

    def f():
        return torch.randn(shape, generator=g).to(dtype)

    term = torch.rand(shape, generator=g) < 0.15
    trunc = (torch.rand(shape, generator=g) < 0.15) & ~term
    nxt = {"reward": f(), "state_value": f(), "done": term | trunc, "terminated": term, "truncated": trunc}
    return TensorDict({"state_value": f(), "next": nxt}, batch).to(device)


class _Spy:
    """Counts calls of an estimator's general path (its decorated ``_forward``)."""

    def __init__(self, est):
        self.calls = 0
        general = est._forward

        def counted(*args, **kwargs):
            self.calls += 1
            return general(*args, **kwargs)

        est._forward = counted


def _assert_same(a: TensorDict, b: TensorDict, one_ulp: tuple = ()):
    """Bit for bit, but the keys of ``one_ulp``, compared to one bfloat16 ulp: the TD estimators'
    fast paths take ``G - V`` from the kernel, rounded there as the general path's subtraction rounds
    it on the GPU and the CPU, but Triton's interpreter casts float32 to bfloat16 toward zero."""
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        x, y = a.get(key), b.get(key)
        assert x.shape == y.shape and x.dtype == y.dtype and x.requires_grad == y.requires_grad, key
        tol = 2**-7 if key in one_ulp else 0
        torch.testing.assert_close(x, y, rtol=tol, atol=0, equal_nan=True, msg=lambda m, k=key: f"{k}: {m}")


def _run_both(est, td, **call):
    """(fast output, general output, whether the first call took the general path)."""
    general = est._forward(td.clone(), **call)
    spy = _Spy(est)
    fast = est(td.clone(), **call)
    return fast, general, spy.calls > 0


@pytest.mark.parametrize("name", list(ESTIMATORS))
@pytest.mark.parametrize(
    "batch, feature",
    [((11,), (1,)), ((3, 11), (1,)), ((3, 11), ()), ((2, 3, 11), (1,)), ((3, 1), (1,)), ((1, 11), ())],
    ids=["T", "BT", "BT-no-feature", "BBT", "BT-one-step", "one-env"],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_fast_path_equals_general_path(path, name, batch, feature, dtype):
    est = ESTIMATORS[name]()
    fast, general, fell_back = _run_both(est, _td(batch, feature, dtype, path.device))
    assert not fell_back, "the common case should take the fast path"
    interpreted_bf16 = path.name == "interpret" and dtype == torch.bfloat16 and name in ("TD0", "TD1", "TDLambda")
    _assert_same(fast, general, one_ulp=("advantage",) if interpreted_bf16 else ())
    assert "advantage" in fast.keys() and "value_target" in fast.keys()


@pytest.mark.parametrize("name", ["GAE", "TD1", "TDLambda"])
def test_fast_path_repeated_calls_and_other_shapes(path, name):
    """Cached key paths, scalars and validation entries do not leak from one signature to another."""
    est = ESTIMATORS[name]()
    for batch in [(3, 11), (3, 11), (5, 7), (3, 11), (4,)]:
        fast, general, fell_back = _run_both(est, _td(batch, device=path.device, seed=sum(batch)))
        assert not fell_back
        _assert_same(fast, general)


def _with_steps(td):
    td.set("steps_to_next_obs", torch.ones(td.batch_size + (1,), dtype=torch.long, device=td.device))
    return td


def _with_valid(td):
    td.set("shifted_valid", torch.ones(td.batch_size + (1,), dtype=torch.bool, device=td.device))
    return td


def _reward_float64(td):
    td.set(("next", "reward"), td.get(("next", "reward")).double())
    return td


def _reward_unbroadcast(td):
    td.set(("next", "reward"), td.get(("next", "reward")).squeeze(-1))
    return td


def _done_int(td):
    td.set(("next", "done"), td.get(("next", "done")).squeeze(-1))
    return td


def _value_subclass(td):
    class Sub(torch.Tensor):
        pass

    td.set("state_value", td.get("state_value").as_subclass(Sub))
    return td


# (id, estimator kwargs, tensordict edit): calls the fast path must hand to the general path
GENERAL_CASES = [
    ("steps_to_next_obs", {}, _with_steps),
    ("shifted_valid", {}, _with_valid),
    ("reward-float64", {}, _reward_float64),
    ("reward-unbroadcast", {}, _reward_unbroadcast),
    ("done-other-shape", {}, _done_int),
    ("value-subclass", {}, _value_subclass),
    ("gamma-above-1", {"gamma": 1.5}, None),
    ("tensor-gamma-grad", {"gamma": torch.tensor(0.9, requires_grad=True)}, None),
    ("time-dim-first", {"time_dim": 0}, None),
]


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor:UserWarning")  # TorchRL copying a tensor gamma
@pytest.mark.parametrize("name", ["GAE", "TD0", "TD1", "TDLambda"])
@pytest.mark.parametrize("kwargs, edit", [pytest.param(k, e, id=i) for i, k, e in GENERAL_CASES])
def test_general_cases(path, name, kwargs, edit):
    if name == "TD0" and "time_dim" in kwargs:
        pytest.skip("TD(0) is elementwise: any time dim takes the fast path")
    kwargs = {k: v.to(path.device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    if name != "GAE" and "gamma" in kwargs:
        kwargs = {"gamma": kwargs["gamma"]}
    make = {
        "GAE": lambda **kw: GAE(**{"gamma": GAMMA, "lmbda": LMBDA, "value_network": None, **kw}),
        "TD0": lambda **kw: TD0Estimator(**{"gamma": GAMMA, "value_network": None, **kw}),
        "TD1": lambda **kw: TD1Estimator(**{"gamma": GAMMA, "value_network": None, **kw}),
        "TDLambda": lambda **kw: TDLambdaEstimator(**{"gamma": GAMMA, "lmbda": LMBDA, "value_network": None, **kw}),
    }[name]
    est = make(**kwargs)
    td = _td(device=path.device)
    if edit is not None:
        td = edit(td)
    try:
        general = est._forward(td.clone())
    except Exception as err:  # noqa: BLE001 - the general path's error must be the fast path's too
        with pytest.raises(type(err)):
            est(td.clone())
        return
    spy = _Spy(est)
    fast = est(td.clone())
    if not (isinstance(kwargs.get("gamma"), torch.Tensor) and not est.gamma.requires_grad):  # TD: a plain copy
        assert spy.calls == 1, "this case must take the general path"
    _assert_same(fast, general)


@pytest.mark.parametrize("name", ["GAE", "TD0", "TD1", "TDLambda"])
def test_options_handled_by_the_general_path(path, name):
    """average_gae is computed on the fast path; auto_reset_env, average_rewards, a value network,
    the keyword call form and other tensordict types take the general one, with the same numbers."""
    td = _td(device=path.device)
    if name == "GAE":
        est = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None, average_gae=True)
        fast, general, fell_back = _run_both(est, td)
        assert not fell_back
        _assert_same(fast, general)
        est = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None, auto_reset_env=True)
    else:
        est = ESTIMATORS[name](average_rewards=True)
    fast, general, fell_back = _run_both(est, td)
    assert fell_back
    _assert_same(fast, general)

    est = ESTIMATORS[name]()
    lazy = LazyStackedTensorDict.lazy_stack([td[0], td[1], td[2]], 0)
    spy = _Spy(est)
    out = est(lazy.clone())
    assert spy.calls == 1
    _assert_same(out.to_tensordict(), est._forward(lazy.clone()).to_tensordict())


@pytest.mark.parametrize("name", ["GAE", "TD1", "TDLambda"])
def test_set_keys_and_nested_keys(path, name):
    """Renamed and nested entries, read and written by the fast path; keys changed between calls
    (set_keys, or assigning a field of tensor_keys) are picked up by the next call."""
    est = ESTIMATORS[name]()
    td = _td(device=path.device)
    renamed = TensorDict(
        {
            "agents": {"v": td.get("state_value")},
            "next": {
                "r": td.get(("next", "reward")),
                "d": td.get(("next", "done")),
                "t": td.get(("next", "terminated")),
                "agents": {"v": td.get(("next", "state_value"))},
            },
        },
        td.batch_size,
    )
    est.set_keys(
        value=("agents", "v"), reward="r", done="d", terminated="t", advantage="adv", value_target=("out", "vt")
    )
    fast, general, fell_back = _run_both(est, renamed)
    assert not fell_back
    _assert_same(fast, general)
    assert "adv" in fast.keys() and ("out", "vt") in fast.keys(True)

    reference = ESTIMATORS[name]()(td.clone())
    torch.testing.assert_close(fast.get("adv"), reference.get("advantage"), rtol=0, atol=0)

    # a field assigned in place: the next call reads the new key
    renamed.set(("next", "r2"), renamed.get(("next", "r")) * 2)
    est.tensor_keys.reward = "r2"
    fast, general, fell_back = _run_both(est, renamed)
    assert not fell_back
    _assert_same(fast, general)
    assert not torch.equal(fast.get("adv"), reference.get("advantage"))


def test_missing_and_locked(path):
    est = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None)
    td = _td(device=path.device)
    missing = td.clone()
    missing.del_("state_value")
    with pytest.raises(ValueError, match="state_value"):
        est(missing)
    locked = td.clone().lock_()
    with pytest.raises(RuntimeError, match="locked"):
        est(locked)
    assert "advantage" not in locked.keys()


def test_non_contiguous_entries(path):
    """Strided views (a slice of a wider tensor) give the same numbers on both paths."""
    est = GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None)
    td = _td(device=path.device)
    wide = torch.randn(3, 11, 2, device=path.device)
    td.set("state_value", wide[..., :1])
    fast, general, _ = _run_both(est, td)
    _assert_same(fast, general)
    td.set("state_value", torch.randn(11, 3, 1, device=path.device).transpose(0, 1))
    fast, general, _ = _run_both(est, td)
    _assert_same(fast, general)


@pytest.mark.parametrize("name", ["GAE", "TD0", "TD1", "TDLambda"])
@pytest.mark.parametrize("differentiable", [False, True])
@pytest.mark.parametrize("grad_mode", [False, True], ids=["no_grad", "enable_grad"])
def test_grad_mode(path, name, differentiable, grad_mode):
    """Values that require grad: outputs carry a graph exactly when TorchRL's decorated forward
    (set_grad_enabled(differentiable)) gives one, and its gradients are the same."""
    est = ESTIMATORS[name](differentiable=differentiable)
    td = _td(device=path.device)
    outs = []
    for run in (est, est._forward):
        value = td.get("state_value").clone().requires_grad_(True)
        reward = td.get(("next", "reward")).clone().requires_grad_(True)
        data = td.clone()
        data.set("state_value", value)
        data.set(("next", "reward"), reward)
        with torch.set_grad_enabled(grad_mode):
            out = run(data)
        adv = out.get("advantage")
        grads = None
        if adv.requires_grad:
            grads = torch.autograd.grad(adv.sum() + out.get("value_target").square().sum(), [value, reward])
        outs.append((adv.requires_grad, out.get("value_target").requires_grad, adv.detach(), grads))
    (ra, rv, a, ga), (rb, rvb, b, gb) = outs
    assert (ra, rv) == (rb, rvb) == (differentiable, differentiable)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    if ga is not None:
        for x, y in zip(ga, gb, strict=True):
            torch.testing.assert_close(x, y)


def test_multi_agent_gae_team_signals_take_the_general_path(path):
    """Team-level rewards broadcast over the agent dim: MultiAgentGAE's own broadcast (general path)."""
    est = MultiAgentGAE(gamma=GAMMA, lmbda=LMBDA, value_network=None)
    td = _td((3, 11), (4, 1), device=path.device)
    for key in ("reward", "done", "terminated"):
        td.set(("next", key), td.get(("next", key))[..., :1, :].squeeze(-2))
    fast, general, fell_back = _run_both(est, td)
    assert fell_back
    _assert_same(fast, general)


def test_overridden_hook_keeps_the_general_path(path):
    class Custom(GAE):
        def _signals(self, data):
            reward, done, terminated = super()._signals(data)
            return reward * 2, done, terminated

    est = Custom(gamma=GAMMA, lmbda=LMBDA, value_network=None)
    fast, general, fell_back = _run_both(est, _td(device=path.device))
    assert fell_back
    _assert_same(fast, general)


def test_td0_boundary_flags_are_reused_not_shared_across_modes(path):
    est = TD0Estimator(gamma=GAMMA, value_network=None)
    for batch in [(3, 11), (3, 11), (2, 5)]:
        fast, general, _ = _run_both(est, _td(batch, device=path.device))
        _assert_same(fast, general)
    with torch.inference_mode():
        fast, general, _ = _run_both(est, _td(device=path.device))
    _assert_same(fast, general)
    fast, general, _ = _run_both(est, _td(device=path.device))
    _assert_same(fast, general)
    assert not est.__dict__["_rlt_all_steps"][1].is_inference()
