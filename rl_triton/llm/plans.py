"""Launch plans of :mod:`rl_triton.llm`'s token scans, as data: the token kind of the shared plans
(:mod:`rl_triton.kernels.plans`), under the names this package has always given them.

A :class:`TokenPlan` says how the scan kernels of masked GAE and REINFORCE++ cover a ``(B, T)`` call: the block
length that rows longer than it are split at, the tile form of a block (:class:`Form`), how a split row is
carried from block to block (:class:`Split`). :func:`choose` picks the plan of a call from its shape and dtype;
tests and benchmarks pass their own (``plan=`` of :func:`rl_triton.llm.compute_gae_advantage_return` and
:func:`rl_triton.llm.compute_reinforce_plus_plus_outcome_advantage`) instead of changing a setting.
"""

from __future__ import annotations

from ..kernels.plans import TOKEN_DEFAULT as DEFAULT
from ..kernels.plans import TOKEN_GAE as GAE_PLAN
from ..kernels.plans import TOKEN_MAX_BLOCK as MAX_BLOCK
from ..kernels.plans import TOKEN_MIN_BLOCK as MIN_BLOCK
from ..kernels.plans import Form, Split, TokenPlan
from ..kernels.plans import check_token as check
from ..kernels.plans import choose_token as choose

__all__ = ["DEFAULT", "GAE_PLAN", "MAX_BLOCK", "MIN_BLOCK", "Form", "Split", "TokenPlan", "check", "choose"]
