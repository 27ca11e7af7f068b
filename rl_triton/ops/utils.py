"""Host-side pieces every algorithm of :mod:`rl_triton.ops` shares: the :class:`Op` spec the generic call path
(:func:`rl_triton._dispatch.call`) is driven by, the kernels' accumulation dtype and flags, and the PyTorch helpers
of the reference prologues and epilogues. The hyper-parameters' kernel form (float32 halves, tensor discounts) is
:mod:`rl_triton._discounts`'."""

from __future__ import annotations

from collections.abc import Callable

import torch
import triton.language as tl

from .._discounts import plain
from ..scan import shift

# --------------------------------------------------------------------------------------------
# The spec of one public function's call of an algorithm


class Op:
    """What the generic call path needs to know of one public function (or internal form) of an algorithm.

    ``names``: its tensors in the validation cache key's order, each with a ``role`` (``"step"`` float per-step,
    ``"flag"``, ``"env"`` per-env, ``"action"`` per-action, ``"actions"`` the action indices); ``required`` the
    names that must be given; ``differentiable`` those autograd records (in the reference's names, after
    ``rename``). ``hypers``: the hyper-parameters' names in the order the public function passes them, with
    ``1.0`` (a discount: in [0, 1], may be a tensor), ``None`` (a float >= 0) or ``0.0`` (a float >= 0 the public
    function has checked) each; ``consts`` fixed entries of
    the reference's hyper-parameter dict. ``reference(t, s, acc, scan)``: the PyTorch path. ``kernel``, ``args``
    (the argument builder: the tensors in key order, the outputs, N, T, the hyper-parameters), ``constexprs(p, s,
    two)`` (the kernel's own flags), ``kind(t)`` (the plan kind) and ``at`` (the launch key): the kernel path.
    ``two``: a second output. ``data``: the ``check_data`` names (None: no data check); ``probabilities``:
    ``check_probabilities``' arguments; ``rename``: (public name, reference name) of a renamed input."""

    __slots__ = (
        "fn", "names", "roles", "required", "differentiable", "diff_at", "hypers", "limits", "discounts", "consts",
        "reference", "kernel", "args", "constexprs", "kind", "at", "two", "data", "probabilities", "rename",
        "kernel_names", "actions", "plain",
    )  # fmt: skip

    def __init__(
        self, fn: str, tensors: tuple, required: tuple, differentiable: tuple, hypers: tuple, reference: Callable,
        kernel, args: Callable, constexprs: Callable, kind: Callable, at: tuple, *, two: bool = False,
        consts: dict | None = None, data: tuple | None = (None, None, None), probabilities: tuple | None = None,
        rename: tuple | None = None,
    ) -> None:  # fmt: skip
        self.fn, self.required, self.differentiable = fn, required, differentiable
        self.names = tuple(name for name, _ in tensors)
        self.roles = tuple(role for _, role in tensors)
        self.kernel_names = tuple(rename[1] if rename and n == rename[0] else n for n in self.names)
        self.diff_at = tuple(i for i, n in enumerate(self.kernel_names) if n in differentiable)
        self.hypers = tuple(name for name, _ in hypers)
        self.limits = tuple(hi for _, hi in hypers)
        self.discounts = tuple(name for name, hi in hypers if hi == 1.0)
        self.consts = consts or {}
        self.reference, self.kernel, self.args, self.constexprs, self.kind = reference, kernel, args, constexprs, kind
        self.at, self.two, self.data, self.probabilities, self.rename = at, two, data, probabilities, rename
        self.actions = "actions" in self.roles
        self.plain = plain(self.limits)

    def variant(self, **changes) -> Op:
        """This op with some of its constructor's arguments changed."""
        given = dict(
            fn=self.fn, tensors=tuple(zip(self.names, self.roles, strict=True)), required=self.required,
            differentiable=self.differentiable, hypers=tuple(zip(self.hypers, self.limits, strict=True)),
            reference=self.reference, kernel=self.kernel, args=self.args, constexprs=self.constexprs, kind=self.kind,
            at=self.at, two=self.two, consts=self.consts, data=self.data, probabilities=self.probabilities,
            rename=self.rename,
        )  # fmt: skip
        given.update(changes)
        return Op(**given)


# --------------------------------------------------------------------------------------------
# The kernels' accumulation dtype and flags


def acc(dtype: torch.dtype):
    """The kernels' accumulation dtype (their ACC constexpr) for inputs of ``dtype``."""
    return tl.float64 if dtype == torch.float64 else tl.float32


def bootstrap_flags(t: dict, next_all: bool) -> dict:
    """The optional inputs GAE's and V-trace's kernels share, as their constexprs."""
    return dict(
        HAS_TRUNC=t.get("truncateds") is not None, HAS_BOOT=t.get("bootstrap_values") is not None,
        HAS_LAST=t.get("last_value") is not None, NEXT_ALL=next_all,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------
# The PyTorch path's shared pieces. Each reference takes the normalised 2-D tensors of one call (``t``: name ->
# tensor or None, floats in the call's dtype, flags as stored), the hyper-parameters (``s``: floats;
# ``gamma``/``lambda_`` may be (N, T) per-step views instead, read elementwise), the accumulation dtype and a
# differentiable scan, and returns its outputs in the accumulation dtype. Containment (docs/semantics.md): what
# a zero flag factor multiplies, or what is not read, is selected away (``torch.where``) before it enters the
# arithmetic, so that a NaN or an infinity there changes nothing, not even a gradient.

Scan = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", bool], torch.Tensor]
Tensors = dict[str, "torch.Tensor | None"]


def as_float(t: Tensors, name: str, acc: torch.dtype) -> torch.Tensor | None:
    x = t.get(name)
    return None if x is None else x.to(acc)


def flag(t: Tensors, name: str, like: torch.Tensor) -> torch.Tensor:
    x = t.get(name)
    return torch.zeros_like(like) if x is None else (x != 0).to(like.dtype)


def _last_column(like: torch.Tensor) -> torch.Tensor:
    last = torch.zeros_like(like)
    last[:, -1] = 1.0
    return last


def boundary(t: Tensors, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """term, trunc and boundary = trunc OR last step, as 0/1 tensors in the accumulation dtype."""
    term = flag(t, "terminateds", like)
    trunc = flag(t, "truncateds", like)
    return term, trunc, torch.maximum(trunc, _last_column(like))


def bootstrap(t: Tensors, bnd: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """boot_t at boundary steps (zero elsewhere: boot is never read at other steps)."""
    boot = as_float(t, "bootstrap_values", acc)
    if boot is None:
        boot = torch.zeros_like(bnd)
    last = as_float(t, "last_value", acc)
    if last is not None:
        boot = torch.cat([boot[:, :-1], last.reshape(-1, 1)], dim=1)
    return torch.where(bnd.bool(), boot, 0.0)


def unless(flag: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x where the 0/1 ``flag`` is clear, 0 where it is set (x is not read there)."""
    return torch.where(flag.bool(), 0.0, x)


def next_values(t: Tensors, s: dict, values: torch.Tensor, bnd: torch.Tensor, acc: torch.dtype) -> torch.Tensor:
    """v_next_t = boot_t at boundary steps, values_{t+1} otherwise. With ``s["next_all"]`` the
    ``bootstrap_values`` tensor holds V(s_{t+1}) at every step (TorchRL's form) and is used as is."""
    if s.get("next_all"):
        return as_float(t, "bootstrap_values", acc)
    boot = bootstrap(t, bnd, acc)
    return torch.where(bnd.bool(), boot, shift(values, towards_future=True))
