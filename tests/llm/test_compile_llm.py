"""rl_triton.llm's functions under torch.compile(fullgraph=True), which runs their PyTorch form on every device:
the numbers of eager calls (on CUDA tensors, of the eager kernels). With backend "triton" on CPU tensors (Triton's
interpreter, which Dynamo cannot trace) compiling fails with a message that says so."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

import rl_triton
import rl_triton.llm as llm
from tests.llm.conftest import token_batch

IDS = torch.tensor([3, 3, 7, 3, 7, 7, 9])  # groups of 3, 3 and 1


def _calls():
    return {
        "gae": lambda r, v, m: llm.compute_gae_advantage_return(r, v, m, gamma=0.9, lam=0.8),
        "reinforce++": lambda r, v, m: llm.compute_reinforce_plus_plus_outcome_advantage(r, m, gamma=0.9),
        "grpo": lambda r, v, m: llm.compute_grpo_outcome_advantage(r, m, IDS.to(r.device)),
        "rloo": lambda r, v, m: llm.compute_rloo_outcome_advantage(r, m, IDS.to(r.device)),
        "masked_mean": lambda r, v, m: llm.masked_mean(v, m),
        "masked_whiten": lambda r, v, m: llm.masked_whiten(v, m),
    }


@pytest.mark.parametrize("name", list(_calls()))
def test_fullgraph_matches_eager(name):
    fn = _calls()[name]
    r, v, m = token_batch(7, 13, "cpu")
    with rl_triton.use_backend("torch"):
        want = fn(r, v, m)
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True, backend="eager")(r, v, m)
    for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want)), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("name", list(_calls()))
def test_fullgraph_on_cuda_matches_the_eager_kernels(name):
    fn = _calls()[name]
    r, v, m = token_batch(7, 13, "cuda")
    want = fn(r, v, m)
    torch._dynamo.reset()
    got = torch.compile(fn, fullgraph=True)(r, v, m)
    for g, w in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, want)), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)


def test_triton_backend_on_cpu_under_compile_says_why():
    fn = _calls()["gae"]
    r, v, m = token_batch(3, 5, "cpu")
    torch._dynamo.reset()
    with rl_triton.use_backend("triton"), pytest.raises(Exception, match="cannot run CPU tensors under torch.compile"):
        torch.compile(fn, fullgraph=True, backend="eager")(r, v, m)
