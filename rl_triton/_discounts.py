"""gamma and lambda, for every stack: the one owner of their range check, their float-or-tensor forms, the tensor
views the formulas read and the kernels' form of a discount.

* The range check: a discount lies in [0, 1] (NaN does not), and one error says so, naming the function and the
  argument (:func:`out_of_range`). Floats are checked everywhere; tensors on the CPU only (a GPU check would need a
  host sync): :func:`check_values`, or :func:`values_in_unit` where the caller falls back instead of raising (the
  TorchRL estimators, :func:`in_unit` for their scalars). The other hyper-parameters (``rho_bar``, ``c_bar``) are
  floats >= 0, checked by the same :func:`scalar`.
* The public functions (:mod:`rl_triton.functional`): ``gamma`` and ``lambda_`` are a float (a Python number, or a
  0-d or one-element tensor) or a per-env or per-step tensor (docs/semantics.md, "Per-step gamma and lambda").
  Before the call's tensors are validated :func:`discount` keeps such a tensor as it is; after, :func:`per_step`
  turns it into the (N, T) view the PyTorch path and the kernels read: per-step (N, T) tensors as they are (any
  strides), per-env (N,) ones as ``g[:, None].expand(N, T)`` (time stride 0), 1-D calls' (T,) ones as ``g[None]``.
  No broadcast copy is made. They are never differentiated (detached), as TorchRL does not differentiate them.
* The token-level estimators (:mod:`rl_triton.llm`): ``gamma`` and ``lam`` are a float, a 0-d tensor or a (B,)
  tensor, one per sequence (:func:`per_sequence`).
* The kernels' form: a float as two float32 halves (:func:`hp`) with a dummy pointer, a tensor as its (N, T) view's
  pointer and strides (:func:`disc`); the token-level kernels take a float or a pointer (:func:`token_discount`).

Imports no Triton: the public functions check their arguments before any kernel module loads.
"""

from __future__ import annotations

import functools
import numbers
import warnings
from typing import TYPE_CHECKING

import numpy as np
import torch

from ._validation import _describe

if TYPE_CHECKING:
    from ._validation import Prepared

# --------------------------------------------------------------------------------------------
# The range check


def out_of_range(fn: str, name: str, got, hi: float | None = 1.0) -> ValueError:
    """The error for ``name`` of ``fn`` outside [0, 1] (``hi`` None: below 0); ``got`` is the value, or a string
    saying which values."""
    bounds = "in [0, 1]" if hi is not None else ">= 0"
    return ValueError(f"{fn}: '{name}' must be {bounds}, got {got}")


def in_range(fn: str, name: str, value: float, hi: float | None = 1.0) -> float:
    """``value``, a float, once checked to lie in [0, 1] (``hi`` None: to be >= 0)."""
    if 0.0 <= value and (hi is None or value <= hi):  # NaN fails
        return value
    raise out_of_range(fn, name, value, hi)


def in_unit(*values: float | None) -> bool:
    """All values are known and in [0, 1] (the TorchRL estimators' test of their scalar buffers: None is a buffer
    that is not a plain scalar). A plain loop, not a generator: the estimators' fast paths call this every step."""
    for v in values:
        if v is None:
            return False
        if type(v) is not float and isinstance(v, torch.Tensor):
            continue  # a buffer under torch.compile (modules/_base.py, CachedScalars._scalar): the op checks it
        if not 0.0 <= v <= 1.0:
            return False
    return True


def _bounds(g: torch.Tensor) -> tuple[float, float]:
    return float(g.min()), float(g.max())


def values_in_unit(g: torch.Tensor) -> bool:
    """Whether a tensor discount's values lie in [0, 1]: read on the CPU only (elsewhere True: a GPU check would
    need a host sync)."""
    if g.device.type != "cpu" or not g.numel():
        return True
    lo, hi = _bounds(g)
    return 0.0 <= lo and hi <= 1.0  # NaN fails both


def check_values(fn: str, name: str, g: torch.Tensor) -> None:
    """Raises :func:`out_of_range` for a tensor discount with values outside [0, 1] (:func:`values_in_unit`)."""
    if not values_in_unit(g):
        lo, hi = _bounds(g)
        raise out_of_range(fn, name, f"values in [{lo}, {hi}]")


# --------------------------------------------------------------------------------------------
# Floats


def scalar(fn: str, name: str, value, *, hi: float | None = 1.0) -> float:
    """A Python number or a one-element tensor as a float in [0, 1] (``hi`` None: >= 0), checked."""
    if type(value) is float and 0.0 <= value and (hi is None or value <= hi):
        return value  # the common case, without the checks below (NaN fails)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.dim() > 1:
            raise ValueError(
                f"{fn}: '{name}' must be a Python float or a 0-d tensor, got a tensor of {_describe(value)}"
            )
        if value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{fn}: '{name}' must be real, got dtype {value.dtype}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{fn}: '{name}' must be a real number or a 0-d tensor, got {type(value).__name__}")
    return in_range(fn, name, float(value), hi)


def scale(fn: str, gamma, lambda_) -> float:
    """``gamma * lambda_`` of two float discounts (the eligibility traces' one hyper-parameter), checked."""
    g = gamma if type(gamma) is float and 0.0 <= gamma <= 1.0 else scalar(fn, "gamma", gamma)
    return g * (lambda_ if type(lambda_) is float and 0.0 <= lambda_ <= 1.0 else scalar(fn, "lambda_", lambda_))


# The fast path's test that a call's hyper-parameters are floats in range, as launched (anything else takes the
# checks of :func:`hyper`): one function per form of the hyper-parameters (an Op's ``limits``: 1.0 a discount,
# None a float >= 0, 0.0 a float the public function has checked), since a loop over them costs a cached call
# more host time than the whole test (docs/performance.md).


def _plain_discount(h: tuple) -> bool:
    (g,) = h
    return type(g) is float and 0.0 <= g <= 1.0


def _plain_discounts(h: tuple) -> bool:
    g, lam = h
    return type(g) is float and type(lam) is float and 0.0 <= g <= 1.0 and 0.0 <= lam <= 1.0


def _plain_discount_bars(h: tuple) -> bool:
    g, x, y = h
    return type(g) is float and type(x) is float and type(y) is float and 0.0 <= g <= 1.0 and x >= 0.0 and y >= 0.0


def _plain_discounts_bars(h: tuple) -> bool:
    g, lam, x, y = h
    return (
        type(g) is float and type(lam) is float and type(x) is float and type(y) is float and 0.0 <= g <= 1.0
        and 0.0 <= lam <= 1.0 and x >= 0.0 and y >= 0.0
    )  # fmt: skip


def _checked(h: tuple) -> bool:
    return True


_PLAIN = {
    (1.0,): _plain_discount, (1.0, 1.0): _plain_discounts, (1.0, None, None): _plain_discount_bars,
    (1.0, 1.0, None, None): _plain_discounts_bars, (0.0,): _checked,
}  # fmt: skip


def plain(limits: tuple):
    """The fast path's test of hyper-parameters of these ``limits`` (an Op's): ``test(values) -> bool``; a loop
    over them for a form without a function of its own."""
    test = _PLAIN.get(limits)
    if test is not None:
        return test

    def loop(h: tuple) -> bool:
        for x, hi in zip(h, limits, strict=True):
            if hi != 0.0 and (type(x) is not float or not (0.0 <= x and (hi is None or x <= hi))):
                return False
        return True

    return loop


# --------------------------------------------------------------------------------------------
# The public functions' gamma and lambda_: a float or a per-env or per-step tensor

DISCOUNTS = ("gamma", "lambda_")


class TensorDiscount(Exception):  # noqa: N818 (a signal to the fast paths, not an error)
    """Raised by :func:`fast_discount` for a tensor gamma/lambda_: the fast paths launch floats only, so the
    call takes the prepared path (where :func:`per_step` validates the tensor)."""


def _captured(value: torch.Tensor) -> bool:
    """A 0-d CUDA tensor while a CUDA graph is captured (``torch.compile(mode="reduce-overhead")``): it is read on
    the device, as a per-step view (:func:`per_step_view`), since reading it to the host would end the capture."""
    return value.dim() == 0 and value.is_cuda and torch.cuda.is_current_stream_capturing()


def _is_tensor_discount(value) -> bool:
    """A tensor gamma/lambda_ that stays a tensor: not one element, or captured."""
    return isinstance(value, torch.Tensor) and (value.dim() > 1 or value.numel() != 1 or _captured(value))


def discount(fn: str, name: str, value) -> float | torch.Tensor:
    """``gamma`` or ``lambda_`` before the call's tensors are validated: a float (a Python number, a 0-d or
    one-element tensor, checked by :func:`scalar`), or a tensor of other shapes as it is (checked by
    :func:`per_step` once the call's shape is known)."""
    if type(value) is float and 0.0 <= value <= 1.0:
        return value
    if _is_tensor_discount(value):
        if value.is_complex() or not value.is_floating_point():
            raise TypeError(
                f"{fn}: '{name}' must be a Python float or a floating tensor, got a tensor of {_describe(value)}"
            )
        return value
    return scalar(fn, name, value)


def fast_discount(fn: str, name: str, value) -> float:
    """:func:`discount` for the fast paths: a tensor gamma/lambda_ raises :class:`TensorDiscount`."""
    if _is_tensor_discount(value):
        raise TensorDiscount(name)
    return scalar(fn, name, value)


def hyper(fn: str, name: str, value, hi: float | None) -> float | torch.Tensor:
    """A hyper-parameter of an Op's call (``hi``: its limit, 1.0 a discount): :func:`discount` or a float >= 0."""
    return discount(fn, name, value) if hi == 1.0 else scalar(fn, name, value, hi=None)


def fast_hyper(fn: str, name: str, value, hi: float | None) -> float:
    """:func:`hyper` for the fast paths (:func:`fast_discount`)."""
    return fast_discount(fn, name, value) if hi == 1.0 else scalar(fn, name, value, hi=None)


def per_step(p: Prepared, s: dict) -> None:
    """Replaces the tensor gamma/lambda_ in ``s`` (the hyper-parameters of the validated call ``p``) by their
    (N, T) views, after checking shape, device and (CPU tensors only) range; sets ``s["per_step"]`` when there is
    one. Floats are left as they are."""
    for name in DISCOUNTS:
        value = s.get(name)
        if isinstance(value, torch.Tensor):
            s[name] = per_step_view(p.fn, name, value, p.num_envs, p.seq_len, p.squeeze, p.device)
            s["per_step"] = True


def per_step_view(
    fn: str, name: str, g: torch.Tensor, n: int, t: int, squeeze: bool, device: torch.device
) -> torch.Tensor:
    """A tensor gamma/lambda_ (:func:`discount`) of a call of ``n`` envs and ``t`` steps (``squeeze``: a 1-D
    call) on ``device``, checked, as the (N, T) view the formulas read (a Prepared's or a cache Entry's fields:
    the fast paths can call it too)."""
    shape = tuple(g.shape)
    g = g.detach()
    if shape == ():  # a captured 0-d tensor (:func:`discount`): the same number at every step
        rows = g.reshape(1, 1).expand(1 if squeeze else n, t)
    elif squeeze:
        if shape != (t,):
            raise ValueError(
                f"{fn}: '{name}' must be a float, a 0-d tensor or a per-step tensor of shape {(t,)} for a 1-D "
                f"call of {t} steps, got a tensor of {_describe(g)}"
            )
        rows = g.unsqueeze(0)
    elif shape == (n, t):
        rows = g
    elif shape == (n,):
        rows = g.unsqueeze(1).expand(n, t)
    else:
        raise ValueError(
            f"{fn}: '{name}' must be a float, a 0-d tensor, a per-env tensor of shape {(n,)} or a per-step "
            f"tensor of shape {(n, t)}, got a tensor of {_describe(g)}"
        )
    if g.device != device:
        raise ValueError(f"{fn}: '{name}' is on {g.device} but the other inputs are on {device}")
    check_values(fn, name, g)
    return rows


def discount_of(s: dict, name: str, acc: torch.dtype):
    """gamma or lambda_ as the PyTorch path reads it: a float, or the call's (N, T) view (:func:`per_step`) in the
    accumulation dtype; every formula reads it elementwise, gamma_t and lambda_t at step t."""
    x = s[name]
    return x if type(x) is float else x.to(acc)


# --------------------------------------------------------------------------------------------
# The token-level estimators' gamma and lam: a float or one per sequence

_TOKEN_INTS = (torch.int32, torch.int64, torch.uint8)


def per_sequence(fn: str, name: str, x, b: int, ref: torch.Tensor) -> float | torch.Tensor:
    """``gamma`` or ``lam`` of a token-level call of ``b`` sequences like ``ref``: a Python number, a 0-d tensor
    or a (B,) tensor, checked. Returns a float or a (B,) tensor on ref's device (0-d tensors on the CPU become
    floats; other 0-d tensors stay tensors, read without a sync)."""
    if type(x) is float and 0.0 <= x <= 1.0:
        return x
    if isinstance(x, torch.Tensor):
        if x.dim() == 0 and x.device.type == "cpu":
            x = float(x)
        else:
            if x.dim() == 0:
                x = x.reshape(1).expand(b)
            if x.shape != (b,):
                raise ValueError(f"{fn}: '{name}' must be a float, a 0-d tensor or a ({b},) tensor (one per "
                                 f"sequence), got shape {tuple(x.shape)}")  # fmt: skip
            if x.device != ref.device:
                raise ValueError(f"{fn}: '{name}' is on {x.device} but the inputs are on {ref.device}")
            if not (x.is_floating_point() or x.dtype in _TOKEN_INTS):
                raise TypeError(f"{fn}: '{name}' must be a real tensor, got {x.dtype}")
            check_values(fn, name, x)
            return x
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        raise TypeError(f"{fn}: '{name}' must be a float, a 0-d tensor or a (B,) tensor, got {type(x).__name__}")
    return in_range(fn, name, float(x))


def column(x: float | torch.Tensor, acc: torch.dtype) -> float | torch.Tensor:
    """A :func:`per_sequence` discount as the token-level PyTorch path reads it: a float, or a (B, 1) column in
    the accumulation dtype."""
    return x if isinstance(x, float) else x.to(acc).reshape(-1, 1)


# --------------------------------------------------------------------------------------------
# The kernels' form


@functools.lru_cache(maxsize=256)
def hp(x: float) -> tuple[float, float]:
    """``x`` as float32 ``(hi, lo)`` with ``hi + lo`` equal to ``x`` to ~1e-15 relative (Triton passes
    Python floats as float32)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # overflow to inf is fine: hi carries it
        hi = float(np.float32(x))
        lo = float(np.float32(x - hi)) if np.isfinite(hi) else 0.0
    return hi, lo


def kernel_discount(value: float | torch.Tensor) -> tuple[torch.Tensor | None, float, int, int]:
    """gamma or lambda_ as a kernel reads it: ``(tensor or None, float, stride_n, stride_t)``. A float gives
    ``(None, value, 0, 0)``; a per-step view (:func:`per_step_view`) ``(view, 0.0, s_n, s_t)`` with its
    strides in elements: ``s_t = 0`` for a per-env tensor, and the element of env n at step t is at
    ``view.data_ptr() + (n * s_n + t * s_t) * view.element_size()``, in ``view.dtype`` (any float dtype)."""
    if type(value) is float:
        return None, value, 0, 0
    s_n, s_t = value.stride()
    return value, 0.0, s_n, s_t


def disc(x, dummy: torch.Tensor) -> tuple:
    """gamma or lambda_ as the kernels take a discount: ``(hi, lo, pointer, stride_n, stride_t)``. A float's halves
    (:func:`hp`) and ``dummy``, a valid pointer of the call that the kernel never reads (a pointer, not an int: an
    int there changed the float kernels' registers and SASS); a tensor's (N, T) view (:func:`kernel_discount`) and
    its strides. The argument builders inline the float case (it runs on every launch)."""
    if isinstance(x, torch.Tensor):
        view, _, s_n, s_t = kernel_discount(x)
        return 0.0, 0.0, view, s_n, s_t
    return (*hp(x), dummy, 0, 0)


def tensor_flags(gamma, lambda_=None) -> dict:
    """G_TENSOR and L_TENSOR: which discounts are tensors (the kernels read them at every step)."""
    return dict(G_TENSOR=isinstance(gamma, torch.Tensor), L_TENSOR=isinstance(lambda_, torch.Tensor))


def token_discount(h: float | torch.Tensor, acc: torch.dtype, ref: torch.Tensor) -> tuple:
    """A :func:`per_sequence` discount as the token-level kernels take it: ``(pointer, float value, stride,
    is_pointer)``. Floats stay kernel arguments (float32) except for float64 calls, which read a one-element
    float64 tensor (a fill, no host-to-device copy): the (hi, lo) float32 halves (:func:`hp`) carry 48 of a
    float64's 53 bits, and in float32 their sum can round one ulp away from the float itself."""
    if isinstance(h, float):
        if acc == torch.float64:
            return torch.full((1,), h, dtype=acc, device=ref.device), 0.0, 0, True
        return ref, h, 0, False
    return h, 0.0, h.stride(0), True
