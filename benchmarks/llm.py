"""The token-level estimators (``rl_triton.llm``) in the benchmark suite: their inputs, configurations,
float64 reference, baselines and the measurement of one configuration (one JSON row, the same schema as the
other functions' rows; see benchmarks/README.md, "Token-level estimators").

Functions (short names for ``--functions``; ``llm`` selects all four):

* ``llm_gae``: ``compute_gae_advantage_return(r, v, mask, gamma, lam)`` -> (advantages, returns)
* ``llm_rpp``: ``compute_reinforce_plus_plus_outcome_advantage(r, mask, gamma=gamma)`` -> (advantages, returns)
* ``llm_grpo``: ``compute_grpo_outcome_advantage(r, mask, index)`` -> (adv, adv)
* ``llm_rloo``: ``compute_rloo_outcome_advantage(r, mask, index)`` -> (adv, adv)

Two forms of our call: ``primary`` (bool mask, an int64 ``index`` tensor on the device: the fewest bytes, the
one kernel time, GB/s and the copy fraction are reported for, and what the vectorised baselines get) and
``verl`` (the inputs verl hands over: an int64 mask as sliced from the attention mask, the per-prompt uid
strings as a NumPy object array), which the loop baseline gets and is compared with.

Data: ``(B, T)`` rows right-padded to response lengths uniform in [T/4, T] (every 8th row full), with three
masked spans (tool output) of 1 .. max(2, T/64) tokens per row inside the response. GAE and REINFORCE++ get
standard normal rewards and values at every position (masked ones too: the formulas say what they do there);
GRPO and RLOO one standard normal outcome reward per sequence at its last valid token and zeros elsewhere,
sequences in consecutive groups of ``group_size`` (as verl repeats each prompt). gamma = 1, lam = 0.95.

Reference: rl_triton.llm's PyTorch path (``use_backend("torch")``) on float64 CPU copies of the whole inputs
(the whitening is over all tokens, so no exact sub-block exists); the tests validate that path against float64
loops of the formulas.
"""

from __future__ import annotations

import gc
import random
import statistics
import time
import traceback
import uuid
from dataclasses import dataclass

import torch

from . import baselines as B
from . import llm_impls, specs, timing

GAMMA = 1.0
LAM = 0.95
EPSILON = 1e-6
SPANS = 3  # masked (tool) spans per row

SCAN_SHAPES = ((256, 4096), (64, 32768), (1024, 1024), (8, 131072))
OUTCOME_BATCHES = (1024, 8192)
OUTCOME_STEPS = 1024
GROUPS = (8, 64)
CPU_SHAPE = (8, 16)
CPU_GROUP = 4

# the loop baselines: the first (checked) call is a sample, more while within this many seconds (at most
# LOOP_MAX_REPS): the longest loops (8x131072) run once
LOOP_BUDGET_S = {"full": 3.0, "quick": 1.0, "cpu": 0.05}
LOOP_MAX_REPS = 3


@dataclass(frozen=True)
class TokenSpec:
    name: str
    short: str
    outcome: bool  # GRPO / RLOO: one score per sequence, grouped by index
    n_out: int  # distinct output tensors written
    reads_values: bool = False

    def nbytes(self, x: TokenInputs) -> int:
        """Minimum bytes of the primary call: rewards (and values), the bool mask, the int64 index once;
        every distinct output written once."""
        keys = ["r_outcome" if self.outcome else "r", "mask"] + (["v"] if self.reads_values else [])
        keys += ["index"] if self.outcome else []
        es = torch.empty((), dtype=x.dtype).element_size()
        return x.nbytes(keys) + self.n_out * x.b * x.t * es


SPECS: dict[str, TokenSpec] = {
    s.name: s
    for s in [
        TokenSpec("compute_gae_advantage_return", "llm_gae", False, 2, reads_values=True),
        TokenSpec("compute_reinforce_plus_plus_outcome_advantage", "llm_rpp", False, 2),
        TokenSpec("compute_grpo_outcome_advantage", "llm_grpo", True, 1),
        TokenSpec("compute_rloo_outcome_advantage", "llm_rloo", True, 1),
    ]
}
ALIASES = {s.short: s.name for s in SPECS.values()} | {
    "gae_advantage_return": "compute_gae_advantage_return",
    "reinforce_plus_plus": "compute_reinforce_plus_plus_outcome_advantage",
    "grpo": "compute_grpo_outcome_advantage",
    "rloo": "compute_rloo_outcome_advantage",
}


def available() -> bool:
    try:
        import rl_triton.llm  # noqa: F401
    except Exception:
        return False
    return True


def split_functions(text: str | None) -> tuple[list[str], list[str]]:
    """``--functions`` -> (names of benchmarks.specs, token-level names). Default: all of both (the token-level
    ones only where rl_triton.llm imports)."""
    if not text:
        return specs.resolve(None), (list(SPECS) if available() else [])
    rl, tok = [], []
    for raw in text.split(","):
        name = raw.strip()
        if not name:
            continue
        if name == "llm":
            tok += [n for n in SPECS if n not in tok]
        elif name in SPECS or name in ALIASES:
            full = name if name in SPECS else ALIASES[name]
            if full not in tok:
                tok.append(full)
        else:
            rl += [n for n in specs.resolve(name) if n not in rl]
    return rl, tok


# --------------------------------------------------------------------------------------------
# inputs


class TokenInputs:
    """The tensors of one configuration, created on first use, each from its own seeded generator."""

    def __init__(self, b: int, t: int, dtype: torch.dtype, device, group_size: int | None = None):
        self.b, self.t, self.dtype, self.device = b, t, dtype, torch.device(device)
        self.group_size = group_size or 1
        self.num_groups = -(-b // self.group_size)
        self._cache: dict[str, object] = {}

    def _gen(self, key: str) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(specs._key_seed("llm:" + key))

    def _mask(self) -> torch.Tensor:
        b, t, dev = self.b, self.t, self.device
        g = self._gen("mask")
        length = torch.randint(max(1, t // 4), t + 1, (b,), generator=g, device=dev)
        length[::8] = t
        start = (torch.rand(b, SPANS, generator=g, device=dev) * length[:, None]).long()
        span = torch.randint(1, max(2, t // 64) + 1, (b, SPANS), generator=g, device=dev)
        edges = torch.zeros(b, t + 1, dtype=torch.int32, device=dev)  # +1 where a span starts, -1 after it
        one = torch.ones_like(start, dtype=torch.int32)
        edges.scatter_add_(1, start, one).scatter_add_(1, (start + span).clamp(max=t), -one)
        tool = torch.cumsum(edges, 1)[:, :t] > 0
        pos = torch.arange(t, device=dev)
        return (pos < length[:, None]) & ~tool

    def _make(self, key: str):
        b, t, dev = self.b, self.t, self.device
        if key in ("r", "v"):
            return torch.randn(b, t, generator=self._gen(key), device=dev).to(self.dtype)
        if key == "mask":
            return self._mask()
        if key == "mask_verl":
            return self["mask"].to(torch.int64)
        if key == "r_outcome":
            m = self["mask"]
            last = torch.where(m, torch.arange(t, device=dev), -1).max(1).values
            score = torch.randn(b, generator=self._gen(key), device=dev) * (last >= 0)
            out = torch.zeros(b, t, device=dev).scatter_(1, last.clamp(min=0)[:, None], score[:, None])
            return out.to(self.dtype)
        if key == "index":
            groups = torch.arange(self.num_groups, device=dev)
            return groups.repeat_interleave(self.group_size)[:b].contiguous()
        if key == "uid":  # verl's per-prompt uuid4 strings, repeated per response
            rng = random.Random(specs._key_seed("llm:uid"))
            uids = [str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(self.num_groups)]
            per_seq = [u for u in uids for _ in range(self.group_size)][:b]
            try:
                import numpy as np
            except ImportError:  # verl passes a NumPy object array; a list indexes the same way
                return per_seq
            return np.array(per_seq, dtype=object)
        raise KeyError(key)

    def __getitem__(self, key: str):
        if key not in self._cache:
            self._cache[key] = self._make(key)
        return self._cache[key]

    def nbytes(self, keys) -> int:
        return sum(self[k].numel() * self[k].element_size() for k in keys)

    def release(self) -> None:
        self._cache.clear()


class _F64:
    """float64 CPU copies of the inputs (masks and ids as stored), for the reference."""

    def __init__(self, x: TokenInputs):
        self._x = x
        self.b, self.t = x.b, x.t
        self._cache: dict[str, object] = {}

    def __getitem__(self, key: str):
        if key not in self._cache:
            v = self._x[key]
            if isinstance(v, torch.Tensor):
                v = v.cpu()
                v = v.double() if v.is_floating_point() else v
            self._cache[key] = v
        return self._cache[key]


# --------------------------------------------------------------------------------------------
# our calls


def _mask(x, form: str):
    return x["mask"] if form == "primary" else x["mask_verl"]


def call(spec: TokenSpec, x, form: str, check: bool = True) -> tuple:
    """Our call of ``spec`` in ``form`` (primary or verl) on ``x``. ``check=False``: the estimators that whiten
    skip their token-count check (a host sync; these masks always hold enough tokens), so the call can be
    captured in a CUDA graph."""
    from rl_triton import llm as L

    m = _mask(x, form)
    if spec.name == "compute_gae_advantage_return":
        return L.compute_gae_advantage_return(x["r"], x["v"], m, GAMMA, LAM, check=check)
    if spec.name == "compute_reinforce_plus_plus_outcome_advantage":
        return L.compute_reinforce_plus_plus_outcome_advantage(x["r"], m, gamma=GAMMA, check=check)
    index = x["index"] if form == "primary" else x["uid"]
    if spec.name == "compute_grpo_outcome_advantage":
        return L.compute_grpo_outcome_advantage(x["r_outcome"], m, index, epsilon=EPSILON)
    return L.compute_rloo_outcome_advantage(x["r_outcome"], m, index, epsilon=EPSILON)


def reference(spec: TokenSpec, x: TokenInputs) -> tuple[torch.Tensor, ...]:
    """float64 outputs on the whole inputs (rl_triton.llm's PyTorch path on CPU copies)."""
    import rl_triton as R

    with R.use_backend("torch"), torch.no_grad():
        return tuple(o.double() for o in call(spec, _F64(x), "primary"))


def kernel_us(fn, device: torch.device, budget: timing.Budget, *, unchecked=None) -> tuple[float, str]:
    """(µs, how): do_bench of a CUDA-graph replay of ``fn`` (how = "cuda_graph"), or of direct calls when it
    cannot be captured (how = "direct": host time included). ``unchecked``: the same call with ``check=False``
    (rl_triton.llm's count check reads the token count on the host, a sync no graph can hold), captured in its
    place (how = "cuda_graph, count check skipped"); the graph holds every kernel the call launches either way."""
    if device.type != "cuda":
        return timing.kernel_us(fn, device, budget), "cpu"
    import triton.testing

    graph, how = None, "cuda_graph"
    if unchecked is not None:
        graph = timing._graph_of(unchecked, device)
        how = "cuda_graph, count check skipped"
    if graph is None:
        graph, how = timing._graph_of(fn, device), "cuda_graph"
    target = fn if graph is None else graph.replay
    ms = triton.testing.do_bench(target, warmup=budget.bench_warmup_ms, rep=budget.bench_rep_ms, return_mode="median")
    return float(ms) * 1e3, "direct" if graph is None else how


class Context:
    def __init__(self, spec: TokenSpec, x: TokenInputs, opts: B.Options):
        self.spec, self.x, self.opts, self.device = spec, x, opts, x.device
        self.tol = specs.tolerance(x.dtype)
        self.window = specs.Window(x.b, 0, x.t, True)
        self._ref = None
        self.ours: dict[str, dict] = {}

    def check(self, outputs) -> tuple[float, float]:
        if self._ref is None:
            self._ref = reference(self.spec, self.x)
        return specs.error(outputs, self._ref, self.window)

    def ours_call_us(self, form: str) -> dict:
        if form not in self.ours:
            with torch.no_grad():
                out = call(self.spec, self.x, form)
                timing.sync(self.device)
                max_abs, err = self.check(out)
                del out
                us = timing.full_call_us(lambda _: call(self.spec, self.x, form), self.device, self.opts.budget)
            self.ours[form] = {"full_call_us": us, "max_abs_err": max_abs, "err": err, "correct": err <= self.tol}
        return self.ours[form]


# --------------------------------------------------------------------------------------------
# baselines


def _mode(opts: B.Options) -> str:
    return "cpu" if opts.device.type == "cpu" else ("quick" if opts.quick else "full")


def _timed_us(fn, device: torch.device) -> tuple[float, object]:
    """One synchronised call: (µs, its output); CUDA events on the GPU."""
    timing.sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        out = fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3, out
    t0 = time.perf_counter()
    out = fn()
    return (time.perf_counter() - t0) * 1e6, out


def _inputs_for(spec: TokenSpec, x, form: str) -> tuple:
    """The tensors a baseline gets, in its argument order."""
    m = _mask(x, form)
    if spec.name == "compute_gae_advantage_return":
        return x["r"], x["v"], m
    if spec.name == "compute_reinforce_plus_plus_outcome_advantage":
        return x["r"], m
    return x["r_outcome"], m, (x["index"] if form == "primary" else x["uid"])


class _Baseline:
    name = ""
    label = ""
    ours_form = "primary"

    def applies(self, spec: TokenSpec) -> bool:
        return True

    def skip_reason(self, spec: TokenSpec, opts: B.Options) -> str | None:
        return None

    def _result(self, ctx: Context, **extra) -> dict:
        return {"name": self.name, "label": self.label, "ours": self.ours_form} | extra

    def _finish(self, ctx: Context, res: dict) -> dict:
        ours = ctx.ours_call_us(self.ours_form)
        res["ours_full_call_us"] = ours["full_call_us"]
        res["speedup"] = res["full_call_us"] / ours["full_call_us"]
        return res | {"status": "ok"}


class VerlLoop(_Baseline):
    """verl's formulas as Python loops (benchmarks.llm_impls.LOOPS) on verl's inputs."""

    name = "verl_loop"
    label = "verl-style Python loop"
    ours_form = "verl"

    def _args(self, spec, x):
        if spec.name == "compute_gae_advantage_return":
            return (*_inputs_for(spec, x, "verl"), GAMMA, LAM)
        if spec.name == "compute_reinforce_plus_plus_outcome_advantage":
            return (*_inputs_for(spec, x, "verl"), GAMMA)
        return (*_inputs_for(spec, x, "verl"), EPSILON)

    def measure(self, ctx: Context) -> dict:
        spec, x = ctx.spec, ctx.x
        fn = llm_impls.LOOPS[spec.name]
        args = self._args(spec, x)
        if spec.outcome:
            small = (args[0][:16], args[1][:16], args[2][:16], EPSILON)
        else:  # an all-valid mask: a slice of the real one may hold fewer than the two tokens whitening needs
            small = [a[:2, :32] if isinstance(a, torch.Tensor) else a for a in args]
            at = 2 if spec.reads_values else 1  # the mask's place: (r, v, mask, ...) or (r, mask, ...)
            small[at] = torch.ones_like(small[at])
        res = self._result(ctx)
        budget = LOOP_BUDGET_S[_mode(ctx.opts)]
        try:
            fn(*small)  # warm-up on a slice: the kernels and the allocator, not the loop
            first, out = _timed_us(lambda: fn(*args), ctx.device)
            max_abs, err = ctx.check(out)
            del out
        except Exception as exc:
            return res | {"status": "failed", "reason": B._fmt_exc(exc), "traceback": traceback.format_exc(limit=4)}
        res |= {"max_abs_err": max_abs, "err": err}
        if not err <= ctx.tol:
            return res | {"status": "incorrect", "reason": f"error {err:.2e} > tolerance {ctx.tol:.0e}"}
        samples = [first]  # the checked call is the first sample: a loop of 10 s is not run 5 times
        while len(samples) < LOOP_MAX_REPS and (sum(samples) + samples[-1]) * 1e-6 <= budget:
            samples.append(_timed_us(lambda: fn(*args), ctx.device)[0])
        res |= {"full_call_us": statistics.median(samples), "reps": len(samples)}
        res = self._finish(ctx, res)
        res["speedup_primary"] = res["full_call_us"] / ctx.ours_call_us("primary")["full_call_us"]
        return res


class Vectorised(_Baseline):
    """The loop-free PyTorch estimators (benchmarks.llm_impls), eager."""

    name = "torch_vec"
    label = "vectorised PyTorch"
    compiled = False

    def _fn(self, ctx: Context):
        x = ctx.x
        return llm_impls.make_vectorised(
            ctx.spec.name, x.t, x.device, x.dtype, gamma=GAMMA, lam=LAM, num_groups=x.num_groups, epsilon=EPSILON
        )

    def _prepare(self, ctx: Context, fn):
        return fn

    def measure(self, ctx: Context) -> dict:
        res = self._result(ctx, compiled=self.compiled)
        args = _inputs_for(ctx.spec, ctx.x, "primary")
        try:
            fn = self._prepare(ctx, self._fn(ctx))
            t0 = time.perf_counter()
            with torch.no_grad():
                out = fn(*args)
                timing.sync(ctx.device)
            if self.compiled:
                res["compile_s"] = time.perf_counter() - t0
            max_abs, err = ctx.check(out)
            del out
        except Exception as exc:
            return res | {"status": "failed", "reason": B._fmt_exc(exc), "traceback": traceback.format_exc(limit=4)}
        res |= {"max_abs_err": max_abs, "err": err}
        if not err <= ctx.tol:
            return res | {"status": "incorrect", "reason": f"error {err:.2e} > tolerance {ctx.tol:.0e}"}
        with torch.no_grad():
            res["full_call_us"] = timing.full_call_us(lambda _: fn(*args), ctx.device, ctx.opts.budget)
            res["kernel_us"], res["kernel_timing"] = kernel_us(lambda: fn(*args), ctx.device, ctx.opts.budget)
        return self._finish(ctx, res)


class CompiledVectorised(Vectorised):
    """``torch.compile(dynamic=False, fullgraph=True)`` of the vectorised estimators (uncompiled on the CPU
    unless --compile-on-cpu, as the other functions' compile baseline)."""

    name = "compile"
    label = "torch.compile (vectorised PyTorch)"
    compiled = True

    def skip_reason(self, spec, opts):
        if opts.quick and spec.name != "compute_gae_advantage_return" and opts.baselines is None:
            return "--quick: torch.compile for compute_gae_advantage_return only"
        return None

    def measure(self, ctx: Context) -> dict:
        self.compiled = ctx.device.type == "cuda" or ctx.opts.compile_on_cpu
        self.label = CompiledVectorised.label if self.compiled else "vectorised PyTorch (NOT compiled: --device cpu)"
        return super().measure(ctx)

    def _prepare(self, ctx, fn):
        if not self.compiled:
            return fn
        B._raise_recompile_limits()
        return torch.compile(fn, dynamic=False, fullgraph=True)


BASELINES: dict[str, _Baseline] = {b.name: b for b in [VerlLoop(), Vectorised(), CompiledVectorised()]}


def resolve_baselines(text: str | None) -> tuple[str, ...] | None:
    """``--baselines`` over both sets (benchmarks.baselines and these)."""
    if not text:
        return None
    out = tuple(n.strip() for n in text.split(",") if n.strip())
    known = list(B.BASELINES) + [n for n in BASELINES if n not in B.BASELINES]
    unknown = [n for n in out if n not in known]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; known: {', '.join(known)}")
    return out


# --------------------------------------------------------------------------------------------
# configurations and targets


@dataclass(frozen=True)
class Config:
    function: str
    num_envs: int  # B, sequences
    seq_len: int  # T, token positions
    dtype: str
    family: str  # "llm", "quick", "custom"
    group_size: int | None = None

    def describe(self) -> str:
        g = f" groups of {self.group_size}" if self.group_size else ""
        return f"{self.function} {self.num_envs}x{self.seq_len}{g} {self.dtype}"


def configs(functions, *, quick=False, device_type="cuda", shapes=None, dtypes=None, groups=None) -> list[Config]:
    """Token-level configurations: the default set (module docstring), ``quick`` (the target shapes only), the
    CPU smoke shape, or ``shapes`` (``(B, T)`` pairs; GRPO / RLOO in groups of each of ``groups``)."""
    dtypes = list(dtypes or ["float32"])
    groups = tuple(groups or GROUPS)
    out = []
    for fn in functions:
        spec = SPECS[fn]
        if shapes is not None:
            cases = [(b, t, g if spec.outcome else None) for b, t in shapes for g in (groups if spec.outcome else [0])]
            fam = "custom"
        elif device_type == "cpu":
            cases, fam = [(*CPU_SHAPE, CPU_GROUP if spec.outcome else None)], "custom"
        elif quick:
            cases = [(8192, OUTCOME_STEPS, GROUPS[0])] if spec.outcome else [(64, 32768, None)]
            fam = "quick"
        else:
            fam = "llm"
            if spec.outcome:
                cases = [(b, OUTCOME_STEPS, g) for b in OUTCOME_BATCHES for g in groups]
            else:
                cases = [(b, t, None) for b, t in SCAN_SHAPES]
        out += [Config(fn, b, t, d, fam, g) for d in dtypes for b, t, g in cases]
    return out


# (function, applies(B, T), metric, comparison, threshold, label). Metric "speedup:NAME": baseline NAME's speedup
# (our call on the same inputs); "speedup_primary:NAME": its full call over our primary call's
_GAE_AT = (64, 32768)
TARGETS = [
    ("compute_gae_advantage_return", lambda b, t: (b, t) == _GAE_AT, "fraction_of_copy", ">=", 0.75,
     "kernel >= 0.75 of the copy of its minimal bytes"),
    ("compute_gae_advantage_return", lambda b, t: (b, t) == _GAE_AT, "speedup:verl_loop", ">=", 1000.0,
     ">= 1000x the verl-style loop (full calls, verl's inputs)"),
    ("compute_gae_advantage_return", lambda b, t: (b, t) == _GAE_AT, "speedup_primary:verl_loop", ">=", 1000.0,
     ">= 1000x the verl-style loop (ours on bool mask)"),
]  # fmt: skip
for _fn in ("compute_grpo_outcome_advantage", "compute_rloo_outcome_advantage"):
    TARGETS += [
        (_fn, lambda b, t: b == 8192, "kernel_us", "<=", 50.0, "kernel <= 50 us"),
        (_fn, lambda b, t: b == 8192, "speedup:verl_loop", ">=", 100.0,
         ">= 100x the verl-style loop (full calls, verl's inputs: uid strings)"),
        (_fn, lambda b, t: b == 8192, "speedup_primary:verl_loop", ">=", 100.0,
         ">= 100x the verl-style loop (ours on an int64 index tensor)"),
    ]  # fmt: skip


def targets(row: dict) -> list[dict]:
    """The targets that apply to ``row``, each with the measured value and whether it was met (None when the
    value is missing, e.g. a baseline that failed)."""
    out = []
    for fn, applies, metric, op, threshold, label in TARGETS:
        if row["function"] != fn or not applies(row["num_envs"], row["seq_len"]):
            continue
        if metric.startswith("speedup"):
            key, _, name = metric.partition(":")
            b = next((b for b in row.get("baselines", []) if b["name"] == name and b.get("status") == "ok"), None)
            value = None if b is None else b.get(key)
        else:
            value = row.get(metric)
        met = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        out.append({"target": label, "metric": metric, "op": op, "threshold": threshold, "value": value, "met": met})
    return out


def meta() -> dict:
    return {
        "gamma": GAMMA,
        "lam": LAM,
        "epsilon": EPSILON,
        "data": "right padding to lengths uniform in [T/4, T] (every 8th row full), "
        f"{SPANS} masked spans of 1..max(2, T/64) tokens per row; GAE/REINFORCE++: N(0,1) rewards and values; "
        "GRPO/RLOO: one N(0,1) outcome reward at the last valid token, consecutive groups",
        "forms": "primary: bool mask, int64 index tensor; verl: int64 mask, uid strings (NumPy object array)",
        "loop_timing": f"the checked call is the first sample; more while within {LOOP_BUDGET_S} s, at most "
        f"{LOOP_MAX_REPS}; median",
    }


# --------------------------------------------------------------------------------------------
# one configuration


def _free(device: torch.device) -> None:
    """Frees the GPU memory of the previous measurement (a CPU smoke run skips gc.collect: ~0.5 s a call
    there with TorchRL imported, and nothing to give back)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()


def measure(cfg: Config, opts: B.Options) -> dict:
    """Checks our primary call, our verl-form call and every applicable baseline against the float64 reference,
    then times them. Returns one JSON row (the schema of suite.measure's, plus group_size, num_groups,
    kernel_timing, copy_us and targets)."""
    from .suite import DTYPES, base_row

    spec = SPECS[cfg.function]
    x = TokenInputs(cfg.num_envs, cfg.seq_len, DTYPES[cfg.dtype], opts.device, cfg.group_size)
    ctx = Context(spec, x, opts)
    row = base_row(cfg, ctx)
    if spec.outcome:
        row |= {"group_size": x.group_size, "num_groups": x.num_groups}
    try:
        ours = ctx.ours_call_us("primary")
        with torch.no_grad():
            k_us, how = kernel_us(
                lambda: call(spec, x, "primary"),
                opts.device,
                opts.budget,
                unchecked=lambda: call(spec, x, "primary", check=False),
            )
        nbytes = spec.nbytes(x)
        copy = timing.copy_gbps(nbytes, opts.device, opts.budget)
        gbps = nbytes / (k_us * 1e-6) / 1e9
        row |= {
            "correct": ours["correct"],
            "max_abs_err": ours["max_abs_err"],
            "err": ours["err"],
            "kernel_us": k_us,
            "kernel_timing": how,
            "full_call_us": ours["full_call_us"],
            "bytes": nbytes,
            "GBps": gbps,
            "copy_GBps": copy,
            "copy_us": nbytes / (copy * 1e3),
            "fraction_of_copy": gbps / copy,
        }
        row["baselines"] = []
        for name, baseline in BASELINES.items():
            if opts.baselines is not None and name not in opts.baselines:
                continue
            skip = baseline.skip_reason(spec, opts)
            if skip:
                row["baselines"].append({"name": name, "label": baseline.label, "status": "skipped", "reason": skip})
                continue
            try:
                row["baselines"].append(baseline.measure(ctx))
            except torch.cuda.OutOfMemoryError as exc:
                row["baselines"].append(
                    {"name": name, "label": baseline.label, "status": "failed", "reason": f"OOM: {exc}"[:300]}
                )
            _free(opts.device)
        for b in row["baselines"]:
            if b.get("status") == "ok" and b.get("kernel_us") and b.get("ours") == "primary":
                b["speedup_kernel"] = b["kernel_us"] / k_us
        row["ours_forms"] = ctx.ours
        row["targets"] = targets(row)
    finally:
        x.release()
        del ctx
        _free(opts.device)
    return row
