"""Launch plans of :mod:`rl_triton.llm`'s token scans, as data.

A :class:`TokenPlan` says how the scan kernels of masked GAE and REINFORCE++ cover a ``(B, T)`` call: the
block length that rows longer than it are split at, the tile form of a block, how a split row is carried from
block to block, and when the whitening combines its partial moments in a launch of its own. :func:`choose`
picks the plan of a call from its shape and dtype; tests and benchmarks pass their own (``plan=`` of
:func:`rl_triton.llm.compute_gae_advantage_return` and
:func:`rl_triton.llm.compute_reinforce_plus_plus_outcome_advantage`) instead of changing a setting.
This module imports no Triton, so a plan can be built and checked anywhere.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class Form(enum.Enum):
    """Tile form of a block of the scan kernel. Triton lowers reverse=True scans with lane-reversing shuffles of
    every element, and a descending tile loses the vector loads and holds a thread's tokens strided: per
    2048-token block the PTX of the GAE rescan has about 140 shuffles per thread grouped, 500 descending and
    850 reverse."""

    # Groups of 4 consecutive tokens (time ascending inside a group, so loads vectorise) numbered latest-first:
    # straight-line code inside a group, a forward scan across groups. The fewest shuffles in the PTX.
    GROUPED = "grouped"
    DESCENDING = "descending"  # a plain tile with time descending: the backward recurrence as a forward scan
    REVERSE = "reverse"  # a plain tile with time ascending and a reverse=True scan


class Split(enum.Enum):
    """How a row longer than one block is carried from block to block."""

    # Two launches: each block stores its composed map, then each block folds the maps of the later blocks and
    # rescans (inputs read twice).
    TWO_PASS = "two_pass"
    # One launch, grouped form only: blocks launched latest-first publish their map behind an epoch-tagged flag
    # and wait for the later blocks' (inputs read once). CUDA graph captures take the two passes instead (a
    # replay would reuse the captured epoch).
    LOOKBACK = "lookback"


MIN_BLOCK = 16  # the shortest tile of the scan kernels (short rows are padded to it as well)
MAX_BLOCK = 8192  # one program's tile of a row split in time


@dataclass(frozen=True)
class TokenPlan:
    """One launch configuration of the token scans. Fields given as strings are read as the enums' values
    (``TokenPlan(form="descending")``); an invalid plan raises ValueError saying why."""

    block: int = 2048  # tokens per block: rows of at most this many are one block, longer ones are split
    form: Form = Form.GROUPED
    split: Split = Split.TWO_PASS
    # The whitening pass after the scan: up to this many per-program partial moments, each of its programs
    # combines them itself; more, and one small program combines them first (a launch more).
    fuse_max: int = 1024

    def __post_init__(self):
        for name, kind in (("form", Form), ("split", Split)):
            value = getattr(self, name)
            if not isinstance(value, kind):
                try:
                    object.__setattr__(self, name, kind(value))
                except ValueError:
                    known = ", ".join(repr(k.value) for k in kind)
                    raise ValueError(f"TokenPlan: {name} must be a {kind.__name__} ({known}), got {value!r}") from None
        check(self)


def check(plan: TokenPlan) -> TokenPlan:
    """``plan`` itself when the token scans can launch it; TypeError for anything but a :class:`TokenPlan`,
    ValueError saying why for an invalid one."""
    if not isinstance(plan, TokenPlan):
        raise TypeError(f"plan must be a rl_triton.llm.plans.TokenPlan, got {type(plan).__name__}")
    block = plan.block
    if isinstance(block, bool) or not isinstance(block, int) or block & (block - 1) or block <= 0:
        raise ValueError(f"TokenPlan: block must be a power of two (tokens per program of a split row), got {block!r}")
    if not MIN_BLOCK <= block <= MAX_BLOCK:
        raise ValueError(f"TokenPlan: block must lie in [{MIN_BLOCK}, {MAX_BLOCK}], got {block}")
    if not isinstance(plan.form, Form) or not isinstance(plan.split, Split):
        raise ValueError(f"TokenPlan: form and split must be Form and Split members, got {plan.form!r}, {plan.split!r}")
    if plan.split is Split.LOOKBACK and plan.form is not Form.GROUPED:
        raise ValueError(f"TokenPlan: the look-back split runs on the grouped form only, not {plan.form.value}")
    fuse = plan.fuse_max
    if isinstance(fuse, bool) or not isinstance(fuse, int) or fuse < 0:
        raise ValueError(f"TokenPlan: fuse_max must be an int >= 0 (partial moments), got {fuse!r}")
    return plan


DEFAULT = TokenPlan()


def choose(b: int, t: int, dtype: torch.dtype) -> TokenPlan:
    """The plan of a token scan of ``b`` rows of ``t`` tokens of ``dtype``. For now one plan serves every shape and
    dtype: the grouped form, blocks of 2048 tokens, split rows in two passes (the look-back is opt-in), the
    whitening fused up to 1024 partials (docs/llm.md, "Kernels")."""
    return DEFAULT
