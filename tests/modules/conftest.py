"""Fixtures for the rl_triton.modules tests (TorchRL estimators and transforms).

The whole folder needs the optional TorchRL stack (tensordict + torchrl 0.14); without it nothing
here is collected. The top-level tests/conftest.py provides `path` and sets TRITON_INTERPRET=1.
"""

import collections
import importlib.util

import pytest

# rl_triton entry points the estimators and transforms are built on.
_FUNCTIONAL = (
    "gae_with_next_values",
    "returns_with_advantages",
    "vtrace_with_next_values",
    "compute_gae",
    "compute_vtrace",
    "compute_retrace",
    "compute_lambda_returns",
    "compute_discounted_returns",
)

if importlib.util.find_spec("torchrl") is None or importlib.util.find_spec("tensordict") is None:
    collect_ignore_glob = ["test_*.py"]
else:

    @pytest.fixture(autouse=True)
    def _restore_value_estimator_registry():
        """Whatever a test does to TorchRL's value-estimator registry is undone afterwards, so
        register_with_torchrl() in one test cannot change which estimator another test builds."""
        import torchrl.objectives.value  # noqa: F401  (registers TorchRL's built-in estimators)
        from torchrl.objectives import utils

        registry = utils._VALUE_ESTIMATOR_REGISTRY
        saved = {k: (e, e.cls, dict(e.default_kwargs)) for k, e in registry.items()}
        yield
        registry.clear()
        for k, (e, cls, kwargs) in saved.items():
            e.cls, e.default_kwargs = cls, kwargs
            registry[k] = e

    @pytest.fixture
    def registered():
        """rl_triton's estimators registered with TorchRL for the duration of one test."""
        from rl_triton import modules

        modules.register_with_torchrl()
        try:
            yield modules
        finally:
            undo = getattr(modules, "unregister_from_torchrl", None)
            if undo is not None:
                undo()

    @pytest.fixture
    def rl_triton_calls(monkeypatch):
        """Counts calls into rl_triton's functional API during a test, so a parity test can check
        that the numbers came from rl_triton and not from a fallback to TorchRL's own code."""
        from rl_triton import functional

        calls = collections.Counter()
        for name in _FUNCTIONAL:
            fn = getattr(functional, name, None)
            if fn is None:
                continue

            def counted(*args, _fn=fn, _name=name, **kwargs):
                calls[_name] += 1
                return _fn(*args, **kwargs)

            monkeypatch.setattr(functional, name, counted)
        return calls
