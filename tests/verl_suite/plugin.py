"""A pytest plugin that runs verl's own tests of its advantage estimators with rl_triton's functions in place.

Loaded by ``scripts/verl_suite.sh`` (``-p tests.verl_suite.plugin``) into a pytest run over verl's test files
(``tests/trainer/ppo/`` of the installed release) and ``tests/verl_suite/verl_checks.py``; not collected by our
own test run. Before any test file is imported it

* imports verl's ``core_algos`` and ``torch_functional`` (through :mod:`tests.verl_suite.stubs` when
  ``RL_TRITON_VERL_STUBS=1``: verl's other modules and its heavy dependencies replaced by stand-ins);
* replaces verl's GAE, GRPO, RLOO and REINFORCE++ functions and its masked statistics by rl_triton's, keeping
  verl's own in :data:`VERL` (and its registry in :data:`VERL_REGISTRY`) for the checks to compare with. verl's
  vectorized GRPO and RLOO stay verl's: its equivalence tests then compare rl_triton with them;
* with ``RL_TRITON_VERL_DEVICE=cuda``, runs rl_triton's functions on the GPU: tensor arguments are moved there
  and the results moved back to the device of the inputs, so verl's CPU-tensor tests exercise the GPU kernels;
* counts the calls of rl_triton's functions, reports them, and fails the session if there was none;
* judges the failures of verl's equivalence tests (:data:`SUM_ORDER`) against a float64 evaluation: one where
  rl_triton's largest error is no larger than the larger of verl's two implementations' is a sum taken in
  another order, and becomes an expected failure (``xfail``) that says so with the numbers. Any other failure
  stays a failure.
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import os
import random
import sys

import numpy as np
import pytest
import torch

ESTIMATORS = (
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
)
STATISTICS = ("masked_mean", "masked_var", "masked_whiten")

# verl's tests of one function against its vectorized twin, at float32 tolerances (rtol 1e-5, atol 1e-6) on
# sums of up to 512 tokens: a row sum in another order moves a result by a few float32 ulps of the sum.
# test name -> (the kind for tests.llm.reference.outcome, verl's functions: the one we replace, its twin)
SUM_ORDER = {
    "test_rloo_and_vectorized_equivalence": (
        "rloo", "compute_rloo_outcome_advantage", "compute_rloo_vectorized_outcome_advantage"),
    "test_grpo_and_vectorized_equivalence": (
        "grpo", "compute_grpo_outcome_advantage", "compute_grpo_vectorized_outcome_advantage"),
}  # fmt: skip

VERL: dict = {}  # verl's own functions, by name
VERL_REGISTRY: dict = {}  # verl's estimator registry as imported
CALLS: collections.Counter = collections.Counter()


def device() -> str:
    return os.environ.get("RL_TRITON_VERL_DEVICE", "cpu")


def _move(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, tuple):
        return tuple(_move(y, dev) for y in x)
    return x


def _wrap(name: str, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        CALLS[name] += 1
        dev = device()
        if dev == "cpu":
            return fn(*args, **kwargs)
        home = next((a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        out = fn(*_move(args, dev), **{k: _move(v, dev) for k, v in kwargs.items()})
        return _move(out, home) if home is not None else out

    return call


def _import_verl():
    if os.environ.get("RL_TRITON_VERL_STUBS") == "1":
        from . import stubs

        spec = importlib.util.find_spec("verl")  # finds the package without running its __init__
        if spec is None or not spec.submodule_search_locations:
            raise RuntimeError("verl_suite: verl's sources are not on the path (PYTHONPATH)")
        stubs.install(list(spec.submodule_search_locations)[0])
    import verl.trainer.ppo.core_algos as core_algos
    import verl.utils.torch_functional as torch_functional

    return core_algos, torch_functional


def pytest_configure(config):
    from rl_triton import llm

    core_algos, torch_functional = _import_verl()
    VERL_REGISTRY.update(core_algos.ADV_ESTIMATOR_REGISTRY)
    for module, names in ((core_algos, ESTIMATORS), (torch_functional, STATISTICS)):
        for name in names:
            VERL[name] = getattr(module, name)
            setattr(module, name, _wrap(name, getattr(llm, name)))


def _backend() -> str:
    if device() != "cpu":
        return f"Triton kernels on {device()}"
    import rl_triton

    return "Triton kernels, interpreted" if rl_triton.INTERPRET else "PyTorch path"


def pytest_terminal_summary(terminalreporter):
    stubs = " (verl's other modules stood in for)" if os.environ.get("RL_TRITON_VERL_STUBS") == "1" else ""
    terminalreporter.write_line(f"verl_suite: rl_triton's functions in verl's place, {_backend()}{stubs}")
    for name in (*ESTIMATORS, *STATISTICS):
        terminalreporter.write_line(f"verl_suite:   {name}: {CALLS[name]} calls")


def pytest_sessionfinish(session, exitstatus):
    if exitstatus == 0 and session.testscollected and not CALLS:
        session.exitstatus = 1  # no function of ours ran: the patch did not take


def _sum_order_errors(item) -> tuple[float, float] | None:
    """(rl_triton's largest error, verl's) against float64 on the inputs of a :data:`SUM_ORDER` test, rebuilt
    with the test module's own helpers and seed; None for another test."""
    spec = SUM_ORDER.get(item.originalname)
    if spec is None or not hasattr(item, "callspec"):
        return None
    from tests.llm import reference

    kind, ours_name, twin_name = spec
    p = item.callspec.params
    torch.manual_seed(p["seed"])
    random.seed(p["seed"])
    np.random.seed(p["seed"])
    mod = sys.modules[item.module.__name__]
    index = mod._make_group_index(p["batch_size"], p["num_groups"])
    m = mod._rand_mask(p["batch_size"], p["seq_len"])
    r = torch.randn(p["batch_size"], p["seq_len"], dtype=torch.float32) * m
    exact = reference.outcome(kind, r, m, index)
    import verl.trainer.ppo.core_algos as core_algos

    ours = getattr(core_algos, ours_name)(token_level_rewards=r, response_mask=m, index=index)[0]
    theirs = [VERL[ours_name](token_level_rewards=r.clone(), response_mask=m, index=index)[0],
              getattr(core_algos, twin_name)(token_level_rewards=r, response_mask=m, index=index)[0]]  # fmt: skip
    err = [float((x.double() - exact).abs().max()) for x in (ours, *theirs)]
    return err[0], max(err[1:])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or call.excinfo is None:
        return
    if not call.excinfo.errisinstance(AssertionError):
        return
    errors = _sum_order_errors(item)
    if errors is not None and errors[0] <= errors[1]:
        report.outcome = "skipped"
        report.wasxfail = (
            f"sum order: against float64, rl_triton's largest error is {errors[0]:.2e}, verl's {errors[1]:.2e}"
        )
