"""Launch plans of :mod:`rl_triton.llm`'s token scans, as data.

A :class:`TokenPlan` says how the scan kernels of masked GAE and REINFORCE++ cover a ``(B, T)`` call: the
block length that rows longer than it are split at, the tile form of a block, how a split row is carried from
block to block. :func:`choose`
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
    """Tile form of a block of the scan kernel. One form is left: plain tiles scanned with time descending (no
    vector loads) or with reverse=True scans (lane-reversing shuffles of every element) were no faster on an H200,
    and the reverse one did not compile for every shape."""

    # Groups of 4 consecutive tokens (time ascending inside a group, so loads vectorise) numbered latest-first:
    # straight-line code inside a group, a forward scan across groups.
    GROUPED = "grouped"


class Split(enum.Enum):
    """How a row longer than one block is carried from block to block."""

    # Two launches: each block stores its composed map, then each block folds the maps of the later blocks and
    # rescans (inputs read twice).
    TWO_PASS = "two_pass"
    # One launch: blocks launched latest-first publish their map behind an epoch-tagged flag and wait for the
    # later blocks' (inputs read once). CUDA graph captures take the two passes instead (a replay would reuse
    # the captured epoch).
    LOOKBACK = "lookback"


MIN_BLOCK = 16  # the shortest tile of the scan kernels (short rows are padded to it as well)
MAX_BLOCK = 8192  # one program's tile of a row split in time


@dataclass(frozen=True)
class TokenPlan:
    """One launch configuration of the token scans. Fields given as strings are read as the enums' values
    (``TokenPlan(form="descending")``); an invalid plan raises ValueError saying why."""

    block: int = 4096  # tokens per block: rows of at most this many are one block, longer ones are split
    form: Form = Form.GROUPED
    split: Split = Split.LOOKBACK
    # Warps per program of the scan; None: one per 256 tokens of the tile (8 tokens a thread), 4 to 16.
    warps: int | None = None

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
    w = plan.warps
    if w is not None and (isinstance(w, bool) or not isinstance(w, int) or w & (w - 1) or not 1 <= w <= 32):
        raise ValueError(f"TokenPlan: warps must be None or a power of two in [1, 32], got {w!r}")
    if not isinstance(plan.form, Form) or not isinstance(plan.split, Split):
        raise ValueError(f"TokenPlan: form and split must be Form and Split members, got {plan.form!r}, {plan.split!r}")
    return plan


DEFAULT = TokenPlan()
# GAE's two-value state runs faster with fewer, fuller threads: 4 warps a program (32 tokens a thread in a
# 4096-token block) rather than one warp per 256 tokens. REINFORCE++'s one-value state does not (docs/llm.md).
GAE_PLAN = TokenPlan(warps=4)


def choose(b: int, t: int, dtype: torch.dtype, estimator: str = "gae") -> TokenPlan:
    """The plan of a token scan of ``b`` rows of ``t`` tokens of ``dtype`` for ``estimator`` (``"gae"`` or
    ``"reinforce_pp"``): blocks of 4096 tokens for every shape (on an H200 a 4096-token row was a third faster as
    one block than as two of 2048, and a 32768-token row no slower in blocks of 4096), rows longer than that
    carried by the one-launch look-back (two launches inside a CUDA graph capture); GAE on 2- and 4-byte floats
    in 4 warps a program. docs/llm.md, "Kernels"."""
    if estimator not in ("gae", "reinforce_pp"):
        raise ValueError(f"estimator must be 'gae' or 'reinforce_pp', got {estimator!r}")
    return GAE_PLAN if estimator == "gae" and dtype != torch.float64 else DEFAULT
