"""Opt-in warnings: RL_TRITON_CORRECTNESS_WARNINGS (suspicious data) and RL_TRITON_PERF_WARNINGS
(copies of non-contiguous inputs), toggled through rl_triton._config as the API allows."""

import warnings

import pytest
import torch

import rl_triton
from tests._helpers import FUNCTIONS, non_contiguous, valid_kwargs

SHAPE = (3, 6)
TERM_TRUNC_FNS = [
    "compute_gae",
    "compute_vtrace",
    "compute_retrace",
    "compute_discounted_returns",
    "compute_lambda_returns",
]
BOOTSTRAP_FNS = ["compute_gae", "compute_vtrace", "compute_discounted_returns", "compute_lambda_returns"]


def emitted(fn: str, kwargs: dict) -> list[str]:
    """Messages of the warnings one call emits (ignoring deprecation noise from dependencies)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(rl_triton, fn)(**kwargs)
    return [
        str(w.message) for w in caught if not issubclass(w.category, (DeprecationWarning, PendingDeprecationWarning))
    ]


@pytest.fixture
def correctness(monkeypatch):
    monkeypatch.setattr("rl_triton._config.CORRECTNESS_WARNINGS", True)


@pytest.fixture
def perf(monkeypatch):
    monkeypatch.setattr("rl_triton._config.PERF_WARNINGS", True)


def _term_and_trunc(fn, device):
    kwargs = valid_kwargs(fn, SHAPE, device=device)
    kwargs["terminateds"] = kwargs["terminateds"].clone()
    kwargs["truncateds"] = kwargs["truncateds"].clone()
    kwargs["terminateds"][1, 2] = True
    kwargs["truncateds"][1, 2] = True
    return kwargs


def _bad_flag(fn, device, flag_dtype, value):
    kwargs = valid_kwargs(fn, SHAPE, device=device, flag_dtype=flag_dtype)
    name = "dones" if "dones" in kwargs else "terminateds"
    kwargs[name] = kwargs[name].clone()
    kwargs[name][0, 3] = value
    return kwargs, name


def _interior_bootstrap(fn, device):
    kwargs = valid_kwargs(fn, SHAPE, device=device)
    kwargs["truncateds"] = torch.zeros(SHAPE, dtype=torch.bool, device=device)
    kwargs["bootstrap_values"] = kwargs["bootstrap_values"].clone()
    kwargs["bootstrap_values"][:, :-1] = 0.0
    kwargs["bootstrap_values"][2, 1] = 0.5  # not truncated, not the last step: never read
    return kwargs


# ------------------------------------------------------------------------------------------
# Correctness warnings


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_clean_inputs_do_not_warn(path, correctness, fn):
    assert emitted(fn, valid_kwargs(fn, SHAPE, device=path.device)) == []


@pytest.mark.parametrize("fn", TERM_TRUNC_FNS)
def test_term_and_trunc_both_set_warns(path, correctness, fn):
    msgs = emitted(fn, _term_and_trunc(fn, path.device))
    assert msgs, "no warning for a step both terminated and truncated"
    assert any("terminated" in m and "truncated" in m for m in msgs), msgs


@pytest.mark.parametrize(
    "flag_dtype, value",
    [(torch.uint8, 2), (torch.int32, -1), (torch.float32, 0.5), (torch.float32, 3.0)],
    ids=["uint8-2", "int32-neg1", "float-0.5", "float-3"],
)
@pytest.mark.parametrize("fn", FUNCTIONS)
def test_flag_not_0_or_1_warns(path, correctness, fn, flag_dtype, value):
    kwargs, name = _bad_flag(fn, path.device, flag_dtype, value)
    msgs = emitted(fn, kwargs)
    assert any(name in m for m in msgs), msgs


@pytest.mark.parametrize("fn", BOOTSTRAP_FNS)
def test_nonzero_bootstrap_at_interior_step_warns(path, correctness, fn):
    msgs = emitted(fn, _interior_bootstrap(fn, path.device))
    assert any("bootstrap_values" in m for m in msgs), msgs


@pytest.mark.parametrize("fn", BOOTSTRAP_FNS)
def test_bootstrap_at_truncation_and_last_step_does_not_warn(path, correctness, fn):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device, p=0.3)
    kwargs["truncateds"] = kwargs["truncateds"].clone()
    kwargs["truncateds"][0, 2] = True
    kwargs["terminateds"] = kwargs["terminateds"].clone()
    kwargs["terminateds"][0, 2] = False
    boot = torch.zeros(SHAPE, device=path.device)
    boot[:, -1] = 1.0
    boot[kwargs["truncateds"].bool()] = 2.0
    kwargs["bootstrap_values"] = boot
    assert emitted(fn, kwargs) == []


@pytest.mark.parametrize(
    "arg, index, value",
    [
        ("action_probs_target", (0, 1, 2), 1.5),
        ("action_probs_target", (2, 0, 0), -0.25),
        ("action_probs_behavior", (1, 4), 1.25),
        ("next_action_probs_target", (1, 1, 3), -0.5),
        ("action_probs_behavior", (0, 0), 0.0),  # zero behaviour probability
    ],
    ids=["target-above1", "target-neg", "behavior-above1", "next-neg", "behavior-zero"],
)
def test_retrace_probability_out_of_range_warns(path, correctness, arg, index, value):
    kwargs = valid_kwargs("compute_retrace", SHAPE, device=path.device)
    kwargs[arg] = kwargs[arg].clone()
    kwargs[arg][index] = value
    msgs = emitted("compute_retrace", kwargs)
    assert any(arg in m for m in msgs), msgs


def test_no_correctness_warnings_when_disabled(path, monkeypatch):
    monkeypatch.setattr("rl_triton._config.CORRECTNESS_WARNINGS", False)
    for fn in TERM_TRUNC_FNS:
        assert emitted(fn, _term_and_trunc(fn, path.device)) == []
    for fn in FUNCTIONS:
        assert emitted(fn, _bad_flag(fn, path.device, torch.uint8, 2)[0]) == []
    for fn in BOOTSTRAP_FNS:
        assert emitted(fn, _interior_bootstrap(fn, path.device)) == []
    kwargs = valid_kwargs("compute_retrace", SHAPE, device=path.device)
    kwargs["action_probs_target"] = kwargs["action_probs_target"] * 2
    assert emitted("compute_retrace", kwargs) == []


# ------------------------------------------------------------------------------------------
# Performance warnings


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_non_contiguous_input_warns(path, perf, fn):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device)
    first = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    kwargs[first] = non_contiguous(kwargs[first])
    msgs = emitted(fn, kwargs)
    assert any(first in m for m in msgs), msgs


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_contiguous_inputs_do_not_perf_warn(path, perf, fn):
    assert emitted(fn, valid_kwargs(fn, SHAPE, device=path.device)) == []


def test_no_perf_warning_when_disabled(path, monkeypatch):
    monkeypatch.setattr("rl_triton._config.PERF_WARNINGS", False)
    for fn in FUNCTIONS:
        kwargs = valid_kwargs(fn, SHAPE, device=path.device)
        kwargs = {k: non_contiguous(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        assert emitted(fn, kwargs) == []
