"""The public functions' call path: a validation cache hit that needs nothing but the launch goes straight
from the arguments to the cached launch (functional.py's fast paths). These tests check that it launches
exactly what the prepared path launches, that it still validates every call, that anything it does not
cover (other layouts, autograd, data checks, backends, ``plan=``) takes the prepared path, and that the
torch.compile op's own eager calls do not re-emit the op.

Launches are recorded instead of run (``launch._launch`` stubbed, CPU tensors on the kernel path), so the
arguments of each launch can be compared; the numbers themselves are the other test files' business.
"""

import dataclasses

import pytest
import torch

import rl_triton as R
from rl_triton import _config, _dispatch, _ops, _validation, ops
from rl_triton import functional as F
from rl_triton._discounts import hp
from rl_triton.kernels import launch, plans
from rl_triton.ops import gae

N, T = 5, 12


@pytest.fixture
def recorded(monkeypatch):
    """Calls on CPU tensors take the kernel path; each launch is recorded as (launch, index, args)."""
    rec = []
    monkeypatch.setattr(launch, "_launch", lambda built, i, args: rec.append((built, i, args)))
    monkeypatch.setattr(_config, "INTERPRET", True)
    _validation.clear_cache()
    with R.use_backend("auto"):
        yield rec
    _validation.clear_cache()


def _no_prepare(monkeypatch):
    """From here on, a call that reaches the prepared path fails."""

    def boom(*args, **kwargs):
        raise AssertionError("the fast path should have taken this call")

    monkeypatch.setattr(_dispatch, "prepare", boom)


def _inputs(shape=(N, T), dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)

    def f(*s):
        return torch.randn(*(s or shape), generator=g).to(dtype)

    flags = torch.rand(shape, generator=g) < 0.2
    return {
        "r": f(), "v": f(), "nv": f(), "boot": f(), "lv": f(*shape[:-1]), "term": flags, "trunc": ~flags & (f() > 1),
        "lp": f(), "probs": torch.softmax(f(*shape, 3), -1), "nq": f(*shape, 3),
        "act": torch.randint(0, 3, shape, generator=g), "mu": torch.rand(shape, generator=g) * 0.5 + 0.25,
    }  # fmt: skip


# name -> call(x) for every function with a fast path (the module helpers take [N, T, 1] tensors, rows=)
CALLS = {
    "gae": lambda x: R.compute_gae(x["r"], x["v"], x["term"], gamma=0.9, lambda_=0.8, last_value=x["lv"]),
    "gae_boot": lambda x: R.compute_gae(
        x["r"], x["v"], x["term"], x["trunc"], gamma=0.9, lambda_=0.8, bootstrap_values=x["boot"]
    ),
    "vtrace": lambda x: R.compute_vtrace(x["lp"], x["v"], x["v"], x["r"], x["term"], gamma=0.9, rho_bar=1.5),
    "retrace": lambda x: R.compute_retrace(
        x["probs"], x["mu"], x["v"], x["nq"], x["act"], x["r"], x["term"], x["trunc"], gamma=0.9, lambda_=0.7
    ),
    "returns": lambda x: R.compute_discounted_returns(
        x["r"], x["term"], x["trunc"], gamma=0.9, bootstrap_values=x["boot"]
    ),
    "lambda": lambda x: R.compute_lambda_returns(x["r"], x["nv"], x["term"], gamma=0.9, lambda_=0.7),
    "traces": lambda x: R.compute_eligibility_traces(x["r"], x["term"], gamma=0.9, lambda_=0.8, seed_values=x["lv"]),
    "prefix": lambda x: R.compute_episodic_prefix_sum(x["r"], x["term"], boundary="starts_at"),
    "gae_next": lambda x: F.gae_with_next_values(
        *(x[k][..., None] for k in ("r", "v", "nv", "term", "trunc")), gamma=0.9, lambda_=0.8, targets=True, rows=(N, T)
    ),
    "vtrace_next": lambda x: F.vtrace_with_next_values(
        x["lp"], x["v"], x["v"], x["nv"], x["r"], x["term"], x["trunc"], gamma=0.9
    ),
    "returns_adv": lambda x: F.returns_with_advantages(
        *(x[k][..., None] for k in ("r", "v", "term", "trunc")),
        gamma=0.9,
        lambda_=0.7,
        next_values=x["nv"][..., None],
        bootstrap_values=x["nv"][..., None],
        rows=(N, T),
    ),  # fmt: skip
}


def _same_launch(fast, slow, inputs: dict):
    """The two recorded launches are the same launch of the same kernel with the same arguments: the inputs
    (the same memory, viewed alike), fresh outputs of the same layout, equal ints and floats."""
    (built_f, i_f, args_f), (built_s, i_s, args_s) = fast, slow
    assert built_f is built_s and i_f == i_s
    assert len(args_f) == len(args_s)
    given = {t.untyped_storage().data_ptr() for t in inputs.values()}
    for a, b in zip(args_f, args_s, strict=True):
        if not isinstance(a, torch.Tensor):
            assert type(a) is type(b) and a == b
            continue
        assert (a.shape, a.stride(), a.dtype, a.device) == (b.shape, b.stride(), b.dtype, b.device)
        if a.untyped_storage().data_ptr() in given:
            assert a.data_ptr() == b.data_ptr()  # an input (or the dummy pointer standing for an absent one)
        else:  # an output of each call: both alive, so distinct
            assert b.untyped_storage().data_ptr() not in given and a.data_ptr() != b.data_ptr()


@pytest.mark.parametrize("name", list(CALLS))
@pytest.mark.parametrize("layout", ["contiguous", "time_major"])
def test_a_hit_launches_what_a_miss_launches(recorded, monkeypatch, name, layout):
    if layout == "time_major" and name in ("gae_next", "returns_adv"):
        pytest.skip("rows= calls take contiguous rows")
    # CPU actions are range-checked on every call and never cached; here they stand in for CUDA ones
    monkeypatch.setattr(_validation, "cacheable_actions", lambda actions: True)
    x = _inputs()
    if layout == "time_major":  # buffer.T of [T, N] buffers (and transpose(0, 1) of [T, N, A] ones)
        x = {k: v.transpose(0, 1).contiguous().transpose(0, 1) if v.dim() >= 2 else v for k, v in x.items()}
    first = CALLS[name](x)
    slow = list(recorded)
    assert slow, "the call should launch"
    (entry,) = _validation._CACHE.values()
    assert entry.direct and entry.time_major == (layout == "time_major")
    _no_prepare(monkeypatch)
    recorded.clear()
    second = CALLS[name](x)
    assert len(recorded) == len(slow)
    for fast, miss in zip(recorded, slow, strict=True):
        _same_launch(fast, miss, x)
    outs = (first, second) if isinstance(first, torch.Tensor) else (first[0], second[0])
    assert outs[0].shape == outs[1].shape and outs[0].stride() == outs[1].stride()


def test_fast_outputs_are_fresh(recorded, monkeypatch):
    x = _inputs()
    CALLS["gae_next"](x)
    _no_prepare(monkeypatch)
    a, b = CALLS["gae_next"](x), CALLS["gae_next"](x)
    ptrs = {t.data_ptr() for t in (*a, *b)}
    assert len(ptrs) == 4  # two outputs per call, none shared between calls or with each other
    assert a[0].shape == x["r"][..., None].shape  # rows= calls keep the callers' shape


def test_a_hit_still_validates(recorded):
    x = _inputs()
    r, v, term, lv = x["r"], x["v"], x["term"], x["lv"]
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8, last_value=lv)
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8, last_value=lv)  # a fast hit
    with pytest.raises(ValueError, match="'values' must have shape"):
        R.compute_gae(r, v[:, :-1], term, gamma=0.9, lambda_=0.8, last_value=lv)
    with pytest.raises(TypeError, match="share one dtype"):
        R.compute_gae(r, v.double(), term, gamma=0.9, lambda_=0.8, last_value=lv)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        R.compute_gae(r, v.tolist(), term, gamma=0.9, lambda_=0.8, last_value=lv)
    with pytest.raises(ValueError, match="'last_value' must have shape"):
        R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8, last_value=lv[:-1])
    for bad, error in [(1.5, ValueError), (-0.1, ValueError), (float("nan"), ValueError), (True, TypeError)]:
        with pytest.raises(error, match="gamma"):
            R.compute_gae(r, v, term, gamma=bad, lambda_=0.8, last_value=lv)
    with pytest.raises(ValueError, match="lambda_"):
        R.compute_gae(r, v, term, gamma=0.9, lambda_=2.0, last_value=lv)
    with pytest.raises(ValueError, match="not both"):
        R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8, last_value=lv, bootstrap_values=v)
    R.compute_vtrace(x["lp"], v, v, r, term, gamma=0.9)
    with pytest.raises(ValueError, match="rho_bar"):
        R.compute_vtrace(x["lp"], v, v, r, term, gamma=0.9, rho_bar=-1.0)
    with pytest.raises(ValueError, match="boundary"):
        R.compute_episodic_prefix_sum(r, term, boundary="ends")


def test_hyper_parameters_reach_the_launch(recorded):
    """A 0-d tensor and an int are accepted on a hit as on a miss, and each call's values are launched."""
    x = _inputs()
    r, v, term = x["r"], x["v"], x["term"]
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    for gamma, lam in [(torch.tensor(0.5), 1), (0.25, torch.tensor(0.0, dtype=torch.float64)), (1, 0)]:
        recorded.clear()
        R.compute_gae(r, v, term, gamma=gamma, lambda_=lam)
        ((_, _, args),) = recorded
        # each discount: a float's halves, then the pointer and strides a tensor's kernel reads
        assert args[10:12] == hp(float(gamma)) and args[15:17] == hp(float(lam))


def test_the_bootstrap_checks_run_on_every_call(recorded):
    """compute_gae's own argument checks do not depend on what the cache holds: a signature another caller
    had validated (here prepare called directly, as rl_triton's modules do) does not skip them."""
    x = _inputs()
    r, v, term, trunc, lv = x["r"], x["v"], x["term"], x["trunc"], x["lv"]
    _validation.prepare(
        "compute_gae", steps={"rewards": r, "values": v, "bootstrap_values": None},
        flags={"terminateds": term, "truncateds": trunc}, per_env={"last_value": lv},
        required=gae.REQUIRED,
    )  # fmt: skip
    with pytest.raises(ValueError, match="cannot be combined with 'truncateds'"):
        R.compute_gae(r, v, term, trunc, gamma=0.9, lambda_=0.8, last_value=lv)


def test_other_layouts_miss_the_cache(recorded):
    x = _inputs()
    r, v, term = x["r"], x["v"], x["term"]
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    assert len(_validation._CACHE) == 1
    misaligned = torch.empty(N * T + 1)[1:].view(N, T).copy_(r)  # 4 bytes past a 16-byte boundary
    recorded.clear()
    R.compute_gae(misaligned, v, term, gamma=0.9, lambda_=0.8)
    assert len(_validation._CACHE) == 2 and recorded[0][2][0] is misaligned
    R.compute_gae(r[0], v[0], term[0], gamma=0.9, lambda_=0.8)  # 1-D: its own entry
    assert len(_validation._CACHE) == 3
    R.compute_gae(r.double(), v.double(), term, gamma=0.9, lambda_=0.8)
    R.compute_gae(r, v, term.to(torch.uint8), gamma=0.9, lambda_=0.8)
    assert len(_validation._CACHE) == 5
    transposed = r.T.contiguous().T  # non-contiguous, and alone in its layout: copied, never cached
    recorded.clear()
    R.compute_gae(transposed, v, term, gamma=0.9, lambda_=0.8)
    assert len(_validation._CACHE) == 5 and recorded[0][2][0].is_contiguous()


def test_one_d_and_empty_calls_take_the_prepared_path(recorded):
    x = _inputs()
    r, v, term = x["r"], x["v"], x["term"]
    for _ in range(2):
        out = R.compute_gae(r[0], v[0], term[0], gamma=0.9, lambda_=0.8)
        assert out.shape == (T,)
        assert recorded[-1][2][0].shape == (1, T)  # the kernels read a 1-D call as one env
    (entry,) = _validation._CACHE.values()
    assert not entry.direct
    recorded.clear()
    for _ in range(2):
        assert R.compute_gae(r[:0], v[:0], term[:0], gamma=0.9, lambda_=0.8).shape == (0, T)
    assert not recorded


def test_autograd_takes_the_prepared_path(recorded):
    x = _inputs()
    r, v, term = x["r"], x["v"].requires_grad_(), x["term"]
    with torch.no_grad():
        R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
        assert R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8).grad_fn is None
    assert R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8).grad_fn is not None
    assert R.compute_gae(r, v.detach(), term, gamma=0.9, lambda_=0.8).grad_fn is None


def test_data_checks_run_on_a_cached_signature(recorded, monkeypatch):
    x = _inputs()
    r, v = x["r"], x["v"]
    term = x["term"].to(torch.uint8)
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    monkeypatch.setattr(_config, "CORRECTNESS_WARNINGS", True)
    term[0, 0] = 2
    with pytest.warns(UserWarning, match="values other than 0 and 1"):
        R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)


def test_perf_warnings_fire_on_every_copying_call(recorded, monkeypatch):
    monkeypatch.setattr(_config, "PERF_WARNINGS", True)
    x = _inputs()
    transposed = x["r"].T.contiguous().T
    for _ in range(2):
        with pytest.warns(UserWarning, match="contiguous"):
            R.compute_gae(transposed, x["v"], x["term"], gamma=0.9, lambda_=0.8)


def test_backends_are_chosen_per_call(recorded, monkeypatch):
    x = _inputs()
    r, v, term = x["r"], x["v"], x["term"]
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    recorded.clear()
    with R.use_backend("torch"):
        out = R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    assert not recorded and torch.isfinite(out).all()
    monkeypatch.setattr(_config, "INTERPRET", False)  # CPU tensors now take the PyTorch path
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    assert not recorded
    with R.use_backend("triton"), pytest.raises(RuntimeError, match="backend 'triton'"):
        R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)


def test_an_explicit_plan_is_launched_and_cached_beside_the_chosen_one(recorded):
    x = _inputs()
    r, v, term = x["r"], x["v"], x["term"]
    chosen = plans.choose("gae", N, T, torch.float32)
    other = dataclasses.replace(chosen, bt=2 * chosen.bt, exact_t=False, whole=False, shift=False)
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    recorded.clear()
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8, plan=other)
    assert recorded[0][0].launches[0][1]["BT"] == other.bt
    (entry,) = _validation._CACHE.values()
    assert ("gae", False, False, other) in entry.plans
    recorded.clear()
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    assert recorded[0][0] is entry.plans[gae.GAE.at]


# The plan kind each public function's calls have always taken (the launcher asks its Op's ``kind``)
KINDS = {
    "compute_gae": "gae", "compute_vtrace": "vtrace", "compute_retrace": "retrace",
    "compute_discounted_returns": "returns", "compute_lambda_returns": "returns_nv",
    "compute_eligibility_traces": "forward", "compute_episodic_prefix_sum": "forward",
}  # fmt: skip


def test_plan_kinds():
    assert {fn: ops.kind_of(fn) for fn in KINDS} == KINDS
    with pytest.raises(ValueError, match=r"kind must be one of .*got 'upgo'"):
        plans.choose("upgo", N, T, torch.float32)
    with pytest.raises(ValueError, match="no op of rl_triton.ops runs 'compute_upgo'"):
        ops.kind_of("compute_upgo")


def test_a_new_op_takes_an_existing_kinds_plans(recorded):
    """An op of a function plans.py does not know names an existing kind: its calls launch that kind's plans,
    kept under its own launch key."""
    x = _inputs()
    r, v, term = x["r"], x["v"], x["term"]
    new = gae.GAE.variant(fn="compute_new", at=("new",), kind=lambda t: "gae")
    R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8)
    _dispatch.call(new, (r, v, None, term, None, None), None, (0.9, 0.8))
    (old_launch, _, _), (new_launch, _, _) = recorded
    assert new_launch is not old_launch and new_launch.launches == old_launch.launches
    entry = next(e for e in _validation._CACHE.values() if ("new",) in e.plans)
    assert entry.plans[("new",)] is new_launch


def test_the_ops_eager_calls_do_not_emit_the_op_again(monkeypatch):
    """is_compiling() holds for a whole compile session (and in every thread): the op's implementation runs
    the public function eagerly all the same (tracing() is False there), instead of recursing into the op."""
    x = _inputs()
    want = R.compute_gae(x["r"], x["v"], x["term"], gamma=0.9, lambda_=0.8)
    emitted = []
    call = _ops.call
    monkeypatch.setattr(_ops, "call", lambda *a: emitted.append(a[0]) or call(*a))
    monkeypatch.setattr(torch.compiler, "_is_compiling_flag", True)
    got = R.compute_gae(x["r"], x["v"], x["term"], gamma=0.9, lambda_=0.8)
    assert emitted == ["compute_gae"] and _ops._LOCAL.eager == 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_fast_path_on_another_device():
    """Cached calls on cuda:1 launch there while cuda:0 is current, and give the PyTorch path's numbers."""
    _validation.clear_cache()
    x = {k: v.to("cuda:1") for k, v in _inputs(shape=(64, 512)).items()}
    with R.use_backend("torch"):
        want = R.compute_gae(x["r"].cpu(), x["v"].cpu(), x["term"].cpu(), gamma=0.9, lambda_=0.8)
    for _ in range(3):
        with torch.cuda.device(0):
            got = R.compute_gae(x["r"], x["v"], x["term"], gamma=0.9, lambda_=0.8)
        torch.testing.assert_close(got.cpu(), want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("keys", [{}, {"value": ("agents", "v"), "reward": ("agents", "r")}], ids=["str", "nested"])
def test_estimator_reads_the_entries_get_would_read(keys):
    """The estimators' fast path reads a tensordict level's entries in one go (items()): extra entries,
    a missing terminated entry (done stands in) and nested keys give what the general path gives."""
    TensorDict = pytest.importorskip("tensordict").TensorDict
    pytest.importorskip("torchrl")
    from rl_triton.modules import GAE, TDLambdaEstimator

    x = _inputs()
    col = {k: v[..., None] for k, v in x.items() if v.shape == (N, T)}
    agents = TensorDict({"v": col["v"] + 1, "r": col["r"] - 1}, [N, T])
    nxt = {"reward": col["r"], "state_value": col["nv"], "done": col["term"], "observation": torch.randn(N, T, 4),
           "agents": TensorDict({"v": col["nv"] * 2, "r": col["boot"]}, [N, T])}  # fmt: skip
    td = TensorDict(
        {"state_value": col["v"], "observation": torch.randn(N, T, 4), "agents": agents, "next": nxt}, [N, T]
    )
    for est in (
        GAE(gamma=0.9, lmbda=0.8, value_network=None),
        TDLambdaEstimator(gamma=0.9, lmbda=0.8, value_network=None),
    ):
        est.set_keys(**keys)
        with R.use_backend("torch"):
            general = est._forward(td.clone(False))
            est._forward = None  # the call below must take the fast path
            fast = est(td.clone(False))
        for key in ("advantage", "value_target"):
            torch.testing.assert_close(fast.get(key), general.get(key), rtol=0, atol=0)


def test_floors_time_each_call_with_a_synchronize(monkeypatch):
    """benchmarks.floors' wall times: every row called the given number of times, round-robin, each call
    followed by a synchronize (the issue's measure), and the median per row."""
    from benchmarks import floors, timing

    assert floors.WALL_CALLS >= 500
    calls, syncs = [], []
    monkeypatch.setattr(timing, "sync", lambda device: syncs.append(len(calls)))
    rows = [(name, lambda arg, name=name: calls.append(name), None, None) for name in ("a", "b")]
    us = floors.wall_us(rows, torch.device("cpu"), 500, rounds=10, warmup=0)
    assert len(us) == 2 and all(u > 0 for u in us)
    assert calls.count("a") == calls.count("b") == 500 and calls[:100] == ["a"] * 50 + ["b"] * 50
    assert syncs[1:] == list(range(1, 1001))  # one after each call (the first: after the warm-up)


def test_floors_record_the_ratio_to_torch_add():
    from benchmarks import baselines, floors, timing

    got = floors.measure(torch.device("cpu"), timing.CPU, (4, 16))
    rows = {r["name"]: r for r in got["rows"]}
    assert rows["torch.add"]["vs_add"] == 1.0
    assert all(r["wall_us"] > 0 and r["full_call_us"] > 0 for r in rows.values())
    functions = [r for r in got["rows"] if r.get("target") == floors.FUNCTION_TARGET]
    assert {r["name"] for r in functions} == {f"rl_triton.{name}" for name in R.__all__ if name.startswith("compute_")}
    estimators = [r for r in got["rows"] if r.get("target") == floors.ESTIMATOR_TARGET]
    if baselines.torchrl_available():  # the estimators' rows need TensorDict and TorchRL
        assert "rl_triton.modules.GAE" in [r["name"] for r in estimators]
    for r in functions + estimators:
        assert r["met"] == (r["vs_add"] <= r["target"])
    assert "| rl_triton.compute_gae |" in floors.table(got)
