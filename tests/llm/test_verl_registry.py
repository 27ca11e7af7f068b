"""register_with_verl / unregister_from_verl against a stand-in for verl's registry module (verl itself is not
installed here: scripts/verl_suite.sh tests them in verl)."""

from __future__ import annotations

import sys
import types

import pytest

from rl_triton import llm


@pytest.fixture
def core_algos(monkeypatch):
    mod = types.ModuleType("verl.trainer.ppo.core_algos")
    mod.ADV_ESTIMATOR_REGISTRY = {"gae": "verl gae", "grpo": "verl grpo", "gpg": "verl gpg"}
    for name in ("verl", "verl.trainer", "verl.trainer.ppo"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setattr(sys.modules["verl.trainer.ppo"], "core_algos", mod, raising=False)
    monkeypatch.setitem(sys.modules, "verl.trainer.ppo.core_algos", mod)
    yield mod
    llm.unregister_from_verl()


def test_register_and_undo(core_algos):
    before = dict(core_algos.ADV_ESTIMATOR_REGISTRY)
    names = llm.register_with_verl()
    assert set(names) == {"gae", "grpo", "grpo_vectorized", "rloo", "rloo_vectorized", "reinforce_plus_plus"}
    reg = core_algos.ADV_ESTIMATOR_REGISTRY
    assert reg["gae"] is llm.compute_gae_advantage_return and reg["gpg"] == "verl gpg"
    assert reg["grpo_vectorized"] is reg["grpo"] is llm.compute_grpo_outcome_advantage
    assert reg["reinforce_plus_plus"] is llm.compute_reinforce_plus_plus_outcome_advantage
    llm.register_with_verl(["gae"])  # again: what is restored is still verl's entry
    llm.unregister_from_verl()
    assert reg == before
    llm.unregister_from_verl()  # nothing registered: nothing to do
    assert reg == before


def test_register_errors(core_algos):
    with pytest.raises(ValueError, match="names"):
        llm.register_with_verl(["gae", "vtrace"])
    with pytest.raises(TypeError, match="names"):
        llm.register_with_verl("gae")
    assert "rloo" not in core_algos.ADV_ESTIMATOR_REGISTRY


def test_without_verl(monkeypatch):
    monkeypatch.setitem(sys.modules, "verl", None)  # import verl raises ImportError
    with pytest.raises(ImportError, match="register_with_verl needs verl"):
        llm.register_with_verl()
