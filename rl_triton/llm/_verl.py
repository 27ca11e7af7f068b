"""Registration of rl_triton's estimators in verl's advantage-estimator registry.

verl's trainer looks an estimator up by name (``algorithm.adv_estimator``) with
``verl.trainer.ppo.core_algos.get_adv_estimator_fn`` and calls it with keyword arguments
(``token_level_rewards=``, ``response_mask=``, ``config=``, ``index=`` as a NumPy object array of uids). The
functions of :mod:`rl_triton.llm.functional` take that call as verl's own do, so they are registered as they are.
verl is imported only here, when asked for: it is never a dependency of rl_triton.
"""

from __future__ import annotations

from . import functional as F

# verl's names for the estimators rl_triton has; the vectorized variants compute the same numbers
VERL_ESTIMATORS = {
    "gae": F.compute_gae_advantage_return,
    "grpo": F.compute_grpo_outcome_advantage,
    "grpo_vectorized": F.compute_grpo_outcome_advantage,
    "rloo": F.compute_rloo_outcome_advantage,
    "rloo_vectorized": F.compute_rloo_outcome_advantage,
    "reinforce_plus_plus": F.compute_reinforce_plus_plus_outcome_advantage,
}

# (registry, name, the entry it had or _ABSENT), in registration order, for unregister_from_verl
_saved: list = []
_ABSENT = object()


def _core_algos():
    try:
        from verl.trainer.ppo import core_algos
    except ImportError as e:
        raise ImportError(f"register_with_verl needs verl (verl.trainer.ppo.core_algos): {e}") from e
    return core_algos


def register_with_verl(names=None) -> list[str]:
    """Puts rl_triton's estimators into verl's registry under verl's names, replacing verl's entries, so that a
    verl config (``algorithm.adv_estimator``) picks them up unchanged. ``names``: a subset of
    :data:`VERL_ESTIMATORS` (default: all of them). Returns the names registered; :func:`unregister_from_verl`
    puts back what was there. Calling it again re-registers (the first call's entries are what is restored)."""
    if names is None:
        names = list(VERL_ESTIMATORS)
    elif isinstance(names, str):
        raise TypeError("names must be a list of estimator names, not a single string")
    else:
        names = list(names)
    unknown = [n for n in names if n not in VERL_ESTIMATORS]
    if unknown:
        raise ValueError(f"names: rl_triton has no estimator {unknown}; it has {sorted(VERL_ESTIMATORS)}")
    registry = _core_algos().ADV_ESTIMATOR_REGISTRY
    for name in names:
        if not any(r is registry and n == name for r, n, _ in _saved):
            _saved.append((registry, name, registry.get(name, _ABSENT)))
        registry[name] = VERL_ESTIMATORS[name]
    return names


def unregister_from_verl() -> None:
    """Undoes :func:`register_with_verl`: every entry it replaced gets verl's function back (names that were not
    registered before are removed). Without a registration, does nothing."""
    while _saved:
        registry, name, previous = _saved.pop()
        if previous is _ABSENT:
            registry.pop(name, None)
        else:
            registry[name] = previous
