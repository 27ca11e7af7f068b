"""Speeds up ``tl.associative_scan`` of the linear-recurrence combine under ``TRITON_INTERPRET=1``.

Triton's interpreter runs a scan with a user combine function one element at a time in Python
(about 0.1 ms per element), which makes interpreted tests of realistic sizes take minutes. For our
combine only, this replaces that loop by the same left fold vectorised with NumPy across the
other axes: identical semantics (an inclusive scan of ``linear_combine`` along the axis), just
fast. Every other scan goes through Triton's own code. Only the interpreter is affected.
"""

from __future__ import annotations

import numpy as np


def install(combine) -> bool:
    try:
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover - triton without an interpreter
        return False
    scan_ops = getattr(interpreter, "ScanOps", None)
    if scan_ops is None or getattr(scan_ops, "_rl_triton_patched", False):
        return scan_ops is not None
    original = scan_ops.generic_scan
    target = getattr(combine, "fn", combine)

    def generic_scan(self, input):
        if getattr(self.combine_fn, "fn", None) is not target or len(input) != 2:
            return original(self, input)
        a = np.moveaxis(input[0].handle.data, self.axis, -1).copy()
        b = np.moveaxis(input[1].handle.data, self.axis, -1).copy()
        for i in range(1, a.shape[-1]):
            # (a_l, b_l) then (a_r, b_r) -> (a_l * a_r, a_r * b_l + b_r), folded left to right
            b[..., i] = a[..., i] * b[..., i - 1] + b[..., i]
            a[..., i] = a[..., i - 1] * a[..., i]
        return [
            self.to_tensor(np.moveaxis(a, -1, self.axis), input[0].dtype),
            self.to_tensor(np.moveaxis(b, -1, self.axis), input[1].dtype),
        ]

    scan_ops.generic_scan = generic_scan
    scan_ops._rl_triton_patched = True
    return True
