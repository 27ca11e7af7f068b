"""Inputs for the token-level tests: right-padded responses with random interior masks."""

from __future__ import annotations

import torch

from rl_triton.llm.plans import TokenPlan


def token_batch(b: int, t: int, device, dtype=torch.float32, mask_dtype=torch.bool, interior: float = 0.3):
    """(rewards, values, mask): rows of random length in [1, t] (right padding), and inside each response a
    fraction ``interior`` of masked tokens (tool output); at least one valid token per row."""
    r = torch.randn(b, t, dtype=torch.float64).to(dtype)
    v = torch.randn(b, t, dtype=torch.float64).to(dtype)
    lens = torch.randint(1, t + 1, (b,))
    m = (torch.arange(t) < lens[:, None]) & (torch.rand(b, t) >= interior)
    m[torch.arange(b), 0] = True
    return r.to(device), v.to(device), m.to(mask_dtype).to(device)


# Rows split in time at 64 tokens: the kernels' multi-block path on small shapes (the PyTorch path ignores plans).
SMALL_BLOCKS = TokenPlan(block=64)
