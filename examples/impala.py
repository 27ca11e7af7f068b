"""IMPALA-style actor-learner training on gymnasium's CartPole-v1 with TorchRL, and rl_triton's
V-trace as the off-policy correction.

Actors run in separate processes (TorchRL's ``MultiAsyncCollector``, each worker stepping a
``SerialEnv`` of ``GymEnv`` instances with a copy of the policy) and hand the learner fixed-length
rollouts as soon as they are ready, with the log-probability of every action under the policy
that chose it (``action_log_prob``). Actors keep collecting while the learner trains, so their
policy lags behind the learner's by a few updates. The learner corrects for that lag with V-trace:
``rl_triton.modules.VTrace`` (a drop-in subclass of ``torchrl.objectives.value.VTrace``) computes
the value targets ``v_s`` and the policy-gradient advantages ``rho_s (r_s + gamma v_{s+1} - V(x_s))``
from the stored behaviour log-probs and the learner's current policy, and TorchRL's ``A2CLoss``
turns them into the actor, critic and entropy losses. After each update the new weights are sent
to the actors.

Usage::

    python examples/impala.py                                 # default settings, rl_triton's V-trace
    python examples/impala.py --estimator torchrl --seed 0 --log runs/impala_torchrl.csv
    python examples/impala.py --smoke                         # a few hundred frames (CI)

Training stops once the mean return of the last ``--window`` episodes reaches
``--target-return`` (default 195, CartPole's classic "solved" level) or after ``--frames``.
"""

from __future__ import annotations

import _common as common
import torch
from torch import nn

# Recorded in the --log file.
HYPER_PARAMETERS = (
    "workers",
    "envs_per_worker",
    "unroll",
    "rollouts_per_update",
    "lr",
    "gamma",
    "rho_thresh",
    "c_thresh",
    "entropy_coeff",
    "critic_coeff",
    "max_grad_norm",
    "hidden",
)


def build_parser():
    p = common.base_parser(__doc__.split("\n\n")[0])
    p.add_argument("--workers", type=int, default=2, help="actor processes")
    p.add_argument("--envs-per-worker", type=int, default=4)
    p.add_argument("--unroll", type=int, default=32, help="steps of each env per actor rollout")
    p.add_argument("--rollouts-per-update", type=int, default=2, help="actor rollouts in one learner batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--rho-thresh", type=float, default=1.0, help="V-trace's rho-bar")
    p.add_argument("--c-thresh", type=float, default=1.0, help="V-trace's c-bar")
    p.add_argument("--entropy-coeff", type=float, default=0.01)
    p.add_argument("--critic-coeff", type=float, default=0.5)
    p.add_argument("--max-grad-norm", type=float, default=0.5)
    p.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers (Tanh)")
    p.set_defaults(frames=1_000_000, target_return=195.0)
    return p


def make_actor_env(num_envs: int):
    """What each actor process steps; module-level so that ``spawn`` can pickle a reference to it."""
    from torchrl.envs import SerialEnv

    return SerialEnv(num_envs, common.make_env)


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.frames, args.envs_per_worker, args.unroll = 512, 2, 32
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    common.seed_everything(args.seed)
    device = torch.device(args.device)
    _, VTrace = common.estimator_classes(args.estimator)

    from tensordict import TensorDict
    from torchrl.collectors import MultiAsyncCollector
    from torchrl.objectives import A2CLoss

    probe = common.make_env()
    obs_dim, action_spec = probe.observation_spec["observation"].shape[-1], probe.action_spec
    probe.close()
    # The actors' copy of the policy lives on the CPU; the collector shares its weights with the
    # worker processes, and update_policy_weights_() copies the learner's weights into them.
    actor_cpu, _ = common.make_actor_critic(obs_dim, action_spec, args.hidden, "cpu")
    actor, critic = common.make_actor_critic(obs_dim, action_spec, args.hidden, device)
    actor.load_state_dict(actor_cpu.state_dict())
    frames_per_rollout = args.envs_per_worker * args.unroll
    collector = MultiAsyncCollector(
        [make_actor_env] * args.workers,
        actor_cpu,
        create_env_kwargs=[{"num_envs": args.envs_per_worker}] * args.workers,
        frames_per_batch=frames_per_rollout,
        total_frames=args.frames,
        device="cpu",
        storing_device="cpu",
        auto_register_policy_transforms=False,  # a feed-forward policy needs no InitTracker/primers
    )
    collector.set_seed(args.seed)

    vtrace = VTrace(
        gamma=args.gamma,
        actor_network=actor,
        value_network=critic,
        rho_thresh=args.rho_thresh,
        c_thresh=args.c_thresh,
        average_adv=False,
    )
    loss_fn = A2CLoss(
        actor,
        critic,
        entropy_bonus=args.entropy_coeff > 0,
        entropy_coeff=args.entropy_coeff,
        critic_coeff=args.critic_coeff,
        loss_critic_type="l2",
    )
    optim = torch.optim.Adam(loss_fn.parameters(), lr=args.lr, eps=1e-5)

    curve = common.Curve(window=args.window)
    frames = updates = 0
    pending = []
    bar = common.progress_bar(
        common.frame_budget(args.frames, frames_per_rollout), disable=args.no_progress, target=args.target_return
    )
    try:
        for rollout in collector:  # rollout: [envs_per_worker, unroll] from whichever actor finished first
            frames += rollout.numel()
            curve.add_batch(rollout, frames)
            bar.update(rollout.numel())
            bar.set_postfix(mean_return=f"{curve.mean:.1f}", episodes=len(curve.returns), updates=updates)
            if curve.reached(args.target_return):
                break
            pending.append(rollout.exclude("collector"))
            if len(pending) < args.rollouts_per_update:
                continue
            batch = torch.cat(pending, 0).to(device)  # [rollouts * envs, unroll], time last
            pending.clear()

            with torch.no_grad():
                vtrace(batch)  # "advantage" and "value_target" from log mu (stored) and log pi (current)
            losses = loss_fn(batch)
            loss = losses["loss_objective"] + losses["loss_critic"]
            if "loss_entropy" in losses.keys():
                loss = loss + losses["loss_entropy"]
            optim.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(loss_fn.parameters(), args.max_grad_norm)
            optim.step()
            updates += 1
            collector.update_policy_weights_(TensorDict.from_module(actor).data.to("cpu"))
    finally:
        common.close_bar(bar, frames, curve.reached(args.target_return))
        collector.shutdown()
    meta = {
        "algorithm": "IMPALA",
        "hyper_parameters": {k: getattr(args, k) for k in HYPER_PARAMETERS},
        "updates": updates,
    }
    return common.finish(args, curve, frames, meta)


if __name__ == "__main__":
    main()
