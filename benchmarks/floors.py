"""Host floors: full-call times of the cheapest eager calls, measured once per suite run on the same machine and
with the same timer as the configurations' full calls (``timing.full_call_us``), so that those can be read against
what any call from Python costs there; and each call's wall time against ``torch.add``'s (the host-cost targets).

Rows (at ``SHAPE``, float32; on the CPU at the smoke shape):

- ``torch.empty_like``: no kernel at all, the timer's floor for one call into PyTorch;
- ``torch.add``: one ATen kernel, the reference of the ratios;
- a one-line Triton copy kernel launched through Triton's own ``kernel[grid]`` (CUDA, or the interpreter);
- the seven public functions, ``rl_triton.compute_gae`` first (target: at most ``FUNCTION_TARGET`` x torch.add);
- a TensorDict "estimator" that only does an estimator's I/O (five ``get``, one ``torch.add``, two ``set``), and
  ``rl_triton.modules.GAE``, ``TD0Estimator``, ``TD1Estimator`` and ``TDLambdaEstimator`` on the same TensorDict
  (target: at most ``ESTIMATOR_TARGET`` x torch.add; these rows need tensordict / TorchRL and are left out
  without them).

Each row records ``full_call_us`` (``timing.full_call_us``: CUDA events around one call on the GPU) and
``wall_us``: the median wall time of at least ``WALL_CALLS`` calls (on the GPU; a few on the CPU), each followed
by a synchronize, timed round-robin with the other rows so that every row sees the same stretch of the run.
``vs_add`` is ``wall_us`` over torch.add's, and rows with a target say whether they ``met`` it.

``python -m benchmarks.floors`` measures them alone (``--json PATH`` writes them); ``--recorded`` instead times the
host side of the kernel path on CPU tensors with the launches recorded, not run (no GPU needed: what our Python
costs between the call and the launch).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from . import timing

SHAPE = (64, 512)
WALL_CALLS = 500  # per row, on the GPU (the "median of >= 500 calls, each followed by a synchronize")
ROUNDS = 10  # the calls of each row are spread over this many round-robin rounds
FUNCTION_TARGET, ESTIMATOR_TARGET = 1.5, 2.5  # wall time over torch.add's
NUM_ACTIONS = 4
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


def calls(n: int, t: int, device: torch.device, kernels: bool | None = None) -> list[tuple]:
    """(name, call(arg), setup() -> arg or None, target or None) of every row that can run here. ``kernels``:
    whether the Triton copy kernel can run (default: on CUDA or under the interpreter)."""
    import rl_triton as R

    g = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=g)

    r, v, nv, lp = randn(n, t), randn(n, t), randn(n, t), 0.1 * randn(n, t)
    term = torch.zeros(n, t, dtype=torch.bool, device=device)
    probs = torch.softmax(randn(n, t, NUM_ACTIONS), -1)
    nq, mu = randn(n, t, NUM_ACTIONS), probs[..., 0].contiguous()
    act = torch.zeros(n, t, dtype=torch.int64, device=device)
    out = torch.empty_like(r)
    f = FUNCTION_TARGET
    rows = [
        ("torch.empty_like", lambda _: torch.empty_like(r), None, None),
        ("torch.add", lambda _: torch.add(r, v), None, None),
    ]
    if kernels is None:
        kernels = device.type == "cuda" or R.INTERPRET
    if kernels:
        kernel, grid = _triton_copy(), (-(-n * t // 1024),)
        rows.append(("Triton copy kernel[grid]", lambda _: kernel[grid](r, out, n * t, BLOCK=1024), None, None))
    rows += [
        ("rl_triton.compute_gae", lambda _: R.compute_gae(r, v, term, gamma=0.99, lambda_=0.95), None, f),
        ("rl_triton.compute_vtrace", lambda _: R.compute_vtrace(lp, lp, v, r, term, gamma=0.99), None, f),
        (
            "rl_triton.compute_retrace",
            lambda _: R.compute_retrace(probs, mu, v, nq, act, r, term, term, gamma=0.99, lambda_=0.95),
            None,
            f,
        ),
        ("rl_triton.compute_discounted_returns", lambda _: R.compute_discounted_returns(r, term, gamma=0.99), None, f),
        (
            "rl_triton.compute_lambda_returns",
            lambda _: R.compute_lambda_returns(r, nv, term, gamma=0.99, lambda_=0.95),
            None,
            f,
        ),
        (
            "rl_triton.compute_eligibility_traces",
            lambda _: R.compute_eligibility_traces(r, term, gamma=0.99, lambda_=0.95),
            None,
            f,
        ),
        ("rl_triton.compute_episodic_prefix_sum", lambda _: R.compute_episodic_prefix_sum(r, term), None, f),
    ]
    try:
        td = rollout(n, t, device)
    except ImportError:
        return rows
    rows.append(("TensorDict I/O: 5 get, torch.add, 2 set", _tensordict_floor, lambda: td.clone(False), None))
    try:
        from rl_triton.modules import GAE, TD0Estimator, TD1Estimator, TDLambdaEstimator
    except ImportError:
        return rows
    estimators = {
        "GAE": GAE(gamma=0.99, lmbda=0.95, value_network=None),
        "TD0Estimator": TD0Estimator(gamma=0.99, value_network=None),
        "TD1Estimator": TD1Estimator(gamma=0.99, value_network=None),
        "TDLambdaEstimator": TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=None),
    }
    for name, est in estimators.items():
        rows.append((f"rl_triton.modules.{name}", est, lambda: td.clone(False), ESTIMATOR_TARGET))
    return rows


def wall_us(rows: list[tuple], device: torch.device, calls: int, rounds: int = ROUNDS, warmup: int = 20) -> list:
    """Per row, the median wall time (us) of ``calls`` calls ``call(setup())``, each followed by a synchronize
    (``setup`` outside the timed region), in ``rounds`` round-robin rounds over the rows."""
    per_round = max(1, -(-calls // rounds))
    samples = [[] for _ in rows]
    for _, call, setup, _ in rows:
        for _ in range(warmup):
            call(setup() if setup else None)
    timing.sync(device)
    clock = time.perf_counter
    for _ in range(rounds):
        for i, (_, call, setup, _) in enumerate(rows):
            times = samples[i]
            for _ in range(per_round):
                arg = setup() if setup else None
                t0 = clock()
                call(arg)
                timing.sync(device)
                times.append(clock() - t0)
                del arg
    return [statistics.median(s) * 1e6 for s in samples]


def _ratios(out: list[dict]) -> None:
    """Each row's ``vs_add`` and, for rows with a target, whether it is ``met``."""
    add = next(r["wall_us"] for r in out if r["name"] == "torch.add")
    for r in out:
        r["vs_add"] = r["wall_us"] / add
        if r.get("target") is not None:
            r["met"] = r["vs_add"] <= r["target"]


def measure(device: torch.device, budget: timing.Budget, shape: tuple[int, int] = SHAPE) -> dict:
    """The floors as a JSON-ready dict: ``{"shape": [n, t], "wall_calls": k, "rows": [{"name", "full_call_us",
    "wall_us", "vs_add", "target", "met"}]}`` (``target`` and ``met`` only on rows with a target)."""
    n, t = shape
    out = []
    cuda = device.type == "cuda"
    k = WALL_CALLS if cuda else 3  # CPU runs are smoke runs: the times mean nothing there
    with torch.no_grad():
        rows = calls(n, t, device)
        for name, call, setup, target in rows:
            row = {"name": name, "full_call_us": timing.full_call_us(call, device, budget, setup)}
            if target is not None:
                row["target"] = target
            out.append(row)
        for row, us in zip(out, wall_us(rows, device, k, rounds=min(ROUNDS, k), warmup=20 if cuda else 1), strict=True):
            row["wall_us"] = us
    _ratios(out)
    return {"shape": [n, t], "wall_calls": k, "rows": out}


def recorded(shape: tuple[int, int] = SHAPE, calls_per_row: int = 2000) -> dict:
    """The host side of the kernel path without a GPU: CPU tensors take the kernel path with every launch
    skipped (``launch._launch`` stubbed, as ``benchmarks.tune.recorded_launches`` does, but keeping nothing, so
    that outputs are freed as in a real loop), timed like :func:`measure`'s ``wall_us``. Retrace's CPU actions
    are made cacheable as CUDA ones are (their range check reads the values, so the validation cache never keeps
    CPU actions). What our Python costs from the call to the launch."""
    import os

    from rl_triton import _config, _validation
    from rl_triton.kernels import launch

    if _config.INTERPRET or os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("--recorded: run without TRITON_INTERPRET=1 (the launches are stubbed, not interpreted)")
    n, t = shape
    device = torch.device("cpu")
    saved = launch._launch, _config.INTERPRET, _validation.cacheable_actions
    launch._launch, _config.INTERPRET = (lambda built, i, args: None), True
    _validation.cacheable_actions = lambda actions: True
    try:
        with torch.no_grad():
            rows = calls(n, t, device, kernels=False)
            us = wall_us(rows, device, calls_per_row, warmup=200)
    finally:
        launch._launch, _config.INTERPRET, _validation.cacheable_actions = saved
    out = [
        {"name": name, "wall_us": u, **({"target": g} if g else {})} for (name, *_, g), u in zip(rows, us, strict=True)
    ]
    _ratios(out)
    return {"shape": [n, t], "wall_calls": calls_per_row, "recorded": True, "rows": out}


def table(floors: dict) -> str:
    """The floors with their ratios to torch.add, as a markdown table."""
    n, t = floors["shape"]
    what = "host time of the kernel path, launches stubbed" if floors.get("recorded") else "wall time"
    lines = [
        f"Host floors at {n}x{t} float32 ({what}: median of {floors['wall_calls']} calls, each followed by a "
        "synchronize):",
        "",
        "| call | full call | wall | vs torch.add | target |",
        "| --- | ---: | ---: | ---: | --- |",
    ]
    for r in floors["rows"]:
        full = f"{r['full_call_us']:.1f} us" if "full_call_us" in r else ""
        target = "" if r.get("target") is None else f"<= {r['target']}x: {'met' if r['met'] else 'missed'}"
        lines.append(f"| {r['name']} | {full} | {r['wall_us']:.1f} us | {r['vs_add']:.2f}x | {target} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.floors", description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke run: times mean nothing)")
    ap.add_argument("--shape", default=f"{SHAPE[0]}x{SHAPE[1]}", help="NxT (default %(default)s)")
    ap.add_argument("--recorded", action="store_true", help="CPU kernel path with recorded launches (no GPU)")
    ap.add_argument("--json", default=None, help="write the floors to this JSON file")
    args = ap.parse_args(argv)
    shape = tuple(int(x) for x in args.shape.lower().split("x"))
    if args.recorded:
        floors = recorded(shape)
    else:
        floors = measure(torch.device(args.device), timing.FULL, shape)
    print(table(floors), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(floors, f, indent=1)
    return floors


if __name__ == "__main__":
    main()
