"""PPO on gymnasium's CartPole-v1 with TorchRL, and rl_triton's GAE as the advantage estimator.

The pieces are TorchRL's public API: a ``Collector`` stepping a ``SerialEnv`` of ``GymEnv``
instances (with ``StepCounter``/``RewardSum``), a ``ProbabilisticActor``/``ValueOperator`` pair,
``ClipPPOLoss``, and a replay buffer that deals minibatches without replacement. The only
rl_triton piece is the estimator: ``rl_triton.modules.GAE`` is a drop-in subclass of
``torchrl.objectives.value.GAE`` (same constructor arguments), so ``--estimator torchrl`` runs the
very same script with TorchRL's class. Advantages and value targets are recomputed from the
current critic at the start of every epoch.

Usage::

    python examples/ppo.py                                   # default settings, rl_triton's GAE
    python examples/ppo.py --estimator torchrl --seed 0 --log runs/ppo_torchrl.csv
    python examples/ppo.py --plot ppo.png --log ppo.json     # learning curve as PNG and JSON
    python examples/ppo.py --smoke                           # a few hundred frames (CI)

Training stops once the mean return of the last ``--window`` episodes reaches
``--target-return`` (default 450; CartPole-v1 caps episodes at 500) or after ``--frames``.
"""

from __future__ import annotations

import argparse

import _common as common
import torch
from torch import nn

# Recorded in the --log file.
HYPER_PARAMETERS = (
    "num_envs",
    "steps_per_env",
    "epochs",
    "minibatch",
    "lr",
    "anneal_lr",
    "gamma",
    "lmbda",
    "clip_epsilon",
    "entropy_coeff",
    "critic_coeff",
    "max_grad_norm",
    "hidden",
)


def build_parser():
    p = common.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--steps-per-env", type=int, default=128, help="steps of each env per collected batch")
    p.add_argument("--epochs", type=int, default=10, help="passes over each batch")
    p.add_argument("--minibatch", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument(
        "--anneal-lr", action=argparse.BooleanOptionalAction, default=True, help="decay lr linearly to 0 over --frames"
    )
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--lmbda", type=float, default=0.95)
    p.add_argument("--clip-epsilon", type=float, default=0.2)
    p.add_argument("--entropy-coeff", type=float, default=0.0)
    p.add_argument("--critic-coeff", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers (Tanh)")
    p.set_defaults(frames=500_000, target_return=450.0)
    return p


def optimize(losses, params, optim, args, progress: float) -> None:
    """One gradient step on the PPO losses: clipped gradient norm, the learning rate annealed linearly over
    training when asked (``progress``: the fraction of updates done)."""
    loss = losses["loss_objective"] + losses["loss_critic"]
    if "loss_entropy" in losses.keys():
        loss = loss + losses["loss_entropy"]
    optim.zero_grad(set_to_none=True)
    loss.backward()
    nn.utils.clip_grad_norm_(params, args.max_grad_norm)
    if args.anneal_lr:
        for g in optim.param_groups:
            g["lr"] = args.lr * max(0.0, 1.0 - progress)
    optim.step()


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.frames, args.num_envs, args.steps_per_env, args.epochs, args.minibatch = 512, 4, 64, 2, 128
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    common.seed_everything(args.seed)
    device = torch.device(args.device)
    GAE, _ = common.estimator_classes(args.estimator)

    from torchrl.collectors import Collector
    from torchrl.data import LazyTensorStorage, ReplayBuffer
    from torchrl.data.replay_buffers import SamplerWithoutReplacement
    from torchrl.envs import SerialEnv
    from torchrl.objectives import ClipPPOLoss

    env = SerialEnv(args.num_envs, common.make_env)
    env.set_seed(args.seed)
    actor, critic = common.make_actor_critic(
        env.observation_spec["observation"].shape[-1], env.action_spec, args.hidden, device
    )

    frames_per_batch = args.num_envs * args.steps_per_env
    collector = Collector(
        env,
        actor,
        frames_per_batch=frames_per_batch,
        total_frames=args.frames,
        policy_device=device,
        env_device="cpu",
        storing_device=device,
        auto_register_policy_transforms=False,  # a feed-forward policy needs no InitTracker/primers
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
        normalize_advantage=True,
    )
    buffer = ReplayBuffer(
        storage=LazyTensorStorage(frames_per_batch, device=device),
        sampler=SamplerWithoutReplacement(),
        batch_size=args.minibatch,
    )
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr, eps=1e-5)
    n_updates = -(-args.frames // frames_per_batch) * args.epochs * (frames_per_batch // args.minibatch)

    curve = common.Curve(window=args.window)
    frames = updates = 0
    bar = common.progress_bar(
        common.frame_budget(args.frames, frames_per_batch), disable=args.no_progress, target=args.target_return
    )
    try:
        for batch in collector:  # batch: [num_envs, steps_per_env], time last
            frames += batch.numel()
            curve.add_batch(batch, frames)
            bar.update(batch.numel())
            bar.set_postfix(mean_return=f"{curve.mean:.1f}", episodes=len(curve.returns))
            if curve.reached(args.target_return):
                break

            for _ in range(args.epochs):
                with torch.no_grad():
                    advantage(batch)  # writes "advantage" and "value_target" with the current critic
                buffer.empty()
                buffer.extend(batch.reshape(-1))
                for minibatch in buffer:  # each transition once per epoch
                    optimize(loss_fn(minibatch), loss_fn.parameters(), optim, args, updates / n_updates)
                    updates += 1
            collector.update_policy_weights_()
    finally:
        common.close_bar(bar, frames, curve.reached(args.target_return))
        collector.shutdown()
    meta = {
        "algorithm": "PPO",
        "hyper_parameters": {k: getattr(args, k) for k in HYPER_PARAMETERS},
        "updates": updates,
    }
    return common.finish(args, curve, frames, meta)


if __name__ == "__main__":
    main()
