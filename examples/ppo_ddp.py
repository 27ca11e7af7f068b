"""PPO on CartPole-v1 as ``ppo.py``, data-parallel: one process per device under ``torchrun``.

Every rank runs its own TorchRL ``Collector`` over its share of the environments (``--num-envs`` and
``--minibatch`` are totals over all ranks and are split evenly), with rank-dependent seeds, and computes
GAE with rl_triton's estimator on its own device. Advantages are normalised with the mean and standard
deviation of all ranks' entries (``rl_triton.distributed.normalize_advantages``, one small all-gather),
by default per global minibatch: the union of the ranks' local minibatches is exactly the minibatch of
``ppo.py``, so the update does not depend on the number of processes. The loss module is wrapped in
``DistributedDataParallel`` (gradients averaged over ranks); finished episodes are gathered from all
ranks, so every rank keeps the same learning curve and stops at the same batch.

Usage::

    torchrun --standalone --nproc_per_node 2 examples/ppo_ddp.py --device cpu      # 2 processes, gloo
    torchrun --standalone --nproc_per_node 4 examples/ppo_ddp.py                   # 4 GPUs, NCCL
    python examples/ppo_ddp.py --smoke                                             # one process, no torchrun

The backend follows the device: NCCL for CUDA (each rank on ``cuda:LOCAL_RANK``), gloo otherwise.
Without ``torchrun`` the script runs as a group of one process. Rank 0 draws the progress bar and
writes ``--log``/``--plot`` and the ``RESULT`` line.
"""

from __future__ import annotations

import inspect
import json
import os

import _common as common
import ppo
import torch
import torch.distributed as dist

from rl_triton.distributed import normalize_advantages


def build_parser():
    p = ppo.build_parser()
    p.description = __doc__.split("\n\n")[0]
    p.add_argument(
        "--adv-norm",
        choices=("minibatch", "batch", "rank"),
        default="minibatch",
        help="normalise advantages over each global minibatch (as ppo.py), over the whole global batch per epoch, "
        "or (for comparison) over each rank's own minibatch, as ClipPPOLoss(normalize_advantage=True) would under DDP",
    )
    return p


def init_distributed(device_flag: str):
    """Joins the ``torchrun`` job (or makes a group of this process alone) and returns
    ``(rank, world_size, device)``. CUDA: NCCL, one device per local rank; otherwise gloo."""
    rank = int(os.environ.get("RANK", 0))
    world = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(device_flag)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank if device.index is None else device.index)
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ:
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    else:  # plain `python ppo_ddp.py`: a group of one, so that the same code path runs
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return rank, world, device


def env_seed(seed: int, index: int) -> int:
    """The seed of env ``index`` of a ``SerialEnv`` seeded with ``seed``: TorchRL chains the seeds of a
    batched env (each env's ``set_seed`` returns the next), so rank ``r`` starting at env ``r * n_local``
    makes the union of all ranks' envs the same set of seeded envs as ``ppo.py``'s."""
    from torchrl._utils import seed_generator

    for _ in range(index):
        seed = seed_generator(seed)
    return seed


def split(total: int, world: int, name: str) -> int:
    if total % world:
        raise SystemExit(f"--{name}={total} must be divisible by the number of processes ({world})")
    return total // world


def replicas_in_sync(params, group) -> bool:
    """True when every rank holds the same parameters (DDP keeps them equal; this checks it)."""
    flat = torch.cat([p.detach().reshape(-1) for p in params]).double()
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    dist.all_gather(gathered, flat, group=group)
    return all(torch.equal(gathered[0], g) for g in gathered[1:])


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.frames, args.num_envs, args.steps_per_env, args.epochs, args.minibatch = 512, 4, 64, 2, 128
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    rank, world, device = init_distributed(args.device)
    args.device = str(device)
    group = dist.group.WORLD
    try:
        return train(args, rank, world, device, group)
    finally:
        dist.destroy_process_group()


def train(args, rank: int, world: int, device: torch.device, group):
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers import SamplerWithoutReplacement
    from torchrl.envs import SerialEnv
    from torchrl.objectives import ClipPPOLoss

    num_envs = split(args.num_envs, world, "num-envs")
    minibatch = split(args.minibatch, world, "minibatch")
    local_fpb = num_envs * args.steps_per_env
    global_fpb = local_fpb * world
    if local_fpb % minibatch:
        raise SystemExit(f"each rank's batch ({local_fpb}) must be a multiple of its minibatch ({minibatch})")
    # Rank 0 draws what ppo.py draws with the same seed (DDP then copies rank 0's initial weights to all).
    common.seed_everything(args.seed + 10_000 * rank)
    GAE, _ = common.estimator_classes(args.estimator)

    env = SerialEnv(num_envs, common.make_env)
    env.set_seed(env_seed(args.seed, rank * num_envs))
    actor, critic = common.make_actor_critic(
        env.observation_spec["observation"].shape[-1], env.action_spec, args.hidden, device
    )
    budget = common.frame_budget(args.frames, global_fpb)  # the frames of all ranks together
    collector = Collector(
        env,
        actor,
        frames_per_batch=local_fpb,
        total_frames=budget // world,
        policy_device=device,
        env_device="cpu",
        storing_device=device,
        auto_register_policy_transforms=False,
    )
    advantage = GAE(gamma=args.gamma, lmbda=args.lmbda, value_network=critic, average_gae=False)
    loss_fn = ClipPPOLoss(
        actor,
        critic,
        clip_epsilon=args.clip_epsilon,
        entropy_bonus=args.entropy_coeff > 0,
        entropy_coeff=args.entropy_coeff,
        critic_coeff=args.critic_coeff,
        loss_critic_type="l2",
        normalize_advantage=False,  # done here, over all ranks
    )
    # DDP broadcasts rank 0's parameters at construction; the actor shares them, so the collectors of all
    # ranks act with the same policy. Buffers (constants of the loss) need no broadcasting.
    no_buffer_sync = (
        {"forward_sync_buffers": False}  # newer PyTorch; broadcast_buffers is deprecated there
        if "forward_sync_buffers" in inspect.signature(DDP.__init__).parameters
        else {"broadcast_buffers": False}
    )
    ddp_loss = DDP(loss_fn, **no_buffer_sync)
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(local_fpb, device=device),
        sampler=SamplerWithoutReplacement(),
        batch_size=minibatch,
    )
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr, eps=1e-5)
    n_updates = (budget // global_fpb) * args.epochs * (local_fpb // minibatch)

    curve = common.Curve(window=args.window)
    frames = updates = 0
    bar = common.progress_bar(budget, disable=args.no_progress or rank != 0, target=args.target_return)
    try:
        for batch in collector:  # batch: [num_envs, steps_per_env] of this rank
            frames += global_fpb
            done = batch.get(("next", "done")).reshape(-1)
            returns = batch.get(("next", "episode_reward")).reshape(-1)[done].tolist()
            per_rank = [None] * world
            dist.all_gather_object(per_rank, returns, group=group)
            now = curve.elapsed()
            for r in (r for rank_returns in per_rank for r in rank_returns):  # rank order = ppo.py's env order
                curve.add_episode(r, frames, now)
            bar.update(global_fpb)
            bar.set_postfix(mean_return=f"{curve.mean:.1f}", episodes=len(curve.returns))
            if curve.reached(args.target_return):  # the same curve on every rank: all stop together
                break

            for _ in range(args.epochs):
                with torch.no_grad():
                    advantage(batch)  # rl_triton's GAE on this rank's device, current critic
                if args.adv_norm == "batch":
                    batch.set("advantage", normalize_advantages(batch.get("advantage"), process_group=group))
                buffer.empty()
                buffer.extend(batch.reshape(-1))
                for mb in buffer:  # the same number of minibatches on every rank
                    if args.adv_norm != "batch":
                        pg = group if args.adv_norm == "minibatch" else None  # "rank": this shard's statistics
                        mb.set("advantage", normalize_advantages(mb.get("advantage"), process_group=pg))
                    # DDP averages the gradients over ranks in the backward pass
                    ppo.optimize(ddp_loss(mb), loss_fn.parameters(), optim, args, updates / n_updates)
                    updates += 1
            collector.update_policy_weights_()
    finally:
        common.close_bar(bar, frames, curve.reached(args.target_return))
        collector.shutdown()
    in_sync = replicas_in_sync(list(loss_fn.parameters()), group)
    if rank != 0:
        return None
    meta = {
        "algorithm": "PPO (DDP)",
        "hyper_parameters": {k: getattr(args, k) for k in (*ppo.HYPER_PARAMETERS, "adv_norm")},
        "updates": updates,
        "world_size": world,
        "backend": dist.get_backend(group),
        "replicas_in_sync": in_sync,
    }
    meta = common.finish(args, curve, frames, meta)
    print("DDP " + json.dumps({k: meta[k] for k in ("world_size", "backend", "replicas_in_sync", "updates")}))
    return meta


if __name__ == "__main__":
    main()
