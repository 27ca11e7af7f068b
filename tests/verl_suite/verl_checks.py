"""rl_triton against verl's own functions, as verl's trainer calls them: the registry and the masked statistics.

Run by ``scripts/verl_suite.sh`` with :mod:`tests.verl_suite.plugin` loaded (it keeps verl's functions in
``plugin.VERL``); not part of our own test run (the file name is not collected). verl 0.9.1's release ships no
tests of the masked statistics, so these compare rl_triton's with verl's on fresh random inputs and edge cases.
"""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch
import verl.trainer.ppo.core_algos as core_algos

from rl_triton import llm
from tests.verl_suite import plugin

# verl's name of each estimator rl_triton has, and verl's function it stands for
NAMES = {
    "gae": "compute_gae_advantage_return",
    "grpo": "compute_grpo_outcome_advantage",
    "grpo_vectorized": "compute_grpo_vectorized_outcome_advantage",
    "rloo": "compute_rloo_outcome_advantage",
    "rloo_vectorized": "compute_rloo_vectorized_outcome_advantage",
    "reinforce_plus_plus": "compute_reinforce_plus_plus_outcome_advantage",
}


@pytest.fixture
def registry(monkeypatch):
    """verl's registry as imported (verl's own registry tests replace it with a dict of their own)."""
    fresh = dict(plugin.VERL_REGISTRY)
    monkeypatch.setattr(core_algos, "ADV_ESTIMATOR_REGISTRY", fresh)
    yield fresh
    llm.unregister_from_verl()


def _batch(b=12, t=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(b, t, generator=g)
    v = torch.randn(b, t, generator=g)
    lens = torch.randint(1, t + 1, (b,), generator=g)
    m = ((torch.arange(t) < lens[:, None]) & (torch.rand(b, t, generator=g) > 0.25)).float()
    m[:, 0] = 1.0
    uids = [str(uuid.UUID(int=i % 4)) for i in range(b)]  # four prompts, as verl's string uids
    return r * m, v, m, np.array(uids, dtype=object)


def _trainer_kwargs(name, r, v, m, index):
    """The keyword call verl's trainer makes (compute_advantage: GAE directly, the others by the registry)."""
    config = core_algos.AlgoConfig(gamma=0.97, lam=0.95)
    if name == "gae":
        return dict(token_level_rewards=r, values=v, response_mask=m, gamma=config.gamma, lam=config.lam)
    return dict(token_level_rewards=r, response_mask=m, config=config, index=index)


def _verl_function(name):
    return plugin.VERL.get(NAMES[name]) or getattr(core_algos, NAMES[name])


def test_registry_serves_rl_triton(registry):
    assert sorted(llm.register_with_verl()) == sorted(NAMES)
    r, v, m, index = _batch()
    for name in NAMES:
        fn = core_algos.get_adv_estimator_fn(name)
        assert fn is getattr(llm, NAMES[name].replace("_vectorized", ""))
        kwargs = _trainer_kwargs(name, r, v, m, index)
        with torch.no_grad():
            ours, theirs = plugin._wrap(name, fn)(**kwargs), _verl_function(name)(**kwargs)
        for a, b in zip(ours, theirs, strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4)


def test_unregister_restores_verl(registry):
    before = dict(registry)
    llm.register_with_verl(["grpo", "reinforce_plus_plus"])
    assert core_algos.get_adv_estimator_fn("grpo") is llm.compute_grpo_outcome_advantage
    llm.register_with_verl()
    llm.unregister_from_verl()
    assert registry == before
    with pytest.raises(ValueError, match="names"):
        llm.register_with_verl(["vtrace"])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_masked_statistics_match_verl(seed):
    _, v, m, _ = _batch(seed=seed)
    ours = plugin._wrap("masked_whiten", llm.masked_whiten)(v, m), plugin._wrap("masked_mean", llm.masked_mean)(v, m)
    torch.testing.assert_close(ours[0], plugin.VERL["masked_whiten"](v, m), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours[1], plugin.VERL["masked_mean"](v, m), atol=1e-6, rtol=1e-5)
    rows = plugin._wrap("masked_mean", llm.masked_mean)(v, m, axis=-1)
    torch.testing.assert_close(rows, plugin.VERL["masked_mean"](v, m, axis=-1), atol=1e-6, rtol=1e-5)
    for unbiased in (True, False):
        ours = plugin._wrap("masked_var", llm.masked_var)(v, m, unbiased=unbiased)
        torch.testing.assert_close(ours, plugin.VERL["masked_var"](v, m, unbiased=unbiased), atol=1e-6, rtol=1e-5)


def test_masked_statistics_empty_as_verl():
    v, m = torch.randn(3, 5), torch.zeros(3, 5)
    m[0, 1] = 1.0  # one row of one token, two empty rows
    for args in ((v, torch.zeros_like(m)), (v, m, -1)):
        ours = plugin._wrap("masked_mean", llm.masked_mean)(*args)
        torch.testing.assert_close(ours, plugin.VERL["masked_mean"](*args), atol=1e-6, rtol=1e-6)
    empty = torch.zeros_like(m)
    assert plugin._wrap("masked_var", llm.masked_var)(v, empty, unbiased=False).item() == 0.0
    assert plugin.VERL["masked_var"](v, empty, unbiased=False).item() == 0.0
    for mask in (empty, m):  # unbiased with n = 0 or 1: both raise ValueError
        for fn in (plugin.VERL["masked_var"], llm.masked_var):
            with pytest.raises(ValueError):
                fn(v, mask)
