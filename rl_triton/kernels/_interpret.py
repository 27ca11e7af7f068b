"""Speeds up ``tl.associative_scan`` of the linear-recurrence combine under ``TRITON_INTERPRET=1``.

Triton's interpreter runs a scan with a user combine function one element at a time in Python
(about 0.1 ms per element), which makes interpreted tests of realistic sizes take minutes. For our
combines only (``linear_combine``, ``linear_combine_next`` and their plain forms), this replaces that loop by the
same left fold vectorised with NumPy across the other axes: identical semantics (an inclusive scan
along the axis), just fast. Every other scan goes through Triton's own code. Only the interpreter
is affected (``tests/test_interpret_fastpath.py`` checks the folds against a float64 loop).
"""

from __future__ import annotations

import numpy as np


def _then(a_r, b_l, b_r):
    """a_r * b_l + b_r, or b_r where a_r == 0 (core.linear_combine: b_l is not read there)."""
    with np.errstate(invalid="ignore"):
        return np.where(a_r == 0, b_r, a_r * b_l + b_r)


def _fold_linear(a, b):
    for i in range(1, a.shape[-1]):
        # (a_l, b_l) then (a_r, b_r) -> (a_l * a_r, a_r * b_l + b_r), folded left to right
        b[..., i] = _then(a[..., i], b[..., i - 1], b[..., i])
        a[..., i] = a[..., i - 1] * a[..., i]
    return a, b


def _fold_linear_next(a, b, na, nb):
    for i in range(1, a.shape[-1]):
        # linear_combine_next: the exclusive part uses the accumulated (a, b) before this element
        nb[..., i] = _then(na[..., i], b[..., i - 1], nb[..., i])
        na[..., i] = a[..., i - 1] * na[..., i]
        b[..., i] = _then(a[..., i], b[..., i - 1], b[..., i])
        a[..., i] = a[..., i - 1] * a[..., i]
    return a, b, na, nb


def _fold_plain(a, b):
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(1, a.shape[-1]):
            b[..., i] = a[..., i] * b[..., i - 1] + b[..., i]
            a[..., i] = a[..., i - 1] * a[..., i]
    return a, b


def _fold_plain_next(a, b, na, nb):
    with np.errstate(invalid="ignore", over="ignore"):
        for i in range(1, a.shape[-1]):
            nb[..., i] = na[..., i] * b[..., i - 1] + nb[..., i]
            na[..., i] = a[..., i - 1] * na[..., i]
            b[..., i] = a[..., i] * b[..., i - 1] + b[..., i]
            a[..., i] = a[..., i - 1] * a[..., i]
    return a, b, na, nb


FOLDS = (_fold_linear, _fold_linear_next, _fold_plain, _fold_plain_next)


def install(*combines) -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - triton without an interpreter
        return False
    scan_ops = getattr(interpreter, "ScanOps", None)
    if scan_ops is None or getattr(scan_ops, "_rl_triton_patched", False):
        return scan_ops is not None
    original = scan_ops.generic_scan
    folds = {getattr(c, "fn", c): fold for c, fold in zip(combines, FOLDS, strict=False)}

    def generic_scan(self, input):
        fold = folds.get(getattr(self.combine_fn, "fn", None))
        if fold is None or len(input) != fold.__code__.co_argcount:
            return original(self, input)
        data = [np.moveaxis(x.handle.data, self.axis, -1).copy() for x in input]
        out = fold(*data)
        return [self.to_tensor(np.moveaxis(o, -1, self.axis), x.dtype) for o, x in zip(out, input, strict=True)]

    scan_ops.generic_scan = generic_scan
    scan_ops._rl_triton_patched = True
    return True
