"""Repeated calls give bitwise-identical outputs (no atomics, fixed reduction order), also on the
multi-block path."""

import pytest
import torch

from rl_triton.kernels import launch
from tests.test_multiblock import CALLS, _inputs


@pytest.mark.parametrize("split", [False, True], ids=["single", "multiblock"])
@pytest.mark.parametrize("fn", ["gae", "vtrace", "retrace", "lambda", "traces"])
def test_bitwise_repeatable(path, monkeypatch, split, fn):
    if split:
        monkeypatch.setattr(launch, "_MIN_CHUNKS_FOR_SPLIT", 2)
        monkeypatch.setattr(launch, "_MIN_CHUNKS_PER_BLOCK", 1)
    x = {k: v.float() if v.is_floating_point() else v for k, v in _inputs(3, 300, path.device).items()}
    first = CALLS[fn](x)
    second = CALLS[fn](x)
    first = first if isinstance(first, tuple) else (first,)
    second = second if isinstance(second, tuple) else (second,)
    for a, b in zip(first, second, strict=True):
        assert torch.equal(a, b)
