"""The algorithms, one file each, read top-down: the spec of its public functions' calls (:class:`.utils.Op`),
the PyTorch path, the Triton prologue, epilogue and kernel, and the argument builder.

- :mod:`.gae`: GAE (``compute_gae``, ``gae_with_next_values``)
- :mod:`.vtrace`: V-trace (``compute_vtrace``, ``vtrace_with_next_values``)
- :mod:`.retrace`: Retrace (``compute_retrace``)
- :mod:`.returns`: discounted and TD(lambda) returns, one kernel (``compute_discounted_returns``,
  ``compute_lambda_returns``, ``returns_with_advantages``)
- :mod:`.forward`: eligibility traces and episodic prefix sums, one forward kernel
- :mod:`.common`: the Triton helpers several algorithms share; :mod:`.utils`: the host-side ones (the spec and
  the PyTorch helpers)
"""

import importlib
import importlib.util
import pkgutil


def __getattr__(name: str):
    """The algorithms load on first use (they import Triton): ``rl_triton.ops.gae`` imports ops/gae.py, and so
    for any file of this folder (a new algorithm's included)."""
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def kind_of(fn: str) -> str:
    """The launch plans' kind (:data:`rl_triton.kernels.plans.KINDS`) of a call of public function ``fn`` with its
    required tensors: what the ``kind`` of its first :class:`.utils.Op` names (the launcher asks the Op of each
    call; the tuning tool and the tests ask this). Loads every algorithm."""
    from .utils import Op

    for info in pkgutil.iter_modules(__path__):
        for op in vars(importlib.import_module(f".{info.name}", __name__)).values():
            if isinstance(op, Op) and op.fn == fn:
                return op.kind(dict.fromkeys(op.required, True))
    raise ValueError(f"kind_of: no op of rl_triton.ops runs {fn!r}")
