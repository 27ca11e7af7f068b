"""Input generators, parametrisations and comparison helpers shared by the test files."""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import pytest
import torch

import rl_triton
from tests import reference

# Tolerances sit next to the dtype: (dtype, atol, rtol). atol is relative to the largest
# magnitude of the reference result (see assert_close); low-precision outputs are compared
# against the reference run on the same low-precision inputs upcast to float64, so the budget
# covers float32 accumulation plus the final rounding to the output dtype.
FLOAT_DTYPES = [
    pytest.param(torch.float64, 1e-10, 1e-10, id="f64"),
    pytest.param(torch.float32, 2e-5, 1e-4, id="f32"),
    pytest.param(torch.float16, 2e-3, 4e-3, id="f16"),
    pytest.param(torch.bfloat16, 2e-2, 2e-2, id="bf16"),
]
F32_TOL = {"atol": 2e-5, "rtol": 1e-4}
F64_TOL = {"atol": 1e-10, "rtol": 1e-10}

FLAG_DTYPES = [
    pytest.param(torch.bool, id="bool"),
    pytest.param(torch.uint8, id="uint8"),
    pytest.param(torch.int32, id="int32"),
    pytest.param(torch.int64, id="int64"),
    pytest.param(torch.float32, id="float32"),
]

# (N, T) for batched calls, (T,) for 1-D calls: T = 1 and 2, primes and odd sizes around the block
# edges, one row of 1031 steps. Interpreted kernels are slow, so all but one stay at or below ~2000
# elements.
SHAPES = [(1, 1), (1, 2), (5, 63), (17, 127), (2, 129), (8, 256), (1, 1031), (1,), (63,)]

# Where the done flags sit: none, every step, only t=0, only t=T-1, or random.
PATTERNS = ["none", "all", "first", "last", "random"]

# The kernel paths this machine has, for tests of kernel mechanisms: ``@kernel_paths`` narrows the ``path``
# fixture to them (the PyTorch path is not generated; tests/conftest.py's ``kernel_path`` fixture is the
# same on CPU but leaves CUDA out under the interpreter).
KERNEL_PATHS = [
    name for name, runs in (("interpret", rl_triton.INTERPRET), ("cuda", torch.cuda.is_available())) if runs
]
kernel_paths = pytest.mark.parametrize("path", KERNEL_PATHS, indirect=True)
# The paths on CPU tensors (the PyTorch path and, when it is on, Triton's interpreter): ``@cpu_paths``.
CPU_PATHS = ["torch", *(["interpret"] if rl_triton.INTERPRET else [])]
cpu_paths = pytest.mark.parametrize("path", CPU_PATHS, indirect=True)


def cuda_path(fn):
    """Runs the test on the CUDA path only; not collected without a GPU (the ``cuda`` marker)."""
    return pytest.mark.cuda(pytest.mark.parametrize("path", ["cuda"], indirect=True)(fn))


def env_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Per-env shape for per-step shape `shape`: (N,) or () for 1-D calls."""
    return tuple(shape[:-1])


def randn(shape, dtype=torch.float32, device="cpu", scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, dtype=torch.float64) * scale).to(dtype).to(device)


def uniform(shape, lo: float, hi: float, dtype=torch.float32, device="cpu") -> torch.Tensor:
    return (torch.rand(shape, dtype=torch.float64) * (hi - lo) + lo).to(dtype).to(device)


def pattern_mask(shape, pattern: str, p: float = 0.15) -> torch.Tensor:
    """Boolean per-step mask laid out by `pattern`."""
    t = shape[-1]
    if pattern == "none":
        return torch.zeros(shape, dtype=torch.bool)
    if pattern == "all":
        return torch.ones(shape, dtype=torch.bool)
    if pattern == "first":
        m = torch.zeros(shape, dtype=torch.bool)
        m[..., 0] = True
        return m
    if pattern == "last":
        m = torch.zeros(shape, dtype=torch.bool)
        m[..., t - 1] = True
        return m
    if pattern == "random":
        return torch.rand(shape) < p
    raise ValueError(pattern)


def to_flags(mask: torch.Tensor, dtype=torch.bool, device="cpu") -> torch.Tensor:
    return mask.to(dtype).to(device)


def term_trunc(shape, p_term: float = 0.1, p_trunc: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """Disjoint random termination / truncation masks."""
    u = torch.rand(shape)
    return u < p_term, (u >= p_term) & (u < p_term + p_trunc)


def flag_masks(shape, dones: str = "random", p: float = 0.1) -> tuple[torch.Tensor, torch.Tensor]:
    """(terminated, truncated) masks laid out by `dones`: "random" (disjoint, each with probability
    `p`), "both" (independent, 30% each, so some steps are both), "none", or "term-<pattern>" /
    "trunc-<pattern>" (one kind of flag laid out by pattern_mask, the other none)."""
    if dones == "random":
        return term_trunc(shape, p, p)
    if dones == "both":
        return torch.rand(shape) < 0.3, torch.rand(shape) < 0.3
    zeros = torch.zeros(shape, dtype=torch.bool)
    if dones == "none":
        return zeros, zeros
    which, pattern = dones.split("-")
    mask = pattern_mask(shape, pattern)
    return (mask, zeros) if which == "term" else (zeros, mask)


def boundary_values(trunc: torch.Tensor, dtype=torch.float32, device="cpu", scale: float = 1.0) -> torch.Tensor:
    """Random bootstrap values at boundary steps (truncated or t = T-1), zero elsewhere."""
    boundary = trunc.clone().bool()
    if boundary.shape[-1]:
        boundary[..., -1] = True
    v = torch.randn(trunc.shape, dtype=torch.float64) * scale
    return v.masked_fill(~boundary, 0.0).to(dtype).to(device)


def probs(shape, dtype=torch.float32, device="cpu") -> torch.Tensor:
    """Random distributions over the last dim, bounded away from zero."""
    p = torch.softmax(torch.randn(shape, dtype=torch.float64), dim=-1) * 0.9 + 0.1 / shape[-1]
    return p.to(dtype).to(device)


def non_contiguous(x: torch.Tensor, how: str = "stride") -> torch.Tensor:
    """The same values as `x` in a non-contiguous view ("stride": every other column of a wider
    buffer; "transpose": .t() of a transposed buffer; 3-D tensors use a permuted buffer)."""
    if x.dim() == 0:
        return x
    if how == "stride" or x.dim() == 1:
        buf = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
        buf[..., ::2] = x
        view = buf[..., ::2]
    elif x.dim() == 2:
        view = x.t().contiguous().t()
    else:  # (N, T, A): buffer laid out (A, T, N)
        view = x.permute(2, 1, 0).contiguous().permute(2, 1, 0)
    assert torch.equal(view, x)
    if view.numel() > 1:
        assert not view.is_contiguous()
    return view


def call_unmutated(fn, *args, **kwargs):
    """Calls fn and checks that no tensor argument was modified."""
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    before = [t.detach().clone() for t in tensors]
    out = fn(*args, **kwargs)
    for t, b in zip(tensors, before, strict=True):
        assert torch.equal(t.detach(), b), "an input tensor was modified"
    return out


def _float_dtype(args, kwargs) -> torch.dtype | None:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return a.dtype
    return None


def assert_close(actual: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float, dtype=None, device=None):
    """Shape/dtype/device checks, then a comparison in float64 where atol scales with the largest
    magnitude of the expected result (long discounted sums grow, and so does rounding)."""
    assert isinstance(actual, torch.Tensor)
    assert tuple(actual.shape) == tuple(expected.shape), f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    if dtype is not None:
        assert actual.dtype == dtype, f"dtype {actual.dtype} != {dtype}"
    if device is not None:
        assert actual.device.type == torch.device(device).type, f"device {actual.device} != {device}"
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    assert not torch.isnan(a).any(), "NaN in output (unwritten element?)"
    scale = max(1.0, e.abs().max().item()) if e.numel() else 1.0
    torch.testing.assert_close(a, e, atol=atol * scale, rtol=rtol)


def check(name: str, *args, atol: float, rtol: float, **kwargs):
    """Runs rl_triton.<name> and tests.reference.<name> on the same inputs and compares: values,
    shape, dtype (the inputs' float dtype), device (the inputs' device), inputs left unmodified. A ``plan``
    keyword goes to rl_triton only."""
    plan = kwargs.pop("plan", None)
    out = call_unmutated(getattr(rl_triton, name), *args, **kwargs, **({"plan": plan} if plan is not None else {}))
    ref = getattr(reference, name)(*args, **kwargs)
    dtype = _float_dtype(args, kwargs)
    device = next(a.device for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor))
    outs = out if isinstance(out, tuple) else (out,)
    refs = ref if isinstance(ref, tuple) else (ref,)
    assert len(outs) == len(refs)
    inputs = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor) and a.numel()]
    for o, r in zip(outs, refs, strict=True):
        assert_close(o, r, atol=atol, rtol=rtol, dtype=dtype, device=device)
        if o.numel():  # outputs are fresh tensors, never views of an input
            assert all(o.untyped_storage().data_ptr() != t.untyped_storage().data_ptr() for t in inputs)
    return out, ref


def golden(actual, expected, atol: float = 1e-6):
    """Compares with hand-computed values (a list, or a tuple of lists)."""
    if isinstance(actual, tuple):
        for a, e in zip(actual, expected, strict=True):
            golden(a, e, atol)
        return
    exp = torch.tensor(expected, dtype=torch.float64)
    torch.testing.assert_close(actual.detach().to("cpu", torch.float64), exp, atol=atol, rtol=0)


def equal_results(a, b, atol: float = 0.0, rtol: float = 0.0):
    """Two results of one call signature agree (tuples too)."""
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for x, y in zip(a, b, strict=True):
        torch.testing.assert_close(x, y, atol=atol, rtol=rtol)


def check_non_contiguous(name: str, args, kwargs, how: str, tol: dict = F32_TOL) -> None:
    """rl_triton.<name> on non-contiguous views of every tensor input: it passes the reference
    check and equals the call on the contiguous inputs."""
    expected = getattr(rl_triton, name)(*args, **kwargs)
    nc_args = [non_contiguous(a, how) for a in args]
    nc_kwargs = {k: non_contiguous(v, how) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
    out = check(name, *nc_args, **nc_kwargs, **tol)[0]
    equal_results(out, expected, atol=1e-6, rtol=1e-6)


# ------------------------------------------------------------------------------------------
# Case tables: each function's test file lists its calls as rows (`case(...)`), and one test runs every
# row on every backend path against the float64 reference (`check_case`).

# The tolerances of FLOAT_DTYPES by dtype, and the short names the case ids use.
TOLERANCES = {p.values[0]: {"atol": p.values[1], "rtol": p.values[2]} for p in FLOAT_DTYPES}
DTYPE_IDS = {p.values[0]: p.id for p in FLOAT_DTYPES}
FLAG_IDS = {torch.bool: "bool", torch.uint8: "uint8", torch.int32: "int32", torch.int64: "int64"} | DTYPE_IDS

# How options appear in case ids: gamma=0 -> "g0", lambda_=0.9 -> "l.9", num_actions=7 -> "A7"...
_OPTION_IDS = {"gamma": "g", "lambda_": "l", "rho_bar": "rho", "c_bar": "c", "num_actions": "A"}


@dataclass(frozen=True)
class Case:
    """One row of a case table: the call's shape, its bootstrap form (`variant`, the file's make_case
    reads it; "" is the file's default), float dtype (tolerances from TOLERANCES), flag dtype, where
    the flags sit (`dones`, see flag_masks), the layout of the inputs ("contiguous", or a view of
    non_contiguous's "stride" / "transpose"), the probability of random flags (None: make_case's
    default), and further options (hyper-parameters, per-function switches) as (name, value) pairs."""

    shape: tuple[int, ...]
    variant: str = ""
    dtype: torch.dtype = torch.float32
    flag_dtype: torch.dtype = torch.bool
    dones: str = "random"
    layout: str = "contiguous"
    p: float | None = None
    options: tuple = ()

    @property
    def tol(self) -> dict:
        return TOLERANCES[self.dtype]


def shape_id(shape) -> str:
    """(5, 63) -> "N5-T63", (63,) -> "T63-1d"."""
    return f"T{shape[0]}-1d" if len(shape) == 1 else f"N{shape[0]}-T{shape[1]}"


def _value_id(v) -> str:
    if isinstance(v, bool):
        return ""
    if isinstance(v, float):
        if math.isinf(v):
            return "inf"
        return f"{v:g}".removeprefix("0") if 0 < v < 1 else f"{v:g}"
    return str(v)


def case_id(c: Case) -> str:
    parts = [shape_id(c.shape)]
    if c.variant:
        parts.append(c.variant)
    if c.dtype != torch.float32:
        parts.append(DTYPE_IDS[c.dtype])
    if c.flag_dtype != torch.bool:
        parts.append(f"flags-{FLAG_IDS[c.flag_dtype]}")
    if c.dones != "random":
        parts.append(c.dones)
    if c.layout != "contiguous":
        parts.append(c.layout)
    for k, v in c.options:
        if isinstance(v, bool):
            parts.append(k if v else f"no{k}")
        elif isinstance(v, str):
            parts.append(v)
        else:
            parts.append(f"{_OPTION_IDS.get(k, k)}{_value_id(v)}")
    return "-".join(parts)


def case(shape, variant: str = "", *, dtype=torch.float32, flag_dtype=torch.bool, dones="random", layout="contiguous",
         p=None, **options):  # fmt: skip
    """A row of a case table, as a pytest.param with a readable id (e.g. "N5-T63-f16-flags-f16")."""
    c = Case(tuple(shape), variant, dtype, flag_dtype, dones, layout, p, tuple(options.items()))
    return pytest.param(c, id=case_id(c))


def case_inputs(make, c: Case, device):
    """(args, kwargs) of one row from a file's ``make_case(shape, *, device, dtype, flag_dtype, p,
    dones[, variant], ...)``: the row's options that make_case takes go to it, the others (gamma,
    lambda_...) override the call's keyword arguments."""
    params = inspect.signature(make).parameters
    own = {k: v for k, v in c.options if k in params}
    if c.variant:
        own["variant"] = c.variant
    if c.p is not None:
        own["p"] = c.p
    args, kwargs = make(c.shape, device=device, dtype=c.dtype, flag_dtype=c.flag_dtype, dones=c.dones, **own)
    kwargs.update((k, v) for k, v in c.options if k not in params)
    return args, kwargs


def check_case(name: str, c: Case, args, kwargs):
    """rl_triton.<name> on one row's inputs against the float64 reference, in the row's layout."""
    if c.layout == "contiguous":
        return check(name, *args, **kwargs, **c.tol)
    return check_non_contiguous(name, args, kwargs, c.layout, c.tol)


# ------------------------------------------------------------------------------------------
# Whole valid calls, by keyword, for tests that sweep over every function.

FUNCTIONS = [
    "compute_gae",
    "compute_vtrace",
    "compute_retrace",
    "compute_discounted_returns",
    "compute_lambda_returns",
    "compute_eligibility_traces",
    "compute_episodic_prefix_sum",
]

# Inputs that autograd differentiates through, per function (API.md).
DIFFERENTIABLE = {
    "compute_gae": ("rewards", "values", "bootstrap_values", "last_value"),
    "compute_vtrace": ("values", "rewards", "bootstrap_values", "last_value"),
    "compute_retrace": ("q_values", "next_q_values_all", "rewards"),
    "compute_discounted_returns": ("rewards", "bootstrap_values"),
    "compute_lambda_returns": ("rewards", "next_values", "bootstrap_values"),
    "compute_eligibility_traces": ("gradients", "seed_values"),
    "compute_episodic_prefix_sum": ("inputs", "seed_values"),
}

# Probability-like inputs that are constants for autograd.
CONSTANTS = {
    "compute_vtrace": ("log_pi_target", "log_pi_behavior"),
    "compute_retrace": ("action_probs_target", "action_probs_behavior", "next_action_probs_target"),
}


def valid_kwargs(
    name: str,
    shape=(3, 5),
    *,
    num_actions: int = 4,
    device="cpu",
    dtype=torch.float32,
    flag_dtype=torch.bool,
    p: float = 0.2,
    last_value: bool = False,
) -> dict:
    """A valid, clean call of rl_triton.<name> as keyword arguments: flags 0/1, never both
    terminated and truncated, bootstrap values zero away from boundary steps. With
    last_value=True (GAE, V-trace) the call uses last_value instead of truncateds/bootstrap."""
    term, trunc = term_trunc(shape, p, p)
    dones = term | trunc
    r = randn(shape, dtype, device)
    flags = {"terminateds": to_flags(term, flag_dtype, device)}
    if not last_value:
        flags["truncateds"] = to_flags(trunc, flag_dtype, device)
    boot = (
        {"last_value": randn(env_shape(shape), dtype, device)}
        if last_value
        else {"bootstrap_values": boundary_values(trunc, dtype, device)}
    )
    if name == "compute_gae":
        return dict(rewards=r, values=randn(shape, dtype, device), **flags, gamma=0.9, lambda_=0.8, **boot)
    if name == "compute_vtrace":
        lpb = randn(shape, dtype, device)
        lpt = (lpb.double().cpu() + 0.5 * torch.randn(shape, dtype=torch.float64)).to(dtype).to(device)
        return dict(
            log_pi_target=lpt,
            log_pi_behavior=lpb,
            values=randn(shape, dtype, device),
            rewards=r,
            **flags,
            gamma=0.9,
            rho_bar=1.2,
            c_bar=0.9,
            **boot,
        )
    if name == "compute_retrace":
        a_shape = (*shape, num_actions)
        actions = torch.randint(0, num_actions, shape)
        behavior = probs(a_shape, torch.float64).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
        return dict(
            action_probs_target=probs(a_shape, dtype, device),
            action_probs_behavior=behavior.to(dtype).to(device),
            q_values=randn(shape, dtype, device),
            next_q_values_all=randn(a_shape, dtype, device),
            actions=actions.to(device),
            rewards=r,
            terminateds=to_flags(term, flag_dtype, device),
            truncateds=to_flags(trunc, flag_dtype, device),
            gamma=0.9,
            lambda_=0.8,
            next_action_probs_target=probs(a_shape, dtype, device),
        )
    if name == "compute_discounted_returns":
        return dict(rewards=r, **flags, gamma=0.9, bootstrap_values=boundary_values(trunc, dtype, device))
    if name == "compute_lambda_returns":
        return dict(
            rewards=r,
            next_values=randn(shape, dtype, device),
            **flags,
            gamma=0.9,
            lambda_=0.8,
            bootstrap_values=boundary_values(trunc, dtype, device),
        )
    if name == "compute_eligibility_traces":
        return dict(
            gradients=r,
            dones=to_flags(dones, flag_dtype, device),
            gamma=0.9,
            lambda_=0.8,
            seed_values=randn(env_shape(shape), dtype, device),
        )
    if name == "compute_episodic_prefix_sum":
        return dict(
            inputs=r,
            dones=to_flags(dones, flag_dtype, device),
            boundary="ends_at",
            seed_values=randn(env_shape(shape), dtype, device),
        )
    raise ValueError(name)


def n_outputs(name: str) -> int:
    return 2 if name in ("compute_vtrace", "compute_retrace") else 1
