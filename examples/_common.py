"""Helpers shared by ``ppo.py`` and ``impala.py``: command-line flags, estimator selection, the
CartPole environment, episode bookkeeping, and the learning-curve log and plot.

Nothing here is specific to rl_triton except :func:`estimator_classes`, which picks the
``GAE``/``VTrace`` classes either from ``rl_triton.modules`` (drop-in subclasses of TorchRL's
estimators) or from TorchRL itself, so that one script trains with either.
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

ENV_NAME = "CartPole-v1"
ESTIMATORS = ("rl_triton", "torchrl")
_START = time.perf_counter()  # wall times count from here: set-up (envs, actor processes) included


# ----------------------------------------------------------------------------- flags


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def base_parser(description: str) -> argparse.ArgumentParser:
    """The flags both examples share. Algorithm-specific flags are added by the scripts."""
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument(
        "--estimator",
        choices=ESTIMATORS,
        default="rl_triton",
        help="advantage/value-target estimator: rl_triton.modules or TorchRL's own class",
    )
    p.add_argument("--device", default=default_device(), help="device of the learner (networks, losses, estimator)")
    p.add_argument("--frames", type=int, default=None, help="maximum number of environment frames")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--target-return",
        type=float,
        default=None,
        help="stop once the mean return of the last --window episodes reaches this (<= 0: never stop early)",
    )
    p.add_argument("--window", type=int, default=20, help="episodes in the running mean")
    p.add_argument("--plot", type=Path, default=None, help="write a PNG of episode return vs frames here")
    p.add_argument("--log", type=Path, default=None, help="write the learning curve here (.csv or .json)")
    p.add_argument("--smoke", action="store_true", help="a few hundred frames, to check that everything runs")
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for the learner (0: leave as is)")
    return p


# ----------------------------------------------------------------------------- set-up


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def estimator_classes(name: str):
    """Returns ``(GAE, VTrace)`` from ``rl_triton.modules`` (``name="rl_triton"``) or TorchRL."""
    if name == "rl_triton":
        from rl_triton.modules import GAE, VTrace
    elif name == "torchrl":
        from torchrl.objectives.value import GAE, VTrace
    else:
        raise ValueError(f"unknown estimator {name!r}; expected one of {ESTIMATORS}")
    return GAE, VTrace


def make_env():
    """One ``CartPole-v1`` (gymnasium) with a running episode return (``episode_reward``).

    Module-level (not a lambda) so that worker processes started with ``spawn`` can unpickle it.
    ``CartPole-v1``'s own 500-step time limit is reported as ``truncated``, so the estimators
    bootstrap from the value of the last state there instead of treating it as terminal.
    """
    from torchrl.envs import GymEnv, RewardSum, StepCounter, TransformedEnv
    from torchrl.envs.transforms import Compose

    return TransformedEnv(GymEnv(ENV_NAME), Compose(StepCounter(), RewardSum()))


def make_actor_critic(obs_dim: int, action_spec, hidden: int, device):
    """A categorical ``ProbabilisticActor`` and a ``ValueOperator``, each an MLP with two Tanh layers of
    ``hidden`` units. The actor writes ``action`` (one-hot) and ``action_log_prob``: the behaviour
    log-probability that ``ClipPPOLoss`` and ``VTrace`` read."""
    from tensordict.nn import TensorDictModule
    from torchrl.modules import MLP, OneHotCategorical, ProbabilisticActor, ValueOperator

    def mlp(out):
        return MLP(in_features=obs_dim, out_features=out, num_cells=[hidden, hidden], activation_class=nn.Tanh)

    policy_net = mlp(action_spec.shape[-1])
    value_net = mlp(1)
    # Orthogonal init with a small last layer: the usual PPO recipe, it makes early updates calmer.
    for net, last_gain in ((policy_net, 0.01), (value_net, 1.0)):
        layers = [m for m in net.modules() if isinstance(m, nn.Linear)]
        for i, layer in enumerate(layers):
            nn.init.orthogonal_(layer.weight, gain=last_gain if i == len(layers) - 1 else 2**0.5)
            nn.init.zeros_(layer.bias)
    actor = ProbabilisticActor(
        TensorDictModule(policy_net, in_keys=["observation"], out_keys=["logits"]),
        in_keys=["logits"],
        spec=action_spec,
        distribution_class=OneHotCategorical,
        return_log_prob=True,
    ).to(device)
    critic = ValueOperator(value_net, in_keys=["observation"]).to(device)
    return actor, critic


# ----------------------------------------------------------------------------- bookkeeping


@dataclass
class Curve:
    """Finished episodes in the order the learner saw them, and the running mean over ``window``."""

    window: int = 20
    frames: list[int] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    means: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    start: float = _START

    def __post_init__(self):
        self._recent = collections.deque(maxlen=self.window)

    def add_batch(self, batch, frames_so_far: int) -> int:
        """Records the episodes that end in ``batch`` (a collector batch); returns how many."""
        done = batch.get(("next", "done")).reshape(-1)
        if not bool(done.any()):
            return 0
        ep_returns = batch.get(("next", "episode_reward")).reshape(-1)[done]
        now = time.perf_counter() - self.start
        for r in ep_returns.tolist():
            self.add_episode(r, frames_so_far, now)
        return int(done.sum())

    def add_episode(self, episode_return: float, frames_so_far: int, seconds: float) -> None:
        self._recent.append(episode_return)
        self.frames.append(frames_so_far)
        self.returns.append(episode_return)
        self.means.append(self.mean)
        self.seconds.append(seconds)

    @property
    def mean(self) -> float:
        return sum(self._recent) / len(self._recent) if self._recent else math.nan

    @property
    def full(self) -> bool:
        return len(self._recent) == self.window

    def reached(self, target: float | None) -> bool:
        return target is not None and target > 0 and self.full and self.mean >= target

    def elapsed(self) -> float:
        return time.perf_counter() - self.start


def frame_budget(frames: int, frames_per_batch: int) -> int:
    """The frames a collector runs for ``total_frames=frames``: TorchRL rounds it up to whole batches."""
    return -(-frames // frames_per_batch) * frames_per_batch


def progress_bar(total: int, disable: bool, target: float | None = None):
    """A tqdm bar over ``total`` frames (the collector's :func:`frame_budget`); with a target return it
    says that training may stop before that (see :func:`close_bar`)."""
    from tqdm import tqdm

    desc = f"frames (stops early at mean return {target:g})" if target is not None and target > 0 else "frames"
    return tqdm(total=total, desc=desc, unit="frames", disable=disable, dynamic_ncols=True, smoothing=0.1)


def close_bar(bar, frames: int, stopped_early: bool) -> None:
    """Closes the bar; a run that stopped early (target reached) ends at 100% of the frames it ran, not at a
    fraction of the budget."""
    if stopped_early and not bar.disable and frames != bar.total:
        bar.total = frames
        bar.n = frames
        bar.refresh()
    bar.close()


def save_log(path: Path, curve: Curve, meta: dict) -> None:
    """Writes the learning curve: CSV (one row per finished episode, ``meta`` in ``#`` comment
    lines at the top) if ``path`` ends in ``.csv``, otherwise JSON (``meta`` plus the columns)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = zip(curve.frames, curve.returns, curve.means, curve.seconds, strict=True)
    if path.suffix.lower() == ".csv":
        with open(path, "w", newline="") as f:
            for k, v in meta.items():
                f.write(f"# {k}: {json.dumps(v)}\n")
            w = csv.writer(f)
            w.writerow(["frames", "episode_return", "running_mean", "seconds"])
            for fr, r, m, s in rows:
                w.writerow([fr, f"{r:.6g}", f"{m:.6g}", f"{s:.3f}"])
    else:
        data = {
            **meta,
            "frames": curve.frames,
            "episode_return": curve.returns,
            "running_mean": curve.means,
            "seconds": [round(s, 3) for s in curve.seconds],
        }
        path.write_text(json.dumps(data, indent=1) + "\n")


def load_log(path: Path) -> dict:
    """Reads a file written by :func:`save_log` back into ``{meta..., column: list}``."""
    path = Path(path)
    if path.suffix.lower() != ".csv":
        return json.loads(path.read_text())
    data: dict = {}
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    body = []
    for line in lines:
        if line.startswith("# ") and ": " in line:
            k, v = line[2:].split(": ", 1)
            data[k] = json.loads(v)
        else:
            body.append(line)
    reader = csv.DictReader(body)
    cols: dict[str, list] = {name: [] for name in reader.fieldnames or []}
    for row in reader:
        for k, v in row.items():
            cols[k].append(int(v) if k == "frames" else float(v))
    data.update(cols)
    return data


def plot_curves(runs: list[tuple[str, dict]], path: Path, title: str, target: float | None = None) -> None:
    """One PNG with, for each ``(label, log)``: the episode returns (faint) and their running mean."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, (label, log) in enumerate(runs):
        c = colors[i % len(colors)]
        ax.plot(log["frames"], log["episode_return"], ".", color=c, alpha=0.35, markersize=3)
        ax.plot(log["frames"], log["running_mean"], "-", color=c, linewidth=1.8, label=label)
    if target is not None and target > 0:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("environment frames")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def run_label(meta: dict) -> str:
    s = f"{meta.get('algorithm', '?')} / {meta.get('estimator', '?')} estimator"
    if "final_mean_return" in meta and "wall_seconds" in meta:
        s += f" (seed {meta.get('seed')}: {meta['final_mean_return']:.0f} in {meta['wall_seconds']:.0f} s)"
    return s


def finish(args, curve: Curve, frames: int, meta: dict) -> dict:
    """Prints the summary line the tests parse, and writes the log / plot if asked to."""
    wall = curve.elapsed()
    meta = {
        **meta,
        "env": ENV_NAME,
        "estimator": args.estimator,
        "seed": args.seed,
        "device": str(args.device),
        "frames": frames,
        "episodes": len(curve.returns),
        "final_mean_return": None if math.isnan(curve.mean) else round(curve.mean, 3),
        "window": curve.window,
        "target_return": args.target_return,
        "reached_target": curve.reached(args.target_return),
        "wall_seconds": round(wall, 2),
        "torch_threads": torch.get_num_threads(),
        "triton_interpret": os.environ.get("TRITON_INTERPRET", "0"),
    }
    if args.log is not None:
        save_log(args.log, curve, meta)
    if args.plot is not None:
        plot_curves(
            [(run_label(meta), {**meta, **_columns(curve)})],
            args.plot,
            f"{meta['algorithm']} on {ENV_NAME}",
            args.target_return,
        )
    status = "reached" if meta["reached_target"] else "did not reach"
    print(
        f"{meta['algorithm']} {ENV_NAME} estimator={args.estimator}: {status} target {args.target_return}; "
        f"episodes={meta['episodes']} frames={frames}"
    )
    # One machine-readable line; tests/examples/test_examples.py parses it.
    print(
        "RESULT "
        + json.dumps(
            {k: meta[k] for k in ("final_mean_return", "wall_seconds", "frames", "episodes", "reached_target")}
        )
    )
    mean = meta["final_mean_return"]
    print(
        f"final mean return (last {curve.window} episodes): {mean if mean is not None else 'n/a'}  "
        f"wall time: {wall:.1f} s"
    )
    return meta


def _columns(curve: Curve) -> dict:
    return {"frames": curve.frames, "episode_return": curve.returns, "running_mean": curve.means}


# ----------------------------------------------------------------------------- shared by the LLM example

RESULT_KEYS = ("final_mean_return", "wall_seconds", "frames", "episodes", "reached_target")


def result_line(meta: dict) -> str:
    """The machine-readable ``RESULT {...}`` line of :func:`finish`, for scripts that build ``meta`` themselves
    (``llm_ppo.py``: frames are policy tokens, episodes are responses)."""
    return "RESULT " + json.dumps({k: meta[k] for k in RESULT_KEYS})
