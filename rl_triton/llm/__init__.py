"""Token-level credit assignment for LLM RL: drop-ins for verl's advantage estimators.

``import rl_triton.llm`` (an explicit subpackage import). See :mod:`rl_triton.llm.functional` and docs/llm.md.
"""

from ._verl import register_with_verl, unregister_from_verl
from .functional import (
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_rloo_outcome_advantage,
    masked_mean,
    masked_var,
    masked_whiten,
)

__all__ = [
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "register_with_verl",
    "unregister_from_verl",
]
