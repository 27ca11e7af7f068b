"""Host floors: full-call times of the cheapest eager calls, measured once per suite run on the same machine and
with the same timer as the configurations' full calls (``timing.full_call_us``), so that those can be read against
what any call from Python costs there.

Rows (at ``SHAPE``, float32; on the CPU at the smoke shape):

- ``torch.empty_like``: no kernel at all, the timer's floor for one call into PyTorch;
- ``torch.add``: one ATen kernel;
- a one-line Triton copy kernel launched through Triton's own ``kernel[grid]`` (CUDA, or the interpreter);
- ``rl_triton.compute_gae``;
- a TensorDict "estimator" that only does an estimator's I/O (five ``get``, one ``torch.add``, two ``set``), and
  ``rl_triton.modules.GAE`` on the same TensorDict (both need tensordict / TorchRL; left out without them).
"""

from __future__ import annotations

import torch

from . import timing

SHAPE = (64, 512)
_KEYS = [("next", "reward"), "state_value", ("next", "state_value"), ("next", "done"), ("next", "terminated")]
_copy_kernel = None


def _triton_copy():
    """The copy kernel, defined on first use (importing this module must not need Triton)."""
    global _copy_kernel
    if _copy_kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def copy_kernel(p_x, p_y, n, BLOCK: tl.constexpr):
            o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(p_y + o, tl.load(p_x + o, mask=o < n), mask=o < n)

        _copy_kernel = copy_kernel
    return _copy_kernel


def rollout(n: int, t: int, device) -> object:
    """A ``[n, t]`` TensorDict with the entries a value estimator reads (values precomputed)."""
    from tensordict import TensorDict

    g = torch.Generator(device=device).manual_seed(0)
    done = torch.rand(n, t, 1, device=device, generator=g) < 0.02
    term = done & (torch.rand(n, t, 1, device=device, generator=g) < 0.5)
    nxt = {
        "state_value": torch.randn(n, t, 1, device=device, generator=g),
        "reward": torch.randn(n, t, 1, device=device, generator=g),
        "done": done,
        "terminated": term,
    }
    state = torch.randn(n, t, 1, device=device, generator=g)
    return TensorDict({"state_value": state, "next": nxt}, batch_size=[n, t], device=device)


def _tensordict_floor(td) -> None:
    x = [td.get(k) for k in _KEYS]
    s = torch.add(x[0], x[1])
    td.set("advantage", s)
    td.set("value_target", s)


def calls(n: int, t: int, device: torch.device) -> list[tuple[str, object, object]]:
    """(name, call(arg), setup() -> arg or None) of every row that can run here."""
    import rl_triton as R

    r, v = torch.randn(n, t, device=device), torch.randn(n, t, device=device)
    term = torch.zeros(n, t, dtype=torch.bool, device=device)
    out = torch.empty_like(r)
    rows = [
        ("torch.empty_like", lambda _: torch.empty_like(r), None),
        ("torch.add", lambda _: torch.add(r, v), None),
    ]
    if device.type == "cuda" or R.INTERPRET:
        kernel, grid = _triton_copy(), (-(-n * t // 1024),)
        rows.append(("Triton copy kernel[grid]", lambda _: kernel[grid](r, out, n * t, BLOCK=1024), None))
    rows.append(("rl_triton.compute_gae", lambda _: R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95), None))
    try:
        td = rollout(n, t, device)
    except ImportError:
        return rows
    rows.append(("TensorDict I/O: 5 get, torch.add, 2 set", _tensordict_floor, lambda: td.clone(False)))
    try:
        from rl_triton.modules import GAE
    except ImportError:
        return rows
    est = GAE(gamma=0.99, lmbda=0.95, value_network=None)
    rows.append(("rl_triton.modules.GAE", est, lambda: td.clone(False)))
    return rows


def measure(device: torch.device, budget: timing.Budget, shape: tuple[int, int] = SHAPE) -> dict:
    """The floors as a JSON-ready dict: ``{"shape": [n, t], "rows": [{"name", "full_call_us"}]}``."""
    n, t = shape
    rows = []
    with torch.no_grad():
        for name, call, setup in calls(n, t, device):
            rows.append({"name": name, "full_call_us": timing.full_call_us(call, device, budget, setup)})
    return {"shape": [n, t], "rows": rows}
