"""The estimators and transforms under torch.compile: ``fullgraph=True`` with their inputs in the tensordict (no
value network), the numbers of eager calls, and compiled TorchRL losses with no more graph breaks or recompiles
with ours than with TorchRL's own estimator, counted in the same test. Compiled with Dynamo's ``eager`` backend
(graph breaks and recompiles are Dynamo's; the CUDA tests at the end use inductor)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch._dynamo.testing import CompileCounter
from torch._dynamo.utils import counters
from torchrl.objectives import A2CLoss, ClipPPOLoss
from torchrl.objectives import value as trl

import rl_triton
from rl_triton import modules as rtm
from tests.conftest import PATHS
from tests.modules._rollouts import assert_tensor_close, rollout
from tests.modules.test_losses import actor_critic, batch
from tests.modules.test_retrace_module import retrace_rollout
from tests.modules.test_vtrace_module import add_behaviour, make_actor

GAMMA, LMBDA = 0.9, 0.95


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _estimators(device):
    """(name, module, tensordict maker) for each estimator whose inputs can all be in the tensordict."""

    def values(shape=(3, 13)):
        return rollout(shape, device=device, values=True)

    return [
        ("GAE", rtm.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None), values),
        ("GAE-average", rtm.GAE(gamma=GAMMA, lmbda=LMBDA, value_network=None, average_gae=True), values),
        ("TD0", rtm.TD0Estimator(gamma=GAMMA, value_network=None), values),
        ("TD1", rtm.TD1Estimator(gamma=GAMMA, value_network=None), values),
        ("TDLambda", rtm.TDLambdaEstimator(gamma=GAMMA, lmbda=LMBDA, value_network=None), values),
        ("Retrace", rtm.Retrace(gamma=GAMMA), lambda: retrace_rollout((3, 13), device=device)),
    ]


ESTIMATORS = [name for name, *_ in _estimators("cpu")]


@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_fullgraph(path, name):
    (module, make) = next((m, f) for n, m, f in _estimators(path.device) if n == name)
    td = make()
    want = module(td.clone())
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    got = compiled(td.clone())
    for key in ("advantage", "value_target"):
        if key in want.keys():
            assert_tensor_close(got[key], want[key], what=key)


def test_estimator_fullgraph_vtrace_as_torchrl(path):
    """TorchRL's VTrace does not compile with fullgraph=True (its actor call raises inside Dynamo); ours breaks the
    graph no more often, with the numbers of its eager calls (TorchRL's own differ: it scores a freshly drawn
    action, tests/modules/test_vtrace_module.py)."""
    actor = make_actor(device=path.device)
    td = rollout((3, 13), device=path.device, values=True)
    add_behaviour(td, actor)
    breaks = {}
    for cls in (trl.VTrace, rtm.VTrace):
        module = cls(gamma=GAMMA, actor_network=actor, value_network=None)
        breaks[cls], got = _breaks(torch.compile(module, backend="eager"), td.clone())
    assert breaks[rtm.VTrace] <= breaks[trl.VTrace]
    want = module(td.clone())
    for key in ("advantage", "value_target"):
        assert_tensor_close(got[key], want[key], what=key)


def _breaks(fn, *args):
    """(graph breaks, output) of the first call of a compiled ``fn``."""
    torch._dynamo.reset()
    counters.clear()
    out = fn(*args)
    return sum(counters["graph_break"].values()), out


def test_multi_agent_gae_fullgraph(path):
    td = rollout((3, 13), device=path.device, values=True)
    module = rtm.MultiAgentGAE(gamma=GAMMA, lmbda=LMBDA, value_network=None)
    want = module(td.clone())
    got = torch.compile(module, fullgraph=True, backend="eager")(td.clone())
    assert_tensor_close(got["advantage"], want["advantage"], what="advantage")


@pytest.mark.parametrize("gamma", [0.9, 1.0])
def test_reward2go_fullgraph(path, gamma):
    """Our part of the transform compiles whole; ``inv`` as a whole breaks where TorchRL's does (its own check that
    every row has an episode end reads the data), no more often."""
    from torchrl.envs.transforms import Reward2GoTransform as TorchRLReward2Go

    from tests.modules.test_reward2go import episodes

    td = episodes((3, 17), "random", path.device)
    transform = rtm.Reward2GoTransform(gamma=gamma)
    want = transform.inv(td.clone())
    reward, done = td["next", "reward"], td["next", "done"]
    got = torch.compile(transform._inv_apply_transform, fullgraph=True, backend="eager")(reward, done)
    assert_tensor_close(got, want["next", "reward"], what="reward to go")
    ours, got = _breaks(torch.compile(transform.inv, backend="eager"), td.clone())
    theirs, _ = _breaks(torch.compile(TorchRLReward2Go(gamma=gamma).to(path.device).inv, backend="eager"), td.clone())
    assert ours <= theirs
    assert_tensor_close(got["next", "reward"], want["next", "reward"], what="reward to go")


def test_token_gae_fullgraph(path):
    from tests.llm.conftest import token_batch
    from tests.modules.test_llm_modules import _td

    r, v, m = token_batch(6, 11, path.device)
    module = rtm.TokenGAE(gamma=0.9, lmbda=0.8)
    want = module(_td(r, v, m))
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    if path.name == "interpret":
        with pytest.raises(Exception, match="cannot run CPU tensors under torch.compile"):
            compiled(_td(r, v, m))
        return
    got = compiled(_td(r, v, m))
    assert_tensor_close(got["advantage"], want["advantage"], what="advantage")


@pytest.mark.parametrize("kind", ["grpo", "rloo"])
def test_group_advantage_fullgraph(path, kind):
    from tests.llm.conftest import token_batch
    from tests.modules.test_llm_modules import _group_td

    r, _, m = token_batch(7, 11, path.device)
    ids = torch.tensor([3, 3, 7, 3, 7, 7, 9], device=path.device)
    module = rtm.GroupAdvantage(kind)
    want = module(_group_td(r, m, ids))
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    if path.name == "interpret":  # the kernels asked for on CPU tensors: the interpreter, which cannot be traced
        with pytest.raises(Exception, match="cannot run CPU tensors under torch.compile"):
            compiled(_group_td(r, m, ids))
        return
    got = compiled(_group_td(r, m, ids))
    assert_tensor_close(got["advantage"], want["advantage"], what="advantage")


LOSSES = {"ClipPPO": ClipPPOLoss, "A2C": A2CLoss}


def _loss(loss_name, estimator, actor, critic):
    loss = LOSSES[loss_name](actor_network=copy.deepcopy(actor), critic_network=copy.deepcopy(critic))
    if estimator is rtm.VTrace or estimator is trl.VTrace:  # IMPALA: A2C with V-trace
        loss.make_value_estimator(
            estimator(gamma=GAMMA, actor_network=loss.actor_network, value_network=loss.critic_network)
        )
    else:
        loss.make_value_estimator(estimator(gamma=GAMMA, lmbda=LMBDA, value_network=loss.critic_network))
    return loss


CASES = {"ClipPPO-GAE": ("ClipPPO", "GAE"), "A2C-GAE": ("A2C", "GAE"), "IMPALA-A2C-VTrace": ("A2C", "VTrace")}
# Each case compiles two losses (about 30 s of a CI core): every loss on the GPU; on the CPU the PPO and IMPALA losses
# on the PyTorch path (A2C's GAE case traces the same estimator code as PPO's). The interpreter adds no compile of
# its own: Dynamo's trace of a public function is the op (rl_triton/_ops.py) whatever the backend, so the losses
# compiled on the PyTorch path are called again with the interpreted kernels inside the op, which must neither
# recompile them nor change the numbers of the eager loss under the interpreter.
_CPU_LOSSES = ("ClipPPO-GAE", "IMPALA-A2C-VTrace")
LOSS_CASES = [
    pytest.param(p, *case, id=f"{p}-{name}")
    for p in PATHS
    if p != "interpret"
    for name, case in CASES.items()
    if p == "cuda" or name in _CPU_LOSSES
]


@pytest.mark.parametrize(("path", "loss_name", "estimator"), LOSS_CASES, indirect=["path"])
def test_loss_graph_breaks_and_recompiles(path, loss_name, estimator):
    """A compiled loss with our estimator: no more graph breaks than with TorchRL's (first call), and no more
    recompiles than TorchRL's over calls with new data, a new gamma in the buffer and a new rollout length; the
    same loss values as our eager loss. On the PyTorch path, where the interpreter is on, the compiled loss then
    runs the interpreted kernels: no recompile, the eager loss's values under the interpreter."""
    actor, critic = actor_critic(path.device)
    rollouts = [batch(actor, path.device, t) for t in (19, 19, 19, 23)]
    found = {}
    for name, cls in (("ours", getattr(rtm, estimator)), ("torchrl", getattr(trl, estimator))):
        loss = _loss(loss_name, cls, actor, critic)
        torch._dynamo.reset()
        counters.clear()
        counter = CompileCounter()
        # static shapes: with dynamic ones a new rollout length fails inside TorchRL's vmapped value-network call
        # (with TorchRL's estimator too)
        compiled = torch.compile(loss, backend=counter, dynamic=False)
        outs = [compiled(rollouts[0].clone())]
        first_breaks = sum(counters["graph_break"].values())
        first_frames = counter.frame_count
        outs.append(compiled(rollouts[1].clone()))  # new data
        with torch.no_grad():
            loss.value_estimator.gamma.fill_(0.8)  # a new gamma in the buffer
        outs.append(compiled(rollouts[2].clone()))
        outs.append(compiled(rollouts[3].clone()))  # a new rollout length
        found[name] = (first_breaks, counter.frame_count - first_frames, loss, outs)
        if name == "ours" and path.name == "torch" and rl_triton.INTERPRET:
            _interpreted_in_compiled_loss(compiled, counter, loss, batch(actor, path.device, 23))
    (breaks, recompiles, loss, outs), (trl_breaks, trl_recompiles, *_) = found["ours"], found["torchrl"]
    print(f"{path.name} {loss_name}-{estimator}: graph breaks {breaks} (TorchRL {trl_breaks}), "
          f"recompiles {recompiles} (TorchRL {trl_recompiles})")  # fmt: skip
    assert breaks <= trl_breaks, (breaks, trl_breaks)
    assert recompiles <= trl_recompiles, (recompiles, trl_recompiles)
    want = loss(rollouts[-1].clone())
    for key in want.keys():
        if key.startswith("loss_"):
            assert_tensor_close(outs[-1][key], want[key], what=key)


def _interpreted_in_compiled_loss(compiled, counter, loss, td):
    """The loss compiled on the PyTorch path, called with the interpreter on: the same graphs (no recompile), the
    interpreted kernels inside the op, the eager loss's values under the interpreter."""
    from rl_triton.kernels import launch

    frames, launches, run = counter.frame_count, [], launch._launch
    with rl_triton.use_backend("triton"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(launch, "_launch", lambda *a: launches.append(1) or run(*a))
        got = compiled(td.clone())
        assert launches, "no kernel launched in the compiled loss"
        want = loss(td.clone())
    assert counter.frame_count == frames, "the interpreter recompiled the loss"
    for key in want.keys():
        if key.startswith("loss_"):
            assert_tensor_close(got[key], want[key], what=f"{key} (interpreter)")


# ------------------------------------------------------------------------------------------------ GPU, inductor


@pytest.mark.cuda
@pytest.mark.parametrize("name", ESTIMATORS)
def test_estimator_fullgraph_inductor_cuda(name):
    module, make = next((m, f) for n, m, f in _estimators("cuda") if n == name)
    module = module.to("cuda")
    td = make()
    want = module(td.clone())
    got = torch.compile(module, fullgraph=True)(td.clone())
    for key in ("advantage", "value_target"):
        if key in want.keys():
            assert_tensor_close(got[key], want[key], what=key)


@pytest.mark.cuda
@pytest.mark.parametrize(("loss_name", "estimator"), list(CASES.values()), ids=list(CASES))
def test_loss_graph_breaks_inductor_cuda(loss_name, estimator):
    actor, critic = actor_critic("cuda")
    td = batch(actor, "cuda")
    found = {}
    for name, cls in (("ours", getattr(rtm, estimator)), ("torchrl", getattr(trl, estimator))):
        loss = _loss(loss_name, cls, actor, critic).to("cuda")
        found[name] = _breaks(torch.compile(loss), td.clone())
    print(f"cuda inductor {loss_name}-{estimator}: graph breaks {found['ours'][0]} (TorchRL {found['torchrl'][0]})")
    assert found["ours"][0] <= found["torchrl"][0], (found["ours"][0], found["torchrl"][0])
    want = loss_of(loss_name, getattr(rtm, estimator), actor, critic, td)
    for key in want.keys():
        if key.startswith("loss_"):
            assert_tensor_close(found["ours"][1][key], want[key], what=key)


def loss_of(loss_name, cls, actor, critic, td):
    return _loss(loss_name, cls, actor, critic)(td.clone())


@pytest.mark.cuda
def test_loss_cuda_graphs_reduce_overhead():
    """The whole compiled ClipPPO loss with our GAE in CUDA graphs: replays with new data and a new gamma in the
    buffer give the eager loss's numbers."""
    actor, critic = actor_critic("cuda")
    loss = _loss("ClipPPO", rtm.GAE, actor, critic).to("cuda")  # the gamma buffer too: read on the device
    compiled = torch.compile(loss, mode="reduce-overhead")
    for step in range(4):
        if step == 2:
            with torch.no_grad():
                loss.value_estimator.gamma.fill_(0.8)
        td = batch(actor, "cuda")
        got = {k: v.clone() for k, v in compiled(td.clone()).items() if k.startswith("loss_")}
        want = loss(td.clone())
        for key, value in got.items():
            assert_tensor_close(value, want[key], what=f"{key} at call {step}")
