"""Speeds up ``tl.associative_scan`` and ``tl.reduce`` of our combines under ``TRITON_INTERPRET=1``.

Triton's interpreter runs a scan or a reduction with a user combine function one element at a time in Python
(about 0.1 ms per element), which makes interpreted tests of realistic sizes take minutes. For the
combines registered here (the core's ``linear_combine``, ``linear_combine_next`` and their plain forms;
:mod:`rl_triton.llm`'s GAE pair map; the core's pairwise sum), this replaces that loop by the same left fold
vectorised with NumPy across the other axes: identical semantics (an inclusive scan along the axis, or its last
element), just fast. Every other scan and reduction goes through Triton's own code. Only the interpreter is
affected (``tests/test_interpret_fastpath.py`` checks the core's folds against a float64 loop).
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


def fold_gae_pair(p, q, r, b1, b2):
    """The fold of rl_triton.llm's ``_gae_combine``: maps ``L' = p L + q nv + b1, nv' = r nv + b2``, the earlier
    element (f) applied first, then the later one (g)."""
    with np.errstate(all="ignore"):
        for i in range(1, p.shape[-1]):
            pf, qf, rf, b1f, b2f = p[..., i - 1], q[..., i - 1], r[..., i - 1], b1[..., i - 1], b2[..., i - 1]
            pg, qg, rg, b1g, b2g = (x[..., i].copy() for x in (p, q, r, b1, b2))
            p[..., i], q[..., i], r[..., i] = pg * pf, pg * qf + qg * rf, rg * rf
            b1[..., i], b2[..., i] = pg * b1f + qg * b2f + b1g, rg * b2f + b2g
    return p, q, r, b1, b2


def fold_sums(*xs):
    """The left fold of a reduction whose combine adds each operand to its own (core._add_pairs): the last
    element of each operand's running sum (NumPy's cumsum adds in order)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return [np.cumsum(x, axis=-1)[..., -1] for x in xs]


FOLDS = (_fold_linear, _fold_linear_next, _fold_plain, _fold_plain_next)
_FOLDS: dict = {}  # a scan's combine (its Python function) -> its fold
_REDUCE_FOLDS: dict = {}  # the same for reductions


def _fast_scan(original):
    def generic_scan(self, input):
        fold = _FOLDS.get(getattr(self.combine_fn, "fn", None))
        if fold is None or len(input) != fold.__code__.co_argcount:
            return original(self, input)
        data = [np.moveaxis(x.handle.data, self.axis, -1).copy() for x in input]
        out = fold(*data)
        return [self.to_tensor(np.moveaxis(o, -1, self.axis), x.dtype) for o, x in zip(out, input, strict=True)]

    return generic_scan


def _fast_reduce(original):
    def generic_reduce(self, input):
        fold = _REDUCE_FOLDS.get(getattr(self.combine_fn, "fn", None))
        if fold is None or self.axis is None:
            return original(self, input)
        out = fold(*(np.moveaxis(x.handle.data, self.axis, -1) for x in input))
        if self.keep_dims:
            out = [np.expand_dims(o, self.axis) for o in out]
        dtypes = [x.handle.data.dtype for x in input]
        return [self.to_tensor(np.asarray(o, dtype=d), x.dtype) for o, d, x in zip(out, dtypes, input, strict=True)]

    return generic_reduce


def _patch_once(class_name: str, method: str, make) -> bool:
    """Replaces ``method`` of the interpreter's ``class_name`` by ``make(original)``, the first time only. False
    without an interpreter."""
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - triton without an interpreter
        return False
    ops = getattr(interpreter, class_name, None)
    if ops is None:
        return False
    if not vars(ops).get("_rl_triton_patched"):  # this class's own flag, not one inherited from a patched base
        setattr(ops, method, make(getattr(ops, method)))
        ops._rl_triton_patched = True
    return True


def install(*combines, folds=FOLDS) -> bool:
    """Registers each combine with the fold at its position in ``folds`` (the core's four by default) and, the
    first time, routes the interpreter's scans through the registered folds. False without an interpreter."""
    _FOLDS.update((getattr(c, "fn", c), fold) for c, fold in zip(combines, folds, strict=False))
    return _patch_once("ScanOps", "generic_scan", _fast_scan)


def install_reduce(combine, fold) -> bool:
    """Registers a reduction's combine with its fold (:func:`fold_sums`) and, the first time, routes the
    interpreter's reductions along an axis through the registered folds. False without an interpreter."""
    _REDUCE_FOLDS[getattr(combine, "fn", combine)] = fold
    return _patch_once("ReduceOps", "generic_reduce", _fast_reduce)
