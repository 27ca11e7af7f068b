"""Argument checking and layout normalisation at the public boundary.

Every public ``compute_*`` function funnels its tensors through :func:`prepare`, which checks
ranks, shapes, devices and dtypes (raising ``ValueError``/``TypeError`` that name the argument),
turns 1-D calls into one-env 2-D calls, and makes each tensor contiguous (warning when that copies
and ``RL_TRITON_PERF_WARNINGS`` is set). Flags are kept in their stored dtype (the kernels read ``bool``
flags as bytes). Time-major calls (:func:`_time_major`) keep their per-step tensors as they are: the
kernels read them in place. The hyper-parameters (gamma, lambda_ and the others) are :mod:`rl_triton._discounts`'.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace

import torch

from . import _config
from .kernels import plans

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _describe(t: torch.Tensor) -> str:
    return f"shape {tuple(t.shape)}, dtype {t.dtype}, device {t.device}"


@dataclass(slots=True)
class Prepared:
    """A validated call: 2-D contiguous tensors plus what is needed to shape the outputs."""

    fn: str
    num_envs: int
    seq_len: int
    dtype: torch.dtype
    device: torch.device
    squeeze: bool  # the caller passed 1-D (seq_len,) tensors
    tensors: dict[str, torch.Tensor | None] = field(default_factory=dict)
    num_actions: int = 0
    # The launch plans of this call signature (kernels/launch.py), shared by every call that hits
    # the same validation cache entry; None when the signature is not cached.
    plans: dict | None = None
    device_type: str = ""  # device.type, read once per signature (host time: docs/performance.md)
    # A (num_envs, seq_len) contiguous tensor of the output dtype and device (the first per-step
    # input), which new_output allocates like; None: allocate from the fields above.
    like: torch.Tensor | None = None
    # The per-step tensors (and so the outputs) keep the caller's shape instead of their
    # (num_envs, seq_len) view (prepare's ``rows``): the kernels read them as they are, everything
    # else takes the view (:meth:`as_rows`).
    shaped: bool = False
    # Every per-step tensor is the (num_envs, seq_len) view x.T of a contiguous (seq_len, num_envs)
    # tensor (:func:`_time_major`), kept as it is: the kernels read it in place, outputs are allocated
    # in the same layout, and the PyTorch path and autograd take contiguous copies (:meth:`contiguous`).
    time_major: bool = False

    @property
    def acc_dtype(self) -> torch.dtype:
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    @property
    def empty(self) -> bool:
        return self.num_envs == 0 or self.seq_len == 0

    def new_output(self) -> torch.Tensor:
        like = self.like
        if like is not None:
            # like is contiguous (or a contiguous view in the callers' shape), so empty_like's default
            # (its strides) is contiguous too, and cheaper than memory_format= or dtype= device=
            return torch.empty_like(like)
        return torch.empty((self.num_envs, self.seq_len), dtype=self.dtype, device=self.device)

    def finish(self, out: torch.Tensor) -> torch.Tensor:
        return out.squeeze(0) if self.squeeze else out

    def contiguous(self) -> Prepared:
        """This call with contiguous per-step tensors (copies of a time-major call's)."""
        if not self.time_major:
            return self
        tensors = {n: None if t is None else _contiguous(n, t) for n, t in self.tensors.items()}
        like = next((tensors[n] for n, t in self.tensors.items() if t is self.like), None)
        # no launch plans: they are the time-major launches', and this form never launches them
        return replace(self, tensors=tensors, like=like, plans=None, time_major=False)

    def as_rows(self) -> Prepared:
        """This call with its per-step tensors as ``(num_envs, seq_len)`` views (a ``shaped`` call's
        form for the PyTorch path, autograd and the data checks)."""
        if not self.shaped:
            return self
        rows = (self.num_envs, self.seq_len)
        tensors = {n: _as_rows(t, rows) for n, t in self.tensors.items()}  # per-step tensors only (prepare)
        return replace(self, tensors=tensors, like=_as_rows(self.like, rows), shaped=False)


def _as_rows(t: torch.Tensor | None, rows: tuple[int, int]) -> torch.Tensor | None:
    return t if t is None or t.shape == rows else t.reshape(rows)


def _perf_warn(name: str, what: str) -> None:
    if _config.PERF_WARNINGS:
        warnings.warn(
            f"rl_triton: {what} of '{name}' on every call; make it contiguous (.contiguous()) once before "
            "the hot loop to avoid the copy",
            stacklevel=4,
        )


def _contiguous(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.is_contiguous():
        return t
    _perf_warn(name, "implicit .contiguous() copy")
    return t.contiguous()


def _kernel_view(t: torch.Tensor, squeeze: bool) -> torch.Tensor:
    """A contiguous tensor as the kernels read it: 2-D (a leading env dim for 1-D calls). Flags keep
    their dtype, ``bool`` included (Triton loads a ``bool`` pointer as bytes)."""
    return t.unsqueeze(0) if squeeze else t


# Time-major calls (Prepared.time_major): rollout buffers are often [num_steps, num_envs] (one row per step,
# as a vectorised environment returns them), and ``buffer.T`` is the (num_envs, seq_len) view the functions
# take, with strides (1, num_envs); Retrace's [num_steps, num_envs, num_actions] tensors give the
# (num_envs, seq_len, num_actions) view ``buffer.transpose(0, 1)``. The fused kernels read such rows in place
# (kernels/core.py, time_stride) instead of a contiguous copy of each input and a transposed output.
# TIME_MAJOR = False: always copy (tests, sweeps).
TIME_MAJOR = True


def _is_time_major(t: torch.Tensor) -> bool:
    """Whether ``t`` is the (N, T) view x.T of a contiguous (T, N) tensor, or the (N, T, A) view
    x.transpose(0, 1) of a contiguous (T, N, A) one, and not contiguous itself."""
    if t.dim() == 2:
        return t.stride() == (1, t.shape[0]) and not t.is_contiguous()
    if t.dim() == 3:
        n, _, a = t.shape
        return t.stride() == (a, n * a, 1) and not t.is_contiguous()
    return False


def _time_major(steps: dict, flags: dict, per_action: dict, actions, dtype: torch.dtype) -> bool:
    """Whether a call runs time-major: every tensor given (per-step, flags, per-action, actions) is a time-major
    view (:func:`_is_time_major`), and the launcher reads rows of this shape in place (kernels/launch.py,
    time_major_in_place)."""
    if not TIME_MAJOR:
        return False
    given = [t for g in (steps, flags, per_action) for t in g.values() if t is not None]
    if actions is not None:
        given.append(actions[1])
    if not given or not all(_is_time_major(t) for t in given):
        return False
    num_actions = next((t.shape[-1] for t in per_action.values() if t is not None), 0)
    return plans.reads_time_major_in_place(*given[0].shape[:2], num_actions, dtype)


def _layout(name: str, t: torch.Tensor | None, squeeze: bool) -> torch.Tensor | None:
    """The kernels' view of a validated tensor (:func:`_kernel_view`), made contiguous first."""
    if t is None:
        return None
    return _kernel_view(_contiguous(name, t), squeeze)


# Validation cache. A training loop calls with the same shapes, dtypes and devices every step, and
# every check above depends on those only (plus None-ness), so a call whose signature matches one
# that passed before skips them. Only plain contiguous tensors are cached (no copies or warnings to
# replay, no symbolic shapes), and never CPU actions (their range check reads the values). The
# signature also records each tensor's 16-byte alignment, which the kernels are specialised on: the
# entry keeps the call's launch plans (kernels/launch.py), so a hit skips the launch decisions too.
#
# The key is (fn, required, rows, one element per tensor in the order steps, flags, per_env, per_action,
# actions): None for an absent tensor, (shape, dtype, device, aligned) for a contiguous one, and a fifth
# element for a time-major one; a call whose tensors mix both layouts copies, and is not cached. The public
# functions build the same key themselves (:func:`signature`) and, on a hit that needs nothing but the
# launch, skip this module altogether (functional.py's fast paths).
_CACHE: dict = {}
_CACHE_MAX = 512
_UNKNOWN = object()  # prepare's key: not computed by the caller


class Entry:
    """What a validated signature fixes: Prepared's fields, ``like`` (the name of the input outputs are
    allocated like, Prepared.like) and its index ``like_at`` in the key's tensors, and ``direct``: the
    tensors are what the kernels read, as they are (2-D or ``shaped``, not empty), so a call on the kernel
    path without autograd needs nothing but ``plans`` (kernels/launch.py) to launch."""

    __slots__ = (
        "num_envs", "seq_len", "dtype", "device", "squeeze", "num_actions", "device_type", "like", "like_at",
        "shaped", "time_major", "plans", "direct",
    )  # fmt: skip

    def __init__(self, p: Prepared, like: str | None, like_at: int) -> None:
        self.num_envs, self.seq_len, self.dtype, self.device = p.num_envs, p.seq_len, p.dtype, p.device
        self.squeeze, self.num_actions, self.device_type = p.squeeze, p.num_actions, p.device_type
        self.like, self.like_at, self.plans = like, like_at, p.plans
        self.shaped, self.time_major = p.shaped, p.time_major
        self.direct = not p.squeeze and not p.empty and like is not None


def clear_cache() -> None:
    _CACHE.clear()


def _first_given(steps: dict) -> str | None:
    """The name of the first per-step float input given: its kernel view is what outputs are
    allocated like (:meth:`Prepared.new_output`)."""
    return next((name for name, t in steps.items() if t is not None), None)


def _viewed(items: list, squeeze: bool) -> dict:
    """The (name, tensor) pairs of a cache key's pass as the kernels read them (the cache hit path's
    form of :func:`_kernel_view`)."""
    if not squeeze:
        return dict(items)
    return {name: None if t is None else t.unsqueeze(0) for name, t in items}


_Tensor = torch.Tensor


def signature(fn: str, required: tuple, rows, tensors) -> tuple | None:
    """The validation cache key of a call with ``tensors`` (in the key's order), or None when the call
    cannot be cached. Built on every call: kept lean."""
    key = [fn, required, rows]
    for t in tensors:
        if t is None:
            key.append(None)
        elif type(t) is not _Tensor:
            return None
        elif t.is_contiguous():
            key.append((t.shape, t.dtype, t.device, not t.data_ptr() & 15))
        elif rows is None and _is_time_major(t):
            key.append((t.shape, t.dtype, t.device, not t.data_ptr() & 15, True))
        else:
            return None
    return tuple(key)


def cacheable_actions(actions: tuple[str, torch.Tensor] | None) -> bool:
    """Whether a call with ``actions`` can be cached: not with CPU actions, whose range check reads
    the values on every call."""
    return actions is None or (isinstance(actions[1], torch.Tensor) and actions[1].device.type != "cpu")


def prepare(
    fn: str,
    *,
    steps: dict[str, torch.Tensor | None],
    flags: dict[str, torch.Tensor | None],
    per_env: dict[str, torch.Tensor | None] | None = None,
    per_action: dict[str, torch.Tensor | None] | None = None,
    actions: tuple[str, torch.Tensor] | None = None,
    required: tuple[str, ...] = (),
    rows: tuple[int, int] | None = None,
    key=_UNKNOWN,
) -> Prepared:
    """Validates and normalises the tensors of one call (see :func:`_prepare`); calls whose
    signature passed validation before take the cached result.

    ``rows`` (private, for :mod:`rl_triton.modules`): the per-step tensors and flags have one shape
    whose ``reshape(rows)`` is their ``(N, T)`` form (time last, or ``[..., T, 1]``; no per-action
    tensors). They are validated in that form; a call that can be cached then keeps them unreshaped
    (``Prepared.shaped``), so its outputs come in the callers' shape without a view op either way.

    ``key``: the call's :func:`signature` when the caller has built it already (None: not cacheable)."""
    items = [*steps.items(), *flags.items()]
    if per_env:
        items += per_env.items()
    if per_action:
        items += per_action.items()
    if actions is not None:
        items.append(actions)
    if key is _UNKNOWN:
        key = signature(fn, required, rows, [t for _, t in items]) if cacheable_actions(actions) else None
    if key is not None:
        e = _CACHE.get(key)
        if e is not None:
            tensors = _viewed(items, e.squeeze)
            return Prepared(
                fn, e.num_envs, e.seq_len, e.dtype, e.device, e.squeeze, tensors, e.num_actions, e.plans,
                e.device_type, None if e.like is None else tensors[e.like], e.shaped, e.time_major,
            )  # fmt: skip
    vsteps, vflags = steps, flags
    if rows is not None:
        if any(t is not None for g in (per_env or {}, per_action or {}) for t in g.values()) or actions is not None:
            raise ValueError(f"{fn}: rows= takes per-step tensors and flags only")
        vsteps, vflags = ({n: _as_rows(t, rows) for n, t in g.items()} for g in (steps, flags))
    out = _prepare(
        fn, steps=vsteps, flags=vflags, per_env=per_env, per_action=per_action, actions=actions, required=required,
        time_major=rows is None,
    )  # fmt: skip
    if key is not None and not out.time_major and any(k is not None and len(k) == 5 for k in key[3:]):
        key = None  # time-major tensors copied (mixed layouts): a hit would skip the copies
    if key is not None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        out.plans = {}
        like = _first_given(steps)
        if rows is not None and any(t is not None and t.shape != rows for _, t in items):
            # keep the callers' shape, as a cache hit will (every tensor is contiguous here)
            out.tensors.update(_viewed(items, out.squeeze))
            out.like = None if like is None else out.tensors[like]
            out.shaped = True
        like_at = -1 if like is None else next(i for i, (name, _) in enumerate(items) if name == like)
        _CACHE[key] = Entry(out, like, like_at)
    return out


def _prepare(
    fn: str,
    *,
    steps: dict[str, torch.Tensor | None],
    flags: dict[str, torch.Tensor | None],
    per_env: dict[str, torch.Tensor | None] | None = None,
    per_action: dict[str, torch.Tensor | None] | None = None,
    actions: tuple[str, torch.Tensor] | None = None,
    required: tuple[str, ...] = (),
    time_major: bool = False,
) -> Prepared:
    """Validates and normalises the tensors of one call.

    ``steps`` are float per-step tensors of shape (N, T) or (T,); the first one fixes the shape.
    ``flags`` are per-step flags of any dtype; ``per_env`` float tensors of shape (N,) (or () for
    1-D calls); ``per_action`` float tensors of shape (N, T, A); ``actions`` an integer (N, T)
    tensor indexing the last dim of the ``per_action`` tensors. ``required`` names arguments that
    must not be None. ``time_major``: a call whose per-step tensors are all time-major views
    (:func:`_time_major`) keeps them as they are (Prepared.time_major).
    """
    per_env = per_env or {}
    per_action = per_action or {}
    everything = {**steps, **flags, **per_env, **per_action}
    if actions is not None:
        everything[actions[0]] = actions[1]
    for name in required:
        if everything.get(name) is None:
            raise ValueError(f"{fn}: '{name}' is required")
    for name, t in everything.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"{fn}: '{name}' must be a torch.Tensor, got {type(t).__name__}")

    # Shape reference: the first given per-step tensor.
    ref_name, ref = next((n, t) for n, t in {**steps, **flags}.items() if t is not None)
    if ref.dim() not in (1, 2):
        raise ValueError(f"{fn}: '{ref_name}' must have shape (num_envs, seq_len) or (seq_len,), got {_describe(ref)}")
    squeeze = ref.dim() == 1
    step_shape = tuple(ref.shape)
    env_shape = () if squeeze else (step_shape[0],)
    device = ref.device

    for name, t in everything.items():
        if t is not None and t.device != device:
            raise ValueError(f"{fn}: '{name}' is on {t.device} but '{ref_name}' is on {device}")

    def check_shape(name: str, t: torch.Tensor, expected: tuple, what: str) -> None:
        if tuple(t.shape) != expected:
            raise ValueError(
                f"{fn}: '{name}' must have shape {expected} ({what}) like '{ref_name}', got {_describe(t)}"
            )

    # Float dtypes: one per call.
    dtype = None
    dtype_owner = None
    for name, t in {**steps, **per_env, **per_action}.items():
        if t is None:
            continue
        if t.dtype not in FLOAT_DTYPES:
            raise TypeError(
                f"{fn}: '{name}' must be a floating tensor (float16, bfloat16, float32 or float64), got {_describe(t)}"
            )
        if dtype is None:
            dtype, dtype_owner = t.dtype, name
        elif t.dtype != dtype:
            raise TypeError(
                f"{fn}: all float inputs must share one dtype; '{name}' is {t.dtype} but '{dtype_owner}' is {dtype}"
            )

    for name, t in {**steps, **flags}.items():
        if t is not None:
            check_shape(name, t, step_shape, "per-step")
    for name, t in per_env.items():
        if t is not None:
            check_shape(name, t, env_shape, "per-env")
    num_actions = 0
    for name, t in per_action.items():
        if t is None:
            continue
        if t.dim() != len(step_shape) + 1 or tuple(t.shape[:-1]) != step_shape:
            raise ValueError(
                f"{fn}: '{name}' must have shape {step_shape + ('num_actions',)} (per-step, per-action), "
                f"got {_describe(t)}"
            )
        if num_actions and t.shape[-1] != num_actions:
            raise ValueError(f"{fn}: '{name}' has {t.shape[-1]} actions but another action tensor has {num_actions}")
        num_actions = t.shape[-1]
    for name, t in flags.items():
        if t is not None and (t.is_complex() or t.dtype in (torch.complex64, torch.complex128)):
            raise TypeError(f"{fn}: flag '{name}' must be bool, integer or float, got {_describe(t)}")

    out = Prepared(
        fn=fn,
        num_envs=1 if squeeze else step_shape[0],
        seq_len=step_shape[-1],
        dtype=dtype if dtype is not None else torch.float32,
        device=device,
        squeeze=squeeze,
        num_actions=num_actions,
        device_type=device.type,
    )

    if actions is not None:
        name, act = actions
        if act.dtype.is_floating_point or act.dtype == torch.bool or act.is_complex():
            raise TypeError(f"{fn}: '{name}' must be an integer tensor (int64), got {_describe(act)}")
        check_shape(name, act, step_shape, "per-step")
        if act.device.type == "cpu" and act.numel() and num_actions:
            lo, hi = int(act.min()), int(act.max())
            if lo < 0 or hi >= num_actions:
                raise ValueError(
                    f"{fn}: '{name}' must index the last dim of the action tensors (0 <= a < {num_actions}), "
                    f"got values in [{lo}, {hi}]"
                )
        everything[name] = act

    out.time_major = time_major and not squeeze and _time_major(steps, flags, per_action, actions, out.dtype)
    for name, t in everything.items():  # a time-major call's per-env (N,) tensors are made contiguous as always
        out.tensors[name] = t if out.time_major and name not in per_env else _layout(name, t, squeeze)
    like = _first_given(steps)
    out.like = None if like is None else out.tensors[like]
    return out


# --------------------------------------------------------------------------------------------
# Opt-in data checks (RL_TRITON_CORRECTNESS_WARNINGS=1). Each costs a pass over the data and a
# host sync, which is why they are off by default.


def _warn(fn: str, msg: str) -> None:
    warnings.warn(f"rl_triton.{fn}: {msg}", stacklevel=4)


def check_data(p: Prepared, *, term: str | None = None, trunc: str | None = None, boot: str | None = None) -> None:
    """Warns on flags that are not 0/1, steps both terminated and truncated, and bootstrap values
    that are nonzero at steps where they are never read."""
    if not _config.CORRECTNESS_WARNINGS or p.empty:
        return
    t = p.as_rows().tensors
    for name in ("terminateds", "truncateds", "dones"):
        f = t.get(name)
        if f is not None and bool(((f != 0) & (f != 1)).any()):
            _warn(p.fn, f"'{name}' holds values other than 0 and 1; any nonzero value is taken as set")
    if term and trunc and t.get(term) is not None and t.get(trunc) is not None:
        if bool(((t[term] != 0) & (t[trunc] != 0)).any()):
            _warn(p.fn, f"a step is flagged both '{term}' and '{trunc}'; it is treated as a termination")
    if boot and t.get(boot) is not None:
        interior = torch.ones_like(t[boot], dtype=torch.bool)
        interior[:, -1] = False
        if trunc and t.get(trunc) is not None:
            interior &= t[trunc] == 0
        if bool((t[boot].masked_fill(~interior, 0) != 0).any()):
            _warn(
                p.fn,
                f"'{boot}' is nonzero at steps that are neither truncated nor the last step; those entries are "
                "ignored (bootstrap values are read only at boundary steps)",
            )


def check_probabilities(p: Prepared, names: tuple[str, ...], behaviour: str) -> None:
    if not _config.CORRECTNESS_WARNINGS or p.empty:
        return
    for name in (*names, behaviour):
        x = p.tensors.get(name)
        if x is not None and bool(((x < 0) | (x > 1)).any()):
            _warn(p.fn, f"'{name}' holds values outside [0, 1]; it must hold probabilities")
    if bool((p.tensors[behaviour] == 0).any()):
        _warn(p.fn, f"'{behaviour}' is zero at some step: the importance ratio there is infinite")
