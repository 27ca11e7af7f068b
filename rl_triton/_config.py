"""Process-wide settings read once at import time.

``RL_TRITON_PERF_WARNINGS=1`` warns whenever a call has to copy or cast an input (non-contiguous
view, flag dtype the kernels cannot read as stored). ``RL_TRITON_CORRECTNESS_WARNINGS=1`` runs
extra checks on the inputs (a pass over the flags, so off by default) and warns on suspicious
data. ``TRITON_INTERPRET=1`` (read by Triton itself) sends CPU tensors through the Triton kernels
in Triton's interpreter instead of the PyTorch path.

The parsed values live here as module attributes; the library reads them at call time, so tests
may monkeypatch them.
"""

from __future__ import annotations

import os


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() in ("1", "true", "yes", "on")


PERF_WARNINGS: bool = _flag("RL_TRITON_PERF_WARNINGS")
CORRECTNESS_WARNINGS: bool = _flag("RL_TRITON_CORRECTNESS_WARNINGS")
INTERPRET: bool = _flag("TRITON_INTERPRET")
