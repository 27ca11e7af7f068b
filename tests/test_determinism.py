"""Repeated calls give bitwise-identical outputs (fixed reduction order), also on the multi-block
paths: the one-pass look-back uses atomics only for flags and tickets; what it combines, and in which
order, depends on the block alone (kernels/core.py, lookback)."""

import pytest
import torch

from rl_triton.kernels import launch
from tests._helpers import equal_results
from tests.test_multiblock import CALLS, _inputs


@pytest.mark.parametrize("split", [None, "two-pass", "lookback"], ids=["single", "two-pass", "lookback"])
@pytest.mark.parametrize("fn", ["gae", "vtrace", "retrace", "lambda", "traces"])
def test_bitwise_repeatable(path, monkeypatch, split, fn):
    if split:  # rows of 300 steps in 32-step chunks, split into time blocks
        monkeypatch.setattr(launch, "_MIN_CHUNKS_FOR_SPLIT", 2)
        monkeypatch.setattr(launch, "_MIN_CHUNKS_PER_BLOCK", 1)
        monkeypatch.setattr(launch, "_MAX_BT", 32)
        monkeypatch.setattr(launch, "_ONE_CHUNK_FACTOR", 1)
        monkeypatch.setattr(launch, "_LOOKBACK", split == "lookback")
        if split == "lookback":
            monkeypatch.setattr(launch, "_BLOCK", 32)
            monkeypatch.setattr(launch, "_LOOKBACK_WINDOW", 4)
        layout = launch.scan_layout("gae", 3, 300)
        assert layout.nk > 1 and layout.lookback == (split == "lookback")
    x = {k: v.float() if v.is_floating_point() else v for k, v in _inputs(3, 300, path.device).items()}
    equal_results(CALLS[fn](x), CALLS[fn](x))  # zero tolerance: equal values, dtypes and devices


@pytest.mark.parametrize("fn", ["gae", "vtrace", "retrace", "discounted", "prefix"])
def test_lookback_long_rows_repeatable_on_gpu(monkeypatch, fn):
    """Rows of ~1M steps in the one-pass look-back (1024 blocks per row, hundreds of programs waiting on
    each other): ten calls, bitwise equal."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (timing-dependent interleavings)")
    monkeypatch.setattr(launch, "_LOOKBACK", True)
    monkeypatch.setattr(launch, "_LOOKBACK_WINDOW", 64)  # several windows per row: their fold is exercised
    x = {k: v.float() if v.is_floating_point() else v for k, v in _inputs(2, 1 << 20, "cuda").items()}
    first = CALLS[fn](x)
    for _ in range(10):
        equal_results(first, CALLS[fn](x))
