"""Run every rl_triton function once and check it against a float64 PyTorch evaluation.

For each of the seven functions the demo builds a realistic rollout batch -- random rewards and
values, a few terminations, truncations with bootstrap values at the truncated steps and at the
window end, and for the off-policy methods genuine softmax policies with actions sampled from the
behaviour policy -- and then

1. calls the function on the chosen device (CUDA if available, else CPU) with the default
   ("auto") backend: Triton kernels on CUDA, and on CPU the PyTorch path, or the Triton kernels
   through the Triton interpreter when TRITON_INTERPRET=1 is set;
2. calls it again under ``rl_triton.use_backend("torch")`` on float64 CPU copies of the same
   inputs, which evaluates the formulas of docs/semantics.md in float64;
3. prints the largest absolute difference and the median time of a call, and fails (exit code 1)
   if any difference exceeds the tolerance for the dtype.

Usage::

    python examples/demo.py                         # CUDA if available, else CPU
    python examples/demo.py --device cpu --num-envs 8 --seq-len 1000
    TRITON_INTERPRET=1 python examples/demo.py --device cpu   # kernels via the Triton interpreter
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

import torch
import triton

import rl_triton

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}

# (atol, rtol) per dtype. The float64 reference is evaluated on the very same (rounded) inputs, so
# the remaining error is float32 accumulation plus the rounding of the outputs to the dtype.
TOLERANCES = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 1e-2),
}

GAMMA = 0.99
LAMBDA = 0.95
NUM_ACTIONS = 4
TERMINATION_PROB = 0.02
TRUNCATION_PROB = 0.01


def make_batch(num_envs: int, seq_len: int, seed: int) -> dict[str, torch.Tensor]:
    """A rollout batch in float64 on the CPU; flags are bool, actions int64."""
    g = torch.Generator().manual_seed(seed)
    n, t, a = num_envs, seq_len, NUM_ACTIONS

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    terminateds = torch.rand(n, t, generator=g) < TERMINATION_PROB
    truncateds = (torch.rand(n, t, generator=g) < TRUNCATION_PROB) & ~terminateds
    dones = terminateds | truncateds

    # Continuation values come from outside the buffer at truncated steps and at the window end
    # (unless the episode terminated there); everywhere else bootstrap_values stays zero.
    boundary = truncateds.clone()
    boundary[:, -1] = True
    bootstrap_values = torch.where(boundary & ~terminateds, randn(n, t), torch.zeros(()))

    # Two genuine policies over NUM_ACTIONS actions; the actions come from the behaviour policy.
    probs_target = torch.softmax(randn(n, t, a), dim=-1)
    probs_behavior = torch.softmax(randn(n, t, a), dim=-1)
    actions = torch.multinomial(probs_behavior.reshape(-1, a), 1, generator=g).reshape(n, t)
    taken = actions.unsqueeze(-1)

    return {
        "rewards": randn(n, t),
        "values": randn(n, t),
        "next_values": randn(n, t),
        "terminateds": terminateds,
        "truncateds": truncateds,
        "dones": dones,
        "bootstrap_values": bootstrap_values,
        "log_pi_target": probs_target.gather(-1, taken).squeeze(-1).log(),
        "log_pi_behavior": probs_behavior.gather(-1, taken).squeeze(-1).log(),
        "action_probs_target": probs_target,
        "action_probs_behavior": probs_behavior.gather(-1, taken).squeeze(-1),
        "actions": actions,
        "q_values": randn(n, t),
        "next_q_values_all": randn(n, t, a),
        "gradients": randn(n, t),
        "inputs": randn(n, t),
        "seed_values": randn(n),
    }


# name -> (call, key of the tensor whose shape the table shows)
CASES: dict[str, tuple[Callable[[dict[str, torch.Tensor]], object], str]] = {
    "compute_gae": (
        lambda b: rl_triton.compute_gae(
            b["rewards"],
            b["values"],
            b["terminateds"],
            b["truncateds"],
            gamma=GAMMA,
            lambda_=LAMBDA,
            bootstrap_values=b["bootstrap_values"],
        ),
        "rewards",
    ),
    "compute_vtrace": (
        lambda b: rl_triton.compute_vtrace(
            b["log_pi_target"],
            b["log_pi_behavior"],
            b["values"],
            b["rewards"],
            b["terminateds"],
            b["truncateds"],
            gamma=GAMMA,
            rho_bar=1.0,
            c_bar=1.0,
            bootstrap_values=b["bootstrap_values"],
        ),
        "rewards",
    ),
    "compute_retrace": (
        lambda b: rl_triton.compute_retrace(
            b["action_probs_target"],
            b["action_probs_behavior"],
            b["q_values"],
            b["next_q_values_all"],
            b["actions"],
            b["rewards"],
            b["terminateds"],
            b["truncateds"],
            gamma=GAMMA,
            lambda_=LAMBDA,
        ),
        "next_q_values_all",
    ),
    "compute_discounted_returns": (
        lambda b: rl_triton.compute_discounted_returns(
            b["rewards"],
            b["terminateds"],
            b["truncateds"],
            gamma=GAMMA,
            bootstrap_values=b["bootstrap_values"],
        ),
        "rewards",
    ),
    "compute_lambda_returns": (
        lambda b: rl_triton.compute_lambda_returns(
            b["rewards"],
            b["next_values"],
            b["terminateds"],
            b["truncateds"],
            gamma=GAMMA,
            lambda_=LAMBDA,
            bootstrap_values=b["bootstrap_values"],
        ),
        "rewards",
    ),
    "compute_eligibility_traces": (
        lambda b: rl_triton.compute_eligibility_traces(
            b["gradients"],
            b["dones"],
            gamma=GAMMA,
            lambda_=LAMBDA,
            seed_values=b["seed_values"],
        ),
        "gradients",
    ),
    "compute_episodic_prefix_sum": (
        lambda b: rl_triton.compute_episodic_prefix_sum(
            b["inputs"],
            b["dones"],
            boundary="ends_at",
            seed_values=b["seed_values"],
        ),
        "inputs",
    ),
}


def as_tuple(out: object) -> tuple[torch.Tensor, ...]:
    return out if isinstance(out, tuple) else (out,)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def effective_backend(requested: str, device: torch.device) -> str:
    """What the dispatcher picks for `requested` on `device` (see API.md, "Backends")."""
    if requested == "torch":
        return "torch"
    if device.type == "cuda":
        return "triton"
    if requested == "triton" or rl_triton.INTERPRET:
        return "triton-interp" if rl_triton.INTERPRET else "triton (no interpreter!)"
    return "torch"


def check(
    name: str,
    batch64: dict[str, torch.Tensor],
    dtype: torch.dtype,
    device: torch.device,
    backend: str,
    repeats: int,
) -> tuple[float, bool, float]:
    """Returns (max abs error, within tolerance, median ms per call)."""
    call, _ = CASES[name]
    # Inputs in the requested dtype on the device, and float64 CPU copies of exactly those values.
    batch = {k: (v.to(dtype) if v.is_floating_point() else v).to(device) for k, v in batch64.items()}
    ref_batch = {k: (v.cpu().double() if v.is_floating_point() else v.cpu()) for k, v in batch.items()}

    with rl_triton.use_backend("torch"):
        expected = as_tuple(call(ref_batch))

    with rl_triton.use_backend(backend):
        out = as_tuple(call(batch))  # first call: compiles the kernels on CUDA
        synchronize(device)
        times = []
        for _ in range(repeats):
            synchronize(device)
            start = time.perf_counter()
            call(batch)
            synchronize(device)
            times.append((time.perf_counter() - start) * 1e3)

    atol, rtol = TOLERANCES[dtype]
    max_err, ok = 0.0, len(out) == len(expected)
    for got, want in zip(out, expected, strict=False):
        ok &= got.shape == want.shape and got.dtype == dtype and got.device.type == device.type
        diff = (got.detach().cpu().double() - want).abs()
        ok &= bool(torch.isfinite(diff).all()) and bool((diff <= atol + rtol * want.abs()).all())
        if diff.numel():
            max_err = max(max_err, float(diff.max()))
    return max_err, ok, statistics.median(times) if times else float("nan")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available, else cpu)")
    parser.add_argument("--num-envs", type=int, default=None, help="default: 64 on CUDA, 16 on CPU")
    parser.add_argument("--seq-len", type=int, default=None, help="default: 512 on CUDA, 256 on CPU")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument(
        "--backend",
        choices=["auto", "torch", "triton"],
        default="auto",
        help="backend for the timed call (the reference always uses the torch backend in float64)",
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="timed calls after a warm-up (default: 20 on CUDA, 3 on CPU)"
    )
    args = parser.parse_args(argv)

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda was asked for, but torch sees no CUDA device")
    if device.type not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda or cpu, got {args.device!r}")
    on_gpu = device.type == "cuda"
    num_envs = args.num_envs if args.num_envs is not None else (64 if on_gpu else 16)
    seq_len = args.seq_len if args.seq_len is not None else (512 if on_gpu else 256)
    repeats = args.repeats if args.repeats is not None else (20 if on_gpu else 3)
    if num_envs < 1 or seq_len < 1 or repeats < 0:
        parser.error("--num-envs and --seq-len must be >= 1, --repeats >= 0")
    dtype = DTYPES[args.dtype]
    backend = effective_backend(args.backend, device)

    where = torch.cuda.get_device_name(device) if on_gpu else "CPU"
    print(
        f"rl_triton demo: torch {torch.__version__}, triton {triton.__version__}, {where}, "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '0')}, dtype {args.dtype}, seed {args.seed}"
    )
    print(f"reference: use_backend('torch') on float64 CPU copies; time: median of {repeats} calls after a warm-up")
    print()

    batch64 = make_batch(num_envs, seq_len, args.seed)
    atol, rtol = TOLERANCES[dtype]
    header = f"{'function':<28} {'shape':<12} {'device':<6} {'backend':<14} {'max abs err':>11} {'time ms':>9}  status"
    print(header)
    print("-" * len(header))
    failures = 0
    for name, (_, shape_key) in CASES.items():
        shape = "x".join(str(s) for s in batch64[shape_key].shape)
        try:
            err, ok, ms = check(name, batch64, dtype, device, args.backend, repeats)
        except Exception as exc:  # report every function, then fail at the end
            failures += 1
            print(f"{name:<28} {shape:<12} {device.type:<6} {backend:<14} {'-':>11} {'-':>9}  ERROR {exc!r}")
            continue
        failures += not ok
        status = "ok" if ok else f"FAIL (tolerance atol={atol:g} rtol={rtol:g})"
        print(f"{name:<28} {shape:<12} {device.type:<6} {backend:<14} {err:>11.2e} {ms:>9.3f}  {status}")

    print()
    if failures:
        print(f"{failures} of {len(CASES)} functions disagree with the float64 reference")
        return 1
    print(f"all {len(CASES)} functions agree with the float64 reference (atol={atol:g}, rtol={rtol:g})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
