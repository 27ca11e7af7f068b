"""TorchRL integration: value estimators and a transform backed by rl_triton's kernels.

Drop-in replacements for TorchRL 0.14's classes of the same name (they subclass them)::

    from rl_triton.modules import GAE   # instead of: from torchrl.objectives.value import GAE

To make unmodified TorchRL code (``loss.make_value_estimator(ValueEstimators.GAE, ...)``) build
these classes, call :func:`register_with_torchrl` (undo with :func:`unregister_from_torchrl`, or use
:func:`torchrl_registered` as a context manager).

An entry an estimator needs that is absent from the tensordict raises :class:`MissingEntryError`
(a ``KeyError`` and a ``ValueError``) naming the key and the estimator.

This subpackage needs ``torchrl`` and ``tensordict`` (``pip install rl-triton[torchrl]``); the rest
of ``rl_triton`` does not import them.
"""

try:
    import tensordict as _tensordict
    import torchrl as _torchrl
except ImportError as err:  # pragma: no cover - exercised only without the optional extra
    raise ImportError(
        "rl_triton.modules needs TorchRL and tensordict, which are not installed "
        f"({err}). Install them with: pip install rl-triton[torchrl]"
    ) from err

from ._common import MissingEntryError
from ._registry import register_with_torchrl, torchrl_registered, unregister_from_torchrl
from .gae import GAE, MultiAgentGAE
from .llm import GroupAdvantage, TokenGAE
from .retrace import Retrace
from .td import TD0Estimator, TD1Estimator, TDLambdaEstimator
from .transforms import Reward2GoTransform
from .vtrace import VTrace

del _tensordict, _torchrl  # imported only to fail early: not names of this package

__all__ = [
    "GAE",
    "GroupAdvantage",
    "MissingEntryError",
    "MultiAgentGAE",
    "Retrace",
    "Reward2GoTransform",
    "TD0Estimator",
    "TD1Estimator",
    "TDLambdaEstimator",
    "TokenGAE",
    "VTrace",
    "register_with_torchrl",
    "torchrl_registered",
    "unregister_from_torchrl",
]
