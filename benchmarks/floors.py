"""What the issue's launch-overhead targets are measured against: the full-call time (CUDA events around one call,
the median after warm-up, as ``benchmarks.targets`` times ``compute_gae``) of the cheapest eager calls on the same
machine, in the same run, at 64x512 float32:

- ``torch.empty_like``: no kernel at all (the events' floor for one Python call into PyTorch);
- ``torch.add`` and ``x.clone()``: one ATen kernel;
- a one-line Triton copy kernel launched through Triton's own ``kernel[grid]``;
- ``compute_gae`` (rl_triton's call that the target names, <= 8 us);
- a TensorDict "estimator" that does only the I/O an estimator must: five ``get``, one ``torch.add``, two ``set``
  (the floor of the GAE module target, <= 30 us), and ``rl_triton.modules.GAE`` itself.

Rounds alternate so that a slow phase of the host hits every row. Needs a CUDA GPU, tensordict and torchrl.

Usage: python -m benchmarks.floors [--rounds 3] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.language as tl

import rl_triton as R

from . import timing
from .modules_vs_torchrl import rollout


@triton.jit
def _copy_kernel(p_x, p_y, n, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p_y + o, tl.load(p_x + o, mask=o < n), mask=o < n)


_KEYS = [("next", "reward"), "state_value", ("next", "state_value"), ("next", "done"), ("next", "terminated")]


def _tensordict_floor(td) -> None:
    """An estimator's unavoidable TensorDict I/O around one eager op."""
    x = [td.get(k) for k in _KEYS]
    s = torch.add(x[0], x[1])
    td.set("advantage", s)
    td.set("value_target", s)


def calls(n: int, t: int) -> list[tuple[str, object, object]]:
    """(name, call(arg), setup() -> arg or None) of every row."""
    from rl_triton.modules import GAE

    dev = torch.device("cuda")
    r, v = torch.randn(n, t, device=dev), torch.randn(n, t, device=dev)
    term = torch.zeros(n, t, dtype=torch.bool, device=dev)
    out = torch.empty_like(r)
    td = rollout(n, t, "cuda")
    est = GAE(gamma=0.99, lmbda=0.95, value_network=None)
    grid = (triton.cdiv(n * t, 1024),)
    return [
        ("torch.empty_like", lambda _: torch.empty_like(r), None),
        ("torch.add", lambda _: torch.add(r, v), None),
        ("x.clone()", lambda _: r.clone(), None),
        ("Triton copy kernel[grid]", lambda _: _copy_kernel[grid](r, out, n * t, BLOCK=1024), None),
        ("rl_triton.compute_gae", lambda _: R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95), None),
        ("TensorDict floor: 5 get, torch.add, 2 set", _tensordict_floor, lambda: td.clone(False)),
        ("rl_triton.modules.GAE", est, lambda: td.clone(False)),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shape", default="64x512", help="NxT")
    ap.add_argument("--out", default=None, help="JSON path")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.floors needs a CUDA GPU")
    n, t = (int(s) for s in a.shape.lower().split("x"))
    dev = torch.device("cuda")
    rows = calls(n, t)
    times: dict[str, list[float]] = {name: [] for name, _, _ in rows}
    for _ in range(a.rounds):
        for name, call, setup in rows:
            times[name].append(timing.full_call_us(call, dev, timing.FULL, setup))
    for name, us in times.items():
        print(f"{name:45s} median {statistics.median(us):6.1f} us  (rounds: {', '.join(f'{x:.1f}' for x in us)})")
    if a.out:
        meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__}
        with open(a.out, "w") as f:
            json.dump({"meta": meta | {"shape": [n, t]}, "full_call_us": times}, f, indent=1)


if __name__ == "__main__":
    main()
