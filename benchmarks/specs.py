"""What is benchmarked: the seven functions, their inputs, the rl_triton calls that are timed, the
bytes each must move, and the float64 reference every implementation is checked against.

Each function has a *primary* call -- the public ``rl_triton.compute_*`` function in its common
form, the one kernel time, GB/s and the copy fraction are reported for, and the math the eager
loop and ``torch.compile`` baselines implement -- and, where TorchRL has an equivalent, a
*TorchRL-form* rl_triton call with exactly TorchRL's semantics (next values read at every step,
``done`` cuts the recursion, ``terminated`` zeroes the bootstrap), which TorchRL's functionals and
modules are compared with:

* compute_gae: ``compute_gae(r, v, term, last_value=last)``; TorchRL form
  ``gae_with_next_values(r, v, nv, term, done)`` plus ``value_target = adv + v`` (TorchRL returns both).
* compute_vtrace: ``compute_vtrace(lpt, lpb, v, r, term, last_value=last)``; TorchRL form
  ``vtrace_with_next_values(lpt, lpb, v, nv, r, term, done)``.
* compute_retrace: ``compute_retrace(probs, mu, q, nq, act, r, term, trunc)``; no TorchRL equivalent.
* compute_discounted_returns: ``compute_discounted_returns(r, term)``; TorchRL form (``reward2go``)
  ``compute_discounted_returns(r, done)``.
* compute_lambda_returns: ``compute_lambda_returns(r, nv, term)``; TorchRL form
  ``compute_lambda_returns(r, nv, term, truncateds=done, bootstrap_values=nv)``.
* compute_eligibility_traces: ``compute_eligibility_traces(r, done)``; no TorchRL equivalent.
* compute_episodic_prefix_sum: ``compute_episodic_prefix_sum(r, done)``; no TorchRL equivalent.

gamma = 0.99, lambda = 0.95, rho_bar = c_bar = 1, A = 4 actions for Retrace. Data: standard normal
rewards/values, ``term`` set with probability 1 %, ``trunc`` with 0.5 % (never together),
``done = term | trunc``, flags stored as bool.

Reference: rl_triton's own PyTorch path (``use_backend("torch")``) on float64 CPU copies -- the
test suite validates it against an independent loop reference. Rows are independent and each
recurrence only looks one way in time, so the reference is computed on a block that is exact
for the full call: the first ``R`` rows, and the last ``W`` steps of a reverse recurrence (they
depend only on later steps) or the first ``W`` steps of a forward one (see :func:`check_window`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

import rl_triton as R
from rl_triton import functional as RF

from .torch_impls import C_BAR, GAMMA, LAMBDA, RHO_BAR

NUM_ACTIONS = 4
P_TERM = 0.01
P_TRUNC = 0.005
SEED = 0

# Tolerance on err = max |out - ref| / rms(ref) per dtype. Bugs in the semantics (a boundary
# handled wrongly) give errors of order 1; float32 rounding gives ~1e-6, TF32 convolutions (TorchRL's
# vectorised estimators on Ampere+ under PyTorch's default cuDNN settings) ~1e-3, bfloat16
# rounding of the output alone up to ~1e-2.
TOLERANCE = {torch.float32: 1e-2, torch.bfloat16: 1e-1, torch.float16: 5e-2, torch.float64: 1e-6}

# verification block: at most VERIFY_STEPS steps and VERIFY_ELEMENTS elements
VERIFY_STEPS = 4096
VERIFY_ELEMENTS = 1 << 21


# --------------------------------------------------------------------------------------------
# inputs


def _key_seed(key: str) -> int:
    return (SEED * 1_000_003 + zlib.crc32(key.encode())) % (2**31)


class Inputs:
    """Rollout tensors of one configuration, created on first use (each from its own seeded
    generator, so the data does not depend on which keys were requested before). ``time_major``:
    the (N, T) per-step tensors are views ``x.T`` of contiguous (T, N) ones, as a ``[num_steps,
    num_envs]`` rollout buffer gives, and the (N, T, A) ones views of (T, N, A) ones (the same values
    as without)."""

    FLOATS = ("r", "v", "nv", "last", "lpt", "lpb", "probs", "mu", "q", "nq", "logits")

    def __init__(self, n: int, t: int, dtype: torch.dtype, device: torch.device, time_major: bool = False):
        self.n, self.t, self.dtype, self.device = n, t, dtype, torch.device(device)
        self.time_major = time_major
        self._cache: dict[str, torch.Tensor] = {}

    def _gen(self, key: str) -> torch.Generator:
        return torch.Generator(device=self.device).manual_seed(_key_seed(key))

    def _randn(self, key: str, *shape) -> torch.Tensor:
        return torch.randn(*shape, device=self.device, generator=self._gen(key))

    def _make(self, key: str) -> torch.Tensor:
        n, t = self.n, self.t
        if key in ("r", "v", "nv", "q"):
            x = self._randn(key, n, t)
        elif key == "last":
            x = self._randn(key, n)
        elif key in ("lpt", "lpb"):
            x = 0.3 * self._randn(key, n, t)
        elif key == "probs":
            x = torch.softmax(self._randn(key, n, t, NUM_ACTIONS), dim=-1)
        elif key == "mu":
            x = torch.rand(n, t, device=self.device, generator=self._gen(key)) * 0.9 + 0.1
        elif key == "nq":
            x = self._randn(key, n, t, NUM_ACTIONS)
        elif key == "logits":
            x = self._randn(key, n, t, NUM_ACTIONS)
        elif key == "act":
            return torch.randint(0, NUM_ACTIONS, (n, t), device=self.device, generator=self._gen(key))
        elif key == "act_mode":  # the mode of Categorical(logits): TorchRL's VTrace scores the mode
            return self["logits"].float().argmax(-1)
        elif key == "_u":  # one uniform draw per step decides term / trunc / nothing
            return torch.rand(n, t, device=self.device, generator=self._gen(key))
        elif key == "term":
            return self["_u"] < P_TERM
        elif key == "trunc":
            u = self["_u"]
            return (u >= P_TERM) & (u < P_TERM + P_TRUNC)
        elif key == "done":
            return self["_u"] < P_TERM + P_TRUNC
        else:
            raise KeyError(key)
        return x.to(self.dtype)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._cache:
            x = self._make(key)
            if self.time_major and x.dim() in (2, 3):  # (N, T) and (N, T, A) views of [T, N] / [T, N, A]
                x = x.transpose(0, 1).contiguous().transpose(0, 1)
            self._cache[key] = x
        return self._cache[key]

    def nbytes(self, keys) -> int:
        return sum(self[k].numel() * self[k].element_size() for k in keys)

    def release(self) -> None:
        self._cache.clear()


# --------------------------------------------------------------------------------------------
# rl_triton calls


def _gae(x, plan=None):
    return (R.compute_gae(x["r"], x["v"], x["term"], gamma=GAMMA, lambda_=LAMBDA, last_value=x["last"], plan=plan),)


def _gae_trl(x):
    adv = RF.gae_with_next_values(x["r"], x["v"], x["nv"], x["term"], x["done"], gamma=GAMMA, lambda_=LAMBDA)
    return adv, adv + x["v"]


def _vtrace(x, plan=None):
    return R.compute_vtrace(
        x["lpt"], x["lpb"], x["v"], x["r"], x["term"], gamma=GAMMA, rho_bar=RHO_BAR, c_bar=C_BAR, last_value=x["last"],
        plan=plan,
    )  # fmt: skip


def _vtrace_trl(x):
    return RF.vtrace_with_next_values(
        x["lpt"], x["lpb"], x["v"], x["nv"], x["r"], x["term"], x["done"], gamma=GAMMA, rho_bar=RHO_BAR, c_bar=C_BAR
    )


def _vtrace_module_ref(x):
    """What both V-trace modules compute when the stored action is the mode of the logits."""
    log_pi = torch.log_softmax(x["logits"], dim=-1).gather(-1, x["act_mode"].unsqueeze(-1)).squeeze(-1)
    return RF.vtrace_with_next_values(
        log_pi, x["lpb"], x["v"], x["nv"], x["r"], x["term"], x["done"], gamma=GAMMA, rho_bar=RHO_BAR, c_bar=C_BAR
    )


def _retrace(x, plan=None):
    return R.compute_retrace(
        x["probs"], x["mu"], x["q"], x["nq"], x["act"], x["r"], x["term"], x["trunc"],
        gamma=GAMMA, lambda_=LAMBDA, c_bar=C_BAR, rho_bar=RHO_BAR, plan=plan,
    )  # fmt: skip


def _returns(x, plan=None):
    return (R.compute_discounted_returns(x["r"], x["term"], gamma=GAMMA, plan=plan),)


def _returns_trl(x):
    return (R.compute_discounted_returns(x["r"], x["done"], gamma=GAMMA),)


def _lambda(x, plan=None):
    return (R.compute_lambda_returns(x["r"], x["nv"], x["term"], gamma=GAMMA, lambda_=LAMBDA, plan=plan),)


def _lambda_trl(x):
    return (
        R.compute_lambda_returns(
            x["r"], x["nv"], x["term"], x["done"], gamma=GAMMA, lambda_=LAMBDA, bootstrap_values=x["nv"]
        ),
    )


def _traces(x, plan=None):
    return (R.compute_eligibility_traces(x["r"], x["done"], gamma=GAMMA, lambda_=LAMBDA, plan=plan),)


def _prefix(x, plan=None):
    return (R.compute_episodic_prefix_sum(x["r"], x["done"], plan=plan),)


@dataclass(frozen=True)
class Spec:
    name: str
    short: str
    reverse: bool  # a reverse recurrence (depends on later steps) or a forward one
    primary: Callable[[Inputs], tuple]
    keys: tuple[str, ...]  # inputs of the primary call, in the order of the torch_impls bodies
    n_out: int
    torchrl_form: Callable[[Inputs], tuple] | None = None
    references: dict[str, Callable] = field(default_factory=dict)  # extra reference forms

    def nbytes(self, x: Inputs) -> int:
        """Minimum bytes of the primary call: every input read once, every output written once."""
        es = torch.empty((), dtype=x.dtype).element_size()
        return x.nbytes(self.keys) + self.n_out * x.n * x.t * es

    def call(self, form: str) -> Callable[[Inputs], tuple]:
        if form == "primary":
            return self.primary
        if form == "torchrl_form":
            assert self.torchrl_form is not None
            return self.torchrl_form
        return self.references[form]


SPECS: dict[str, Spec] = {
    s.name: s
    for s in [
        Spec("compute_gae", "gae", True, _gae, ("r", "v", "term", "last"), 1, _gae_trl),
        Spec(
            "compute_vtrace",
            "vtrace",
            True,
            _vtrace,
            ("lpt", "lpb", "v", "r", "term", "last"),
            2,
            _vtrace_trl,
            references={"vtrace_module": _vtrace_module_ref},
        ),  # fmt: skip
        Spec("compute_retrace", "retrace", True, _retrace, ("probs", "mu", "q", "nq", "act", "r", "term", "trunc"), 2),
        Spec("compute_discounted_returns", "returns", True, _returns, ("r", "term"), 1, _returns_trl),
        Spec("compute_lambda_returns", "lambda", True, _lambda, ("r", "nv", "term"), 1, _lambda_trl),
        Spec("compute_eligibility_traces", "traces", False, _traces, ("r", "done"), 1),
        Spec("compute_episodic_prefix_sum", "prefix", False, _prefix, ("r", "done"), 1),
    ]
}

ALIASES = {s.short: s.name for s in SPECS.values()} | {s.name.removeprefix("compute_"): s.name for s in SPECS.values()}


def resolve(names: str | None) -> list[str]:
    """``"gae,vtrace"`` (short names, ``compute_*`` names or their suffixes) -> spec names."""
    if not names:
        return list(SPECS)
    out = []
    for raw in names.split(","):
        name = raw.strip()
        if not name:
            continue
        full = name if name in SPECS else ALIASES.get(name)
        if full is None:
            raise ValueError(f"unknown function {name!r}; known: {', '.join(SPECS)} (or {', '.join(ALIASES)})")
        if full not in out:
            out.append(full)
    return out


# --------------------------------------------------------------------------------------------
# verification


@dataclass(frozen=True)
class Window:
    """The block [0, rows) x [t0, t1) on which outputs are checked."""

    rows: int
    t0: int
    t1: int
    full: bool

    def describe(self) -> str:
        return "all" if self.full else f"rows [0, {self.rows}) x steps [{self.t0}, {self.t1})"

    def take(self, x: torch.Tensor) -> torch.Tensor:
        return x[: self.rows] if x.ndim == 1 else x[: self.rows, self.t0 : self.t1]


def check_window(spec: Spec, n: int, t: int) -> Window:
    w = min(t, VERIFY_STEPS)
    rows = min(n, max(1, VERIFY_ELEMENTS // w))
    t0, t1 = (t - w, t) if spec.reverse else (0, w)
    return Window(rows, t0, t1, rows == n and w == t)


class _Sub:
    """The verification block of every input, as float64 CPU tensors (flags and actions as stored)."""

    def __init__(self, x: Inputs, window: Window):
        self._x, self._w = x, window
        self._cache: dict[str, torch.Tensor] = {}
        self.n, self.t = window.rows, window.t1 - window.t0

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._cache:
            v = self._w.take(self._x[key]).cpu()
            if v.is_floating_point():
                v = v.double()
            self._cache[key] = v.contiguous()
        return self._cache[key]


def reference(spec: Spec, x: Inputs, window: Window, form: str) -> tuple[torch.Tensor, ...]:
    """float64 outputs of ``form`` on the verification block (rl_triton's PyTorch path)."""
    sub = _Sub(x, window)
    with R.use_backend("torch"), torch.no_grad():
        return tuple(o.double() for o in spec.call(form)(sub))


def error(outputs, refs, window: Window) -> tuple[float, float]:
    """(max abs error, max abs error / rms(ref)) of ``outputs`` (full (N, T) tensors) on the block."""
    if len(outputs) != len(refs):
        raise ValueError(f"expected {len(refs)} outputs, got {len(outputs)}")
    worst_abs, worst_rel = 0.0, 0.0
    for out, ref in zip(outputs, refs, strict=True):
        got = window.take(out).detach().double().cpu()
        if got.shape != ref.shape:
            raise ValueError(f"output shape {tuple(out.shape)} does not match the reference {tuple(ref.shape)}")
        diff = (got - ref).abs()
        abs_err = float(diff.max()) if diff.numel() else 0.0
        if not torch.isfinite(got).all():
            abs_err = math.inf
        rms = float(ref.pow(2).mean().sqrt()) if ref.numel() else 1.0
        worst_abs = max(worst_abs, abs_err)
        worst_rel = max(worst_rel, abs_err / max(rms, 1e-12))
    return worst_abs, worst_rel


def tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE[dtype]
