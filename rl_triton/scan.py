"""The first-order linear recurrence every function here reduces to, with its adjoint.

    reverse:  x_t = a_t * x_{t+1} + b_t,   x_T  = init
    forward:  x_t = a_t * x_{t-1} + b_t,   x_-1 = init

:class:`LinearScan` is the differentiable form used by the PyTorch path and by the backward pass
of the kernel path. Its backward is itself a linear scan in the opposite direction over the same
coefficients shifted by one step (for the reverse recurrence, ``g_b[t] = g_x[t] + a[t-1] g_b[t-1]``),
so gradients cost one more scan, run by the same implementation as the forward (a Triton kernel
on the kernel path, :func:`torch_scan` on the PyTorch path).

Both are contained (docs/semantics.md): where ``a_t == 0`` the state before is not read, ``x_t = b_t``,
even when that state is NaN or infinite (``0 * x + b`` would be NaN).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

RawScan = Callable[[torch.Tensor, torch.Tensor, "torch.Tensor | None", bool], torch.Tensor]


def torch_scan(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool) -> torch.Tensor:
    """The recurrence in ``ceil(log2 T)`` vectorised passes (a Hillis-Steele scan of the affine maps
    ``x -> a_t x + b_t``), no Python loop over time. ``a``, ``b``: (N, T); ``init``: (N,) or None.

    Contained: the plain passes (``a_t b_u + b_t`` everywhere, half the operations) are kept when every output
    is finite; a NaN or an infinity anywhere sends the call through the passes that select ``b_t`` where the
    composed coefficient is zero, so a non-finite state behind a zero coefficient is never read. With finite
    states the two agree exactly (``0 * x + b == b``)."""
    b = _fold_init(a, b, init, reverse)
    if b.is_cuda and torch.cuda.is_current_stream_capturing():
        return _doubling(a, b, reverse, True)  # no host read in a CUDA graph: the contained passes at once
    out = _doubling(a, b, reverse, False)
    if not bool(torch.isfinite(out).all()):
        out = _doubling(a, b, reverse, True)
    return out


def _fold_init(a: torch.Tensor, b: torch.Tensor, init: torch.Tensor | None, reverse: bool) -> torch.Tensor:
    """``b`` with the boundary state entered at the open end: ``b_e + a_e init`` (``b_e`` where ``a_e == 0``)."""
    if init is None or b.shape[1] == 0:
        return b
    e = b.shape[1] - 1 if reverse else 0
    b = b.clone()
    ae = a[:, e]
    b[:, e] = torch.where(ae == 0, b[:, e], torch.addcmul(b[:, e], ae, init.to(b.dtype)))
    return b


def _doubling(a: torch.Tensor, b: torch.Tensor, reverse: bool, contained: bool) -> torch.Tensor:
    """Round s composes each step's map with the one ``s`` steps further along the scan (``s = 1, 2, 4 ...``):
    after it, step t holds the map of the ``2s`` steps from t (fewer near the end), whose ``b`` applied to a
    zero state is x_t. Each round writes fresh tensors: the right-hand sides read the previous round's."""
    t_len = b.shape[1]
    if t_len <= 1:
        return b.clone()  # outputs are fresh tensors, never the caller's
    s = 1
    while s < t_len:
        # ``head``: the steps with a partner s steps along; ``tail``: those partners; ``rest``: no partner
        head, tail = (slice(0, t_len - s), slice(s, t_len)) if reverse else (slice(s, t_len), slice(0, t_len - s))
        rest = slice(t_len - s, t_len) if reverse else slice(0, s)
        a_head = a[:, head]
        nb = torch.empty_like(b)
        torch.addcmul(b[:, head], a_head, b[:, tail], out=nb[:, head])
        if contained:
            nb[:, head] = torch.where(a_head == 0, b[:, head], nb[:, head])
        nb[:, rest] = b[:, rest]
        if 2 * s < t_len:  # the last round's coefficients are never read
            na = torch.empty_like(a)
            torch.mul(a_head, a[:, tail], out=na[:, head])
            na[:, rest] = a[:, rest]
            a = na
        b = nb
        s *= 2
    return b


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
