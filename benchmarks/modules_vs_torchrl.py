"""Our ``rl_triton.modules.GAE`` against TorchRL's ``GAE`` module (default and vectorized=True)
on CUDA TensorDicts: full-call time (CUDA events around one forward, median after warm-up), in
the same run, after checking that the outputs agree.

Usage: python benchmarks/modules_vs_torchrl.py [--out results.json]
"""

from __future__ import annotations

import argparse
import json

import torch
from tensordict import TensorDict
from torchrl.objectives.value import GAE as TorchRLGAE

from rl_triton.modules import GAE


def rollout(n: int, t: int, device: str) -> TensorDict:
    g = torch.Generator(device=device).manual_seed(0)
    done = torch.rand(n, t, 1, device=device, generator=g) < 0.02
    term = done & (torch.rand(n, t, 1, device=device, generator=g) < 0.5)
    return TensorDict(
        {
            "state_value": torch.randn(n, t, 1, device=device, generator=g),
            "next": {
                "state_value": torch.randn(n, t, 1, device=device, generator=g),
                "reward": torch.randn(n, t, 1, device=device, generator=g),
                "done": done,
                "terminated": term,
            },
        },
        batch_size=[n, t],
        device=device,
    )


def full_call_us(module, td: TensorDict, reps: int = 50) -> float:
    for _ in range(5):
        module(td.clone(False))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        data = td.clone(False)  # shallow: new container, same tensors (outputs are new keys)
        start.record()
        module(data)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    rows = []
    for n, t in [(64, 512), (1024, 1024), (4096, 2048)]:
        td = rollout(n, t, "cuda")
        ours = GAE(gamma=0.99, lmbda=0.95, value_network=None)
        theirs = TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None)
        theirs_vec = TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None, vectorized=True)
        a, b = ours(td.clone(False)), theirs(td.clone(False))
        torch.testing.assert_close(a["advantage"], b["advantage"], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(a["value_target"], b["value_target"], atol=1e-4, rtol=1e-4)
        row = {
            "num_envs": n,
            "seq_len": t,
            "ours_us": full_call_us(ours, td),
            "torchrl_us": full_call_us(theirs, td, reps=10),
            "torchrl_vectorized_us": full_call_us(theirs_vec, td, reps=10),
        }
        row["speedup_vs_torchrl"] = row["torchrl_us"] / row["ours_us"]
        row["speedup_vs_torchrl_vectorized"] = row["torchrl_vectorized_us"] / row["ours_us"]
        rows.append(row)
        print(
            f"GAE module {n}x{t}: ours {row['ours_us']:.1f} us, TorchRL {row['torchrl_us']:.1f} us "
            f"({row['speedup_vs_torchrl']:.1f}x), TorchRL vectorized {row['torchrl_vectorized_us']:.1f} us "
            f"({row['speedup_vs_torchrl_vectorized']:.1f}x)"
        )
    if args.out:
        meta = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
