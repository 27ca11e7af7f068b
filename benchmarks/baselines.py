"""Baselines and the rl_triton calls they are paired with.

Every baseline computes the same numbers as one rl_triton *form* (see :mod:`benchmarks.specs`):

===================  =====================================================================  ===================
name                 what                                                                   compared with
===================  =====================================================================  ===================
torchrl_vec          TorchRL's vectorised functional: ``vec_generalized_advantage_estimate``,  TorchRL-form call
                     ``vec_td_lambda_return_estimate``, ``reward2go``
torchrl_loop         TorchRL's loop functional: ``generalized_advantage_estimate``,            TorchRL-form call
                     ``vtrace_advantage_estimate``, ``td_lambda_return_estimate``
torchrl_module       TorchRL's ``GAE`` (default, loop) / ``VTrace`` module on a TensorDict     rl_triton.modules
torchrl_module_vec   TorchRL's ``GAE(vectorized=True)``                                        rl_triton.modules.GAE
eager                a Python loop over time (benchmarks.torch_impls.EAGER)                    primary call
compile              ``torch.compile`` of the vectorised scans (benchmarks.torch_impls),       primary call
                     the fastest correct of the variants tried
loop_path            rl_triton's PyTorch path with its scan as a loop over time (CPU only)     primary call
===================  =====================================================================  ===================

TorchRL gets its usual layout: ``[N, T, 1]`` tensors (views of the same data), ``time_dim=-2``,
``done = term | trunc`` and ``terminated = term``. The modules get TensorDicts with
``state_value`` and ``("next", ...)`` entries and ``value_network=None``; V-trace's actor is a
``Categorical`` over stored logits and the stored action is its mode, the one case where TorchRL's
module (which scores a freshly drawn action, see rl_triton.modules.VTrace) and ours agree.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass

import torch

from . import specs, timing, torch_impls
from .specs import Inputs, Spec
from .torch_impls import C_BAR, GAMMA, LAMBDA, RHO_BAR

LOOP_MAX_STEPS = 4096  # Python loops over time are skipped beyond this many steps
QUICK_EAGER_MAX_STEPS = 512  # ... and, in --quick, the eager loop beyond this many
QUICK_CHUNKED_MIN_STEPS = 1 << 16  # --quick tries the chunked scan only for rows at least this long


def torchrl_available() -> bool:
    try:
        import tensordict  # noqa: F401
        import torchrl.objectives.value.functional  # noqa: F401
    except Exception:
        return False
    return True


# --------------------------------------------------------------------------------------------
# measurement context of one configuration


@dataclass
class Options:
    device: torch.device
    quick: bool = False
    budget: timing.Budget = timing.FULL
    baselines: tuple[str, ...] | None = None  # None: all that apply
    compile_variants: tuple[str, ...] | None = None  # None: the defaults of compile_variants()
    compile_on_cpu: bool = False  # --device cpu: compile with Inductor's C++ backend (slow)


class Context:
    """One configuration: inputs, verification block, cached references and our timings."""

    def __init__(self, spec: Spec, x: Inputs, opts: Options):
        self.spec, self.x, self.opts = spec, x, opts
        self.device = x.device
        self.window = specs.check_window(spec, x.n, x.t)
        self.tol = specs.tolerance(x.dtype)
        self._refs: dict[str, tuple] = {}
        self.ours: dict[str, dict] = {}  # form -> {"full_call_us", "err", ...}

    def ref(self, form: str) -> tuple:
        if form not in self._refs:
            self._refs[form] = specs.reference(self.spec, self.x, self.window, form)
        return self._refs[form]

    def check(self, outputs, form: str) -> tuple[float, float]:
        return specs.error(outputs, self.ref(form), self.window)

    def ours_call_us(self, form: str) -> dict:
        """Full-call time (and error) of our call in ``form``, measured once per configuration."""
        if form not in self.ours:
            call, setup, rows = ours_call(form, self.x)
            with torch.no_grad():
                out = call(setup())
                timing.sync(self.device)
                max_abs, err = self.check(rows(out), ref_form(form))
                del out
                us = timing.full_call_us(call, self.device, self.opts.budget, setup)
            self.ours[form] = {"full_call_us": us, "max_abs_err": max_abs, "err": err, "correct": err <= self.tol}
        return self.ours[form]


# --------------------------------------------------------------------------------------------
# TensorDicts and our module calls


def _v3(x: torch.Tensor) -> torch.Tensor:
    return x.unsqueeze(-1)


def _log_mu_key() -> str:
    from torchrl.objectives import value as trl

    return trl.VTrace(gamma=0.9, actor_network=None, value_network=None).tensor_keys.sample_log_prob


def gae_td(x: Inputs):
    from tensordict import TensorDict

    nxt = {"state_value": _v3(x["nv"]), "reward": _v3(x["r"]), "done": _v3(x["done"]), "terminated": _v3(x["term"])}
    return TensorDict({"state_value": _v3(x["v"]), "next": nxt}, batch_size=[x.n, x.t], device=x.device)


def vtrace_td(x: Inputs):
    from tensordict import TensorDict

    nxt = {"state_value": _v3(x["nv"]), "reward": _v3(x["r"]), "done": _v3(x["done"]), "terminated": _v3(x["term"])}
    root = {
        "logits": x["logits"],
        "action": x["act_mode"],
        _log_mu_key(): _v3(x["lpb"]),
        "state_value": _v3(x["v"]),
        "next": nxt,
    }
    return TensorDict(root, batch_size=[x.n, x.t], device=x.device)


def categorical_actor(device):
    from tensordict.nn import TensorDictModule
    from torch.distributions import Categorical
    from torchrl.modules import ProbabilisticActor

    net = TensorDictModule(torch.nn.Identity(), in_keys=["logits"], out_keys=["logits"])
    actor = ProbabilisticActor(net, in_keys=["logits"], distribution_class=Categorical, return_log_prob=True)
    return actor.to(device)


def _td_rows(*keys):
    def rows(td):
        return tuple(td[k].squeeze(-1) for k in keys)

    return rows


def _module_call(module, td):
    """(call, setup, rows): a shallow clone per call (outside the timed region) keeps the input
    TensorDict free of outputs."""
    return module, (lambda: td.clone(False)), None


def _ours_gae_module(x: Inputs):
    from rl_triton.modules import GAE

    call, setup, _ = _module_call(GAE(gamma=GAMMA, lmbda=LAMBDA, value_network=None), gae_td(x))
    return call, setup, _td_rows("advantage", "value_target")


def _ours_vtrace_module(x: Inputs):
    from rl_triton.modules import VTrace

    actor = categorical_actor(x.device)
    module = VTrace(gamma=GAMMA, actor_network=actor, value_network=None, rho_thresh=RHO_BAR, c_thresh=C_BAR)
    call, setup, _ = _module_call(module, vtrace_td(x))
    return call, setup, _td_rows("value_target", "advantage")


_OUR_MODULES = {"compute_gae": _ours_gae_module, "compute_vtrace": _ours_vtrace_module}


def ours_call(key: str, x: Inputs):
    """Our call ``key`` = ``"<function>:<form>"`` (form: primary, torchrl_form or module) on ``x``:
    (call(arg), setup() -> arg, rows(out) -> tuple of (N, T) tensors)."""
    name, form = key.split(":")
    if form == "module":
        return _OUR_MODULES[name](x)
    fn = specs.SPECS[name].call(form)
    return (lambda _: fn(x)), (lambda: None), (lambda out: out)


def ref_form(key: str) -> str:
    """The reference form (specs.Spec.call) that our call / a baseline paired with ``key`` is checked against."""
    name, form = key.split(":")
    if form == "module":
        return "torchrl_form" if name == "compute_gae" else "vtrace_module"
    return form


# --------------------------------------------------------------------------------------------
# baselines


def _fmt_exc(exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {msg[0][:300] if msg else ''}".strip()


class Baseline:
    name = ""
    label = ""

    def applies(self, spec: Spec) -> bool:
        raise NotImplementedError

    def ours_form(self, spec: Spec) -> str:
        return f"{spec.name}:primary"

    def skip_reason(self, spec: Spec, n: int, t: int, opts: Options) -> str | None:
        return None

    def describe(self, spec: Spec) -> str:
        return self.label

    # (call(arg), setup() -> arg, rows(out) -> tuple of (N, T) tensors); setup is not timed
    def prepare(self, ctx: Context):
        raise NotImplementedError

    def measure(self, ctx: Context) -> dict:
        spec = ctx.spec
        ours_form = self.ours_form(spec)
        res = {"name": self.name, "label": self.describe(spec), "ours": ours_form.split(":")[1]}
        try:
            call, setup, rows = self.prepare(ctx)
            with torch.no_grad():
                out = call(setup())
                timing.sync(ctx.device)
                max_abs, err = ctx.check(rows(out), ref_form(ours_form))
            del out
        except Exception as exc:  # a baseline that cannot run on this data is reported, not fatal
            return res | {"status": "failed", "reason": _fmt_exc(exc), "traceback": traceback.format_exc(limit=4)}
        res |= {"max_abs_err": max_abs, "err": err}
        if not err <= ctx.tol:
            return res | {"status": "incorrect", "reason": f"error {err:.2e} > tolerance {ctx.tol:.0e}"}
        with torch.no_grad():
            res["full_call_us"] = timing.full_call_us(call, ctx.device, ctx.opts.budget, setup)
        ours = ctx.ours_call_us(ours_form)
        res["ours_full_call_us"] = ours["full_call_us"]
        res["speedup"] = res["full_call_us"] / ours["full_call_us"]
        return res | {"status": "ok"}


class TorchRLFunctional(Baseline):
    def __init__(self, name: str, label: str, functions: dict[str, str]):
        self.name, self.label, self.functions = name, label, functions

    def applies(self, spec):
        return spec.name in self.functions

    def ours_form(self, spec):
        return f"{spec.name}:torchrl_form"

    def describe(self, spec):
        return f"TorchRL {self.functions[spec.name]}"

    def skip_reason(self, spec, n, t, opts):
        if not torchrl_available():
            return "TorchRL is not installed"
        if self.name == "torchrl_loop" and t > LOOP_MAX_STEPS:
            return f"Python loop over T > {LOOP_MAX_STEPS} steps"
        return None

    def prepare(self, ctx):
        from torchrl.objectives.value import functional as F

        x, fn = ctx.x, getattr(F, self.functions[ctx.spec.name])
        name = ctx.spec.name
        if name == "compute_gae":
            args = (GAMMA, LAMBDA, _v3(x["v"]), _v3(x["nv"]), _v3(x["r"]), _v3(x["done"]), _v3(x["term"]))
            return (lambda _: fn(*args, time_dim=-2)), (lambda: None), (lambda out: tuple(o.squeeze(-1) for o in out))
        if name == "compute_vtrace":
            args = (GAMMA, _v3(x["lpt"]), _v3(x["lpb"]), _v3(x["v"]), _v3(x["nv"]), _v3(x["r"]))
            flags = (_v3(x["done"]), _v3(x["term"]))

            def call(_):
                return fn(*args, *flags, rho_thresh=RHO_BAR, c_thresh=C_BAR, time_dim=-2)

            return call, (lambda: None), (lambda out: (out[1].squeeze(-1), out[0].squeeze(-1)))  # (vs, adv)
        if name == "compute_lambda_returns":
            args = (GAMMA, LAMBDA, _v3(x["nv"]), _v3(x["r"]), _v3(x["done"]), _v3(x["term"]))
            return (lambda _: fn(*args, time_dim=-2)), (lambda: None), (lambda out: (out.squeeze(-1),))
        if name == "compute_discounted_returns":
            r, done = _v3(x["r"]), _v3(x["done"])
            return (lambda _: fn(r, done, GAMMA, time_dim=-2)), (lambda: None), (lambda out: (out.squeeze(-1),))
        raise AssertionError(name)


class TorchRLModule(Baseline):
    def __init__(self, name: str, vectorized: bool):
        self.name, self.vectorized = name, vectorized
        self.label = "TorchRL module" + (" (vectorized)" if vectorized else "")

    def applies(self, spec):
        return spec.name == "compute_gae" or (spec.name == "compute_vtrace" and not self.vectorized)

    def ours_form(self, spec):
        return f"{spec.name}:module"

    def describe(self, spec):
        if spec.name == "compute_gae":
            return "TorchRL GAE module" + (" (vectorized=True)" if self.vectorized else " (default, loop)")
        return "TorchRL VTrace module"

    def skip_reason(self, spec, n, t, opts):
        if not torchrl_available():
            return "TorchRL is not installed"
        if not self.vectorized and t > LOOP_MAX_STEPS:
            return f"Python loop over T > {LOOP_MAX_STEPS} steps"
        return None

    def prepare(self, ctx):
        from torchrl.objectives import value as trl

        x = ctx.x
        if ctx.spec.name == "compute_gae":
            module = trl.GAE(gamma=GAMMA, lmbda=LAMBDA, value_network=None, vectorized=self.vectorized)
            call, setup, _ = _module_call(module, gae_td(x))
            return call, setup, _td_rows("advantage", "value_target")
        actor = categorical_actor(x.device)
        module = trl.VTrace(gamma=GAMMA, actor_network=actor, value_network=None, rho_thresh=RHO_BAR, c_thresh=C_BAR)
        call, setup, _ = _module_call(module, vtrace_td(x))
        return call, setup, _td_rows("value_target", "advantage")


class EagerLoop(Baseline):
    name = "eager"
    label = "eager PyTorch loop over time"

    def applies(self, spec):
        return spec.name in torch_impls.EAGER

    def skip_reason(self, spec, n, t, opts):
        if t > LOOP_MAX_STEPS:
            return f"Python loop over T > {LOOP_MAX_STEPS} steps"
        if opts.quick and t > QUICK_EAGER_MAX_STEPS:
            return f"--quick: eager loop only up to T = {QUICK_EAGER_MAX_STEPS}"
        return None

    def prepare(self, ctx):
        fn = torch_impls.EAGER[ctx.spec.name]
        args = [torch_impls.time_major(ctx.x[k]) for k in ctx.spec.keys]  # the loop's natural layout, untimed

        def rows(out):
            return tuple(torch_impls.rows_from_time_major(o) for o in out)

        return (lambda _: fn(*args)), (lambda: None), rows


class PyTorchPathLoop(Baseline):
    """rl_triton's own PyTorch path as it was before its scans ran in log-depth passes: the same prologue and
    epilogue, the recurrence as a Python loop over time (vectorised across rows), so that the CPU table shows what
    the log-depth scan gains."""

    name = "loop_path"
    label = "rl_triton's PyTorch path with a loop over time"

    def applies(self, spec):
        return True

    def skip_reason(self, spec, n, t, opts):
        return None if opts.device.type == "cpu" else "the PyTorch path: CPU only"

    def prepare(self, ctx):
        call, setup, rows = ours_call(f"{ctx.spec.name}:primary", ctx.x)

        def looped(arg):
            import rl_triton
            from rl_triton import _dispatch

            saved = _dispatch.torch_scan
            _dispatch.torch_scan = loop_scan
            try:
                with rl_triton.use_backend("torch"):  # the PyTorch path, also under TRITON_INTERPRET=1
                    return call(arg)
            finally:
                _dispatch.torch_scan = saved

        return looped, setup, rows


def loop_scan(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool) -> torch.Tensor:
    """The recurrence of :mod:`rl_triton.scan` one step at a time, contained (a select where ``a_t == 0``) only
    when the plain loop met a non-finite state, as the PyTorch path did."""
    out = _loop(a, b, init, reverse, None)
    if not bool(torch.isfinite(out).all()):
        out = _loop(a, b, init, reverse, a == 0)
    return out


def _loop(a, b, init, reverse, zero):
    out = torch.empty_like(b)
    x = torch.zeros(b.shape[0], dtype=b.dtype, device=b.device) if init is None else init.to(b.dtype)
    for t in range(b.shape[1] - 1, -1, -1) if reverse else range(b.shape[1]):
        x = torch.addcmul(b[:, t], a[:, t], x)
        if zero is not None:
            x = torch.where(zero[:, t], b[:, t], x)
        out[:, t] = x
    return out


def compile_variants(n: int, t: int, opts: Options) -> tuple[list[str], list[str]]:
    """(scans to try, fallbacks tried only when none of them is correct).

    ``assoc`` always; ``chunked`` when rows are longer than a chunk (in --quick only for rows of
    at least QUICK_CHUNKED_MIN_STEPS, where ``assoc`` is latency-bound); ``doubling`` (log-depth,
    O(T log T) work, plain torch ops) only as the fallback for a PyTorch without a working
    ``associative_scan``."""
    if opts.compile_variants:
        return list(opts.compile_variants), []
    first = ["assoc"]
    if t > torch_impls.CHUNK and (not opts.quick or t >= QUICK_CHUNKED_MIN_STEPS):
        first.append("chunked")
    return first, [v for v in ("chunked", "doubling") if v not in first]


def _raise_recompile_limits() -> None:
    """Every shape compiles anew (dynamic=False) and Dynamo counts recompilations per code object:
    past ``recompile_limit`` (8) it would silently run the function eagerly. ``torch._dynamo.reset()``
    per shape avoids that too, but makes every compilation cold (11 s instead of 4 s on the CPU)."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit", "accumulated_recompile_limit", "accumulated_cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, max(getattr(cfg, name), 1 << 20))


class Compiled(Baseline):
    name = "compile"
    label = "torch.compile (vectorised scan)"

    def applies(self, spec):
        return spec.name in torch_impls.BODIES

    def skip_reason(self, spec, n, t, opts):
        if opts.quick and spec.name != "compute_gae" and opts.baselines is None:
            return "--quick: torch.compile for compute_gae only"
        return None

    def _compiled(self, ctx: Context) -> bool:
        return ctx.device.type == "cuda" or ctx.opts.compile_on_cpu

    def _candidate(self, ctx: Context, variant: str, args) -> dict:
        res = {"variant": variant}
        fn = torch_impls.make_scan_fn(ctx.spec.name, variant, ctx.device.type)
        try:
            if self._compiled(ctx):
                _raise_recompile_limits()
                fn = torch.compile(fn, dynamic=False, fullgraph=True)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = fn(*args)
                timing.sync(ctx.device)
            res["compile_s"] = time.perf_counter() - t0
            max_abs, err = ctx.check(out, "primary")
            del out
        except Exception as exc:
            return res | {"status": "failed", "reason": _fmt_exc(exc), "traceback": traceback.format_exc(limit=4)}
        res |= {"max_abs_err": max_abs, "err": err}
        if not err <= ctx.tol:
            return res | {"status": "incorrect", "reason": f"error {err:.2e} > tolerance {ctx.tol:.0e}"}
        with torch.no_grad():
            res["full_call_us"] = timing.full_call_us(lambda _: fn(*args), ctx.device, ctx.opts.budget)
            res["kernel_us"] = timing.kernel_us(lambda: fn(*args), ctx.device, ctx.opts.budget, graph=True)
        return res | {"status": "ok"}

    def measure(self, ctx: Context) -> dict:
        spec = ctx.spec
        label = self.label if self._compiled(ctx) else "vectorised scan (NOT compiled: --device cpu)"
        res = {"name": self.name, "label": label, "ours": "primary", "compiled": self._compiled(ctx)}
        args = [ctx.x[k] for k in spec.keys]
        first, fallbacks = compile_variants(ctx.x.n, ctx.x.t, ctx.opts)
        candidates = [self._candidate(ctx, v, args) for v in first]
        if not any(c["status"] == "ok" for c in candidates):
            candidates += [self._candidate(ctx, v, args) for v in fallbacks]
        res["candidates"] = [{k: v for k, v in c.items() if k != "traceback"} for c in candidates]
        ok = [c for c in candidates if c["status"] == "ok"]
        if not ok:
            worst = candidates[0]
            status = "incorrect" if any(c["status"] == "incorrect" for c in candidates) else "failed"
            reasons = "; ".join(f"{c['variant']}: {c.get('reason', c['status'])}" for c in candidates)
            out = res | {"status": status, "reason": reasons, "traceback": worst.get("traceback")}
            errs = [c["err"] for c in candidates if "err" in c]
            if errs:
                out |= {"err": min(errs), "max_abs_err": min(c["max_abs_err"] for c in candidates if "err" in c)}
            return out
        best = min(ok, key=lambda c: c["full_call_us"])
        ours = ctx.ours_call_us(f"{spec.name}:primary")
        res |= {
            "status": "ok",
            "variant": best["variant"],
            "max_abs_err": best["max_abs_err"],
            "err": best["err"],
            "full_call_us": best["full_call_us"],
            "kernel_us": best["kernel_us"],
            "compile_s": best["compile_s"],
            "ours_full_call_us": ours["full_call_us"],
            "speedup": best["full_call_us"] / ours["full_call_us"],
        }
        return res


BASELINES: dict[str, Baseline] = {
    b.name: b
    for b in [
        TorchRLFunctional(
            "torchrl_vec",
            "TorchRL vectorised functional",
            {
                "compute_gae": "vec_generalized_advantage_estimate",
                "compute_lambda_returns": "vec_td_lambda_return_estimate",
                "compute_discounted_returns": "reward2go",
            },
        ),
        TorchRLFunctional(
            "torchrl_loop",
            "TorchRL loop functional",
            {
                "compute_gae": "generalized_advantage_estimate",
                "compute_vtrace": "vtrace_advantage_estimate",
                "compute_lambda_returns": "td_lambda_return_estimate",
            },
        ),
        TorchRLModule("torchrl_module", vectorized=False),
        TorchRLModule("torchrl_module_vec", vectorized=True),
        EagerLoop(),
        Compiled(),
        PyTorchPathLoop(),
    ]
}


def resolve(names: str | None) -> tuple[str, ...] | None:
    if not names:
        return None
    out = tuple(n.strip() for n in names.split(",") if n.strip())
    unknown = [n for n in out if n not in BASELINES]
    if unknown:
        raise ValueError(f"unknown baseline(s) {unknown}; known: {', '.join(BASELINES)}")
    return out
