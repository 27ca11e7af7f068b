"""rl_triton: reinforcement-learning credit assignment as fused Triton scan kernels.

CUDA tensors run Triton kernels; CPU tensors run a PyTorch path (or the same kernels in Triton's
interpreter when ``TRITON_INTERPRET=1`` is set before import). See :mod:`rl_triton.functional`.
"""

from ._config import CORRECTNESS_WARNINGS, INTERPRET, PERF_WARNINGS
from ._dispatch import current_backend, use_backend
from .functional import (
    compute_discounted_returns,
    compute_eligibility_traces,
    compute_episodic_prefix_sum,
    compute_gae,
    compute_lambda_returns,
    compute_retrace,
    compute_vtrace,
)

__version__ = "0.1.0"

__all__ = [
    "CORRECTNESS_WARNINGS",
    "INTERPRET",
    "PERF_WARNINGS",
    "compute_discounted_returns",
    "compute_eligibility_traces",
    "compute_episodic_prefix_sum",
    "compute_gae",
    "compute_lambda_returns",
    "compute_retrace",
    "compute_vtrace",
    "current_backend",
    "use_backend",
]
