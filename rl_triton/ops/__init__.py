"""The algorithms, one file each, read top-down: the spec of its public functions' calls (:class:`.utils.Op`),
the PyTorch path, the Triton prologue, epilogue and kernel, and the argument builder.

- :mod:`.gae`: GAE (``compute_gae``, ``gae_with_next_values``)
- :mod:`.vtrace`: V-trace (``compute_vtrace``, ``vtrace_with_next_values``)
- :mod:`.retrace`: Retrace (``compute_retrace``)
- :mod:`.returns`: discounted and TD(lambda) returns, one kernel (``compute_discounted_returns``,
  ``compute_lambda_returns``, ``returns_with_advantages``)
- :mod:`.forward`: eligibility traces and episodic prefix sums, one forward kernel
- :mod:`.common`: the Triton helpers several algorithms share; :mod:`.utils`: the host-side ones (the spec, the
  hyper-parameters' kernel form, the PyTorch helpers)
"""

import importlib

_ALGORITHMS = ("gae", "vtrace", "retrace", "returns", "forward")


def __getattr__(name: str):
    """The algorithms load on first use (they import Triton): ``rl_triton.ops.gae`` imports ops/gae.py."""
    if name in _ALGORITHMS:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
