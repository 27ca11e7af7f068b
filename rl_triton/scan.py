"""The first-order linear recurrence every function here reduces to, with its adjoint.

    reverse:  x_t = a_t * x_{t+1} + b_t,   x_T  = init
    forward:  x_t = a_t * x_{t-1} + b_t,   x_-1 = init

:class:`LinearScan` is the differentiable form used by the PyTorch path and by the backward pass
of the kernel path. Its backward is itself a linear scan in the opposite direction over the same
coefficients shifted by one step (for the reverse recurrence, ``g_b[t] = g_x[t] + a[t-1] g_b[t-1]``),
so gradients cost one more scan, run by the same implementation as the forward (a Triton kernel
on the kernel path, a loop over time vectorised across envs on the PyTorch path).

Both are contained (docs/semantics.md): where ``a_t == 0`` the state before is not read, ``x_t = b_t``,
even when that state is NaN or infinite (``0 * x + b`` would be NaN).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

RawScan = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", bool], torch.Tensor]


def torch_scan(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool) -> torch.Tensor:
    """Loop over time, vectorised across envs. ``a``, ``b``: (N, T); ``init``: (N,) or None. Contained: the
    loop selects ``b_t`` where ``a_t == 0``, only when the plain loop met a NaN or an infinity (with finite
    states the two are the same, and the plain loop is half the operations per step)."""
    out = _loop(a, b, init, reverse, None)
    if not bool(torch.isfinite(out).all()):
        out = _loop(a, b, init, reverse, a == 0)
    return out


def _loop(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool, zero: torch.Tensor | None):
    n, t_len = b.shape
    out = torch.empty_like(b)
    x = torch.zeros(n, dtype=b.dtype, device=b.device) if init is None else init.to(b.dtype)
    steps = range(t_len - 1, -1, -1) if reverse else range(t_len)
    for t in steps:
        x = torch.addcmul(b[:, t], a[:, t], x)
        if zero is not None:
            x = torch.where(zero[:, t], b[:, t], x)
        out[:, t] = x
    return out


def shift(x: torch.Tensor, towards_future: bool, fill: torch.Tensor | None = None) -> torch.Tensor:
    """x[:, t+1] (towards_future) or x[:, t-1]; ``fill`` (N,) or zero enters at the open end."""
    col = x.new_zeros(x.shape[0], 1) if fill is None else fill.reshape(-1, 1).to(x.dtype)
    if towards_future:
        return torch.cat([x[:, 1:], col], dim=1)
    return torch.cat([col, x[:, :-1]], dim=1)


class LinearScan(torch.autograd.Function):
    """Differentiable linear scan over a raw (non-differentiable) scan implementation."""

    @staticmethod
    def forward(ctx, a, b, init, reverse: bool, raw: RawScan):
        a = a.contiguous()
        b = b.contiguous()
        init_c = None if init is None else init.contiguous()
        x = raw(a, b, init_c, reverse)
        ctx.save_for_backward(a, x, init_c)
        ctx.reverse = reverse
        ctx.raw = raw
        return x

    @staticmethod
    def backward(ctx, gx):
        a, x, init = ctx.saved_tensors
        reverse, raw = ctx.reverse, ctx.raw
        # Coefficient linking step t to the step that feeds it, shifted to the adjoint's order.
        a_adj = shift(a, towards_future=not reverse)
        gb = raw(a_adj.contiguous(), gx.contiguous(), None, not reverse)
        x_prev = shift(x, towards_future=reverse, fill=init)
        ga = gb * x_prev
        g_init = None
        if init is not None and ctx.needs_input_grad[2]:
            first = -1 if reverse else 0
            g_init = a[:, first] * gb[:, first]
        return ga, gb, g_init, None, None


def linear_scan(
    a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool, raw: RawScan = torch_scan
) -> torch.Tensor:
    return LinearScan.apply(a, b, init, reverse, raw)
