"""Repeated calls give bitwise-identical outputs (fixed reduction order), also on the multi-block paths: the
one-pass look-back uses atomics only for flags; what it combines, and in which order, depends on the block alone
(kernels/core.py, lookback)."""

import pytest
import torch

from rl_triton.kernels.plans import Form, Plan, Split
from tests._helpers import equal_results
from tests.test_multiblock import CALLS, FORWARD, _inputs

# rows of 160 steps in 32-step chunks: single pass, split into 5 time blocks (look-back windows of 4: both levels)
SPLITS = {"single": None, "two-pass": Split.TWO_PASS, "lookback": Split.LOOKBACK}


@pytest.mark.parametrize("split", list(SPLITS))
@pytest.mark.parametrize("fn", ["gae", "vtrace", "retrace", "lambda", "traces"])
def test_bitwise_repeatable(kernel_path, split, fn):
    if kernel_path.name == "interpret" and SPLITS[split] is not Split.LOOKBACK:
        pytest.skip(
            "interpreter: its programs run one after another in a fixed order and this plan keeps no state between "
            "calls, so two calls cannot differ; only on a GPU (the look-back's flags, kept between calls, run here)"
        )
    plan = None
    if SPLITS[split] is not None:
        plan = Plan(1, 32, 4, Form.PLAIN if fn in FORWARD else Form.GROUPS4, SPLITS[split], window=4)
    x = {k: v.float() if v.is_floating_point() else v for k, v in _inputs(3, 160, kernel_path.device).items()}
    equal_results(CALLS[fn](x, plan), CALLS[fn](x, plan))  # zero tolerance: equal values, dtypes and devices


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (timing-dependent interleavings)")
@pytest.mark.parametrize("fn", ["gae", "vtrace", "retrace", "discounted", "prefix"])
def test_lookback_long_rows_repeatable_on_gpu(fn):
    """Rows of ~1M steps in the one-pass look-back (1024 blocks of 1024 steps per row, hundreds of programs
    waiting on each other, windows of 64: several per row): ten calls, bitwise equal."""
    form = Form.PLAIN if fn in FORWARD else Form.GROUPS4
    plan = Plan(1, 1024, 4, form, Split.LOOKBACK, window=64, maxnreg=None)
    x = {k: v.float() if v.is_floating_point() else v for k, v in _inputs(2, 1 << 20, "cuda").items()}
    first = CALLS[fn](x, plan)
    for _ in range(10):
        equal_results(first, CALLS[fn](x, plan))
