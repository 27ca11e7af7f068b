"""Making unmodified TorchRL code build the rl_triton estimators.

TorchRL 0.14's losses (``ClipPPOLoss``/``PPOLoss``/``KLPENPPOLoss``, ``A2CLoss``,
``ReinforceLoss``, the DQN/SAC/TD3/... losses) build their estimators through
``torchrl.objectives.utils.dispatch_value_estimator`` -> ``build_value_estimator``, which looks the
class up in ``torchrl.objectives.utils._VALUE_ESTIMATOR_REGISTRY`` (also when a loss builds its
default estimator lazily). None of them names an estimator class directly, so replacing the
registry entries is enough for them; no loss module attribute is patched.

Not covered (they reference ``torchrl.objectives.value.GAE`` directly): the trainer helpers in
``torchrl.trainers.algorithms`` (``on_policy`` and the hydra config ``_make_gae``); pass an
estimator instance (``gae=rl_triton.modules.GAE(...)``) there instead.

Each estimator class names the entry it stands for with the :func:`torchrl_estimator` class decorator, as
TorchRL's own classes do with ``register_value_estimator``; unlike TorchRL's, it only records the class, and
TorchRL's registry changes when :func:`register_with_torchrl` is called.
"""

from __future__ import annotations

from torchrl.objectives import utils as _trl_utils
from torchrl.objectives.utils import ValueEstimators

__all__ = ["register_with_torchrl", "torchrl_registered", "unregister_from_torchrl"]

# value type -> our class, recorded by @torchrl_estimator
_ESTIMATORS: dict = {}


def torchrl_estimator(name: str):
    """Class decorator: the class stands for TorchRL's ``ValueEstimators.<name>`` once :func:`register_with_torchrl`
    is called. Recorded only when the installed TorchRL has that entry."""

    def record(cls):
        value_type = getattr(ValueEstimators, name, None)
        if value_type is not None:
            _ESTIMATORS[value_type] = cls
        return cls

    return record


def _ours() -> dict:
    """Our classes by value type, in TorchRL's order of ``ValueEstimators``."""
    return {value_type: _ESTIMATORS[value_type] for value_type in ValueEstimators if value_type in _ESTIMATORS}


# value type -> TorchRL's registry entry that we replaced (restored on unregister)
_ORIGINAL_ENTRIES: dict = {}


class TorchRLRegistration:
    """What one :func:`register_with_torchrl` call changed; ``undo()`` reverts exactly that.

    Also a context manager: ``with register_with_torchrl(): ...`` reverts on exit. Entries that
    were already ours before the call are left alone, so nested uses compose.
    """

    def __init__(self, value_types: tuple) -> None:
        self.value_types = value_types

    def undo(self) -> None:
        _restore(self.value_types)
        self.value_types = ()

    def __enter__(self) -> TorchRLRegistration:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()

    def __repr__(self) -> str:
        names = ", ".join(v.name for v in self.value_types)
        return f"TorchRLRegistration([{names}])"


def register_with_torchrl() -> TorchRLRegistration:
    """Points TorchRL's value-estimator registry at the rl_triton classes.

    After this, ``loss.make_value_estimator(ValueEstimators.GAE, ...)`` (and ``TD0``, ``TD1``,
    ``TDLambda``, ``VTrace``, ``MAGAE``; also their string aliases and a loss's default estimator)
    in unmodified TorchRL code builds :class:`GAE`, :class:`TD0Estimator`, ... from
    :mod:`rl_triton.modules`, with TorchRL's default hyper-parameters for each entry. Estimators
    that a loss has already built are not replaced. Idempotent: a second call changes nothing.

    Returns a :class:`TorchRLRegistration` whose ``undo()`` (or use as a context manager) restores
    the entries this call replaced; :func:`unregister_from_torchrl` restores all of them.
    """
    _trl_utils._ensure_builtin_value_estimators_registered()
    registry = _trl_utils._VALUE_ESTIMATOR_REGISTRY
    changed = []
    for value_type, cls in _ours().items():
        entry = registry.get(value_type)
        if entry is not None and entry.cls is cls:
            continue
        if entry is not None:
            defaults = dict(entry.default_kwargs)
        else:
            defaults = dict(getattr(_trl_utils, "_BUILTIN_VALUE_ESTIMATOR_DEFAULTS", {}).get(value_type, {}))
        _ORIGINAL_ENTRIES[value_type] = entry
        registry[value_type] = _trl_utils._ValueEstimatorRegistryEntry(cls, defaults)
        changed.append(value_type)
    return TorchRLRegistration(tuple(changed))


def _restore(value_types) -> None:
    registry = _trl_utils._VALUE_ESTIMATOR_REGISTRY
    ours = _ours()
    for value_type in value_types:
        entry = registry.get(value_type)
        if entry is None or entry.cls is not ours.get(value_type):
            # somebody registered something else since: leave theirs in place
            _ORIGINAL_ENTRIES.pop(value_type, None)
            continue
        original = _ORIGINAL_ENTRIES.pop(value_type, None)
        if original is None:
            del registry[value_type]
        else:
            registry[value_type] = original


def unregister_from_torchrl() -> None:
    """Restores TorchRL's own registry entries replaced by :func:`register_with_torchrl` (no-op if
    none are)."""
    _restore(tuple(_ORIGINAL_ENTRIES))


def torchrl_registered() -> TorchRLRegistration:
    """Context manager form: ``with torchrl_registered(): loss.make_value_estimator(...)``."""
    return register_with_torchrl()
