"""Token-level RL on a tiny causal transformer: PPO with a value head, or GRPO / RLOO / REINFORCE++, with the
advantages from ``rl_triton.llm``.

The task is synthetic and checkable: a prompt is a string of 2-5 random digits, left-padded as LLM batches are,
and the model must answer with the digits reversed followed by an end token (``EOS``). Responses therefore have
different lengths, and everything after the end token is padding that the response mask drops. With
``--tool-every K`` (default 2, for every estimator) the environment writes a ``TOOL`` token into the
response after every K answer tokens, as a tool call's output would appear: the policy does not choose it, so it
is a masked position *inside* the response. The reward is an outcome reward on the last policy token: the number
of answer digits in the right place divided by the longer of the answer and the target (1.0 only for the exact
answer).

The transformer (token and position embeddings, pre-norm causal self-attention blocks, a policy head over the
10 digits and ``EOS``, and a scalar value head on the same trunk) is plain ``torch.nn`` and starts from random
weights: there is nothing to download. Each iteration samples ``--prompts`` prompts, ``--samples`` responses
each, scores them, computes the advantages with the chosen estimator and takes ``--epochs`` passes of clipped
PPO updates over minibatches (the token-mean of the clipped surrogate, plus for PPO the clipped value loss):

* ``ppo``: ``rl_triton.llm.compute_gae_advantage_return`` over the response tokens with the value head's
  estimates (masked tokens carry the next value and the running advantage across);
* ``grpo``: ``rl_triton.llm.compute_grpo_outcome_advantage`` with the prompt ids as the group index;
* ``rloo``: ``rl_triton.llm.compute_rloo_outcome_advantage`` (leave-one-out baseline, same index);
* ``reinforce++``: ``rl_triton.llm.compute_reinforce_plus_plus_outcome_advantage`` (whitened returns; the
  running return passes across the masked tool tokens, so the outcome reward reaches every answer token).

Usage::

    python examples/llm_ppo.py                         # PPO with GAE, cuda if available else cpu
    python examples/llm_ppo.py --estimator grpo        # GRPO (group-normalised outcome advantages)
    python examples/llm_ppo.py --device cpu --out runs/llm --log runs/llm/ppo.csv
    python examples/llm_ppo.py --smoke                 # a few iterations (CI)

Training stops once the mean reward of the last ``--window`` responses reaches ``--target-reward`` (default
0.95) or after ``--iters`` iterations.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import _common as common
import torch
import torch.nn.functional as F
from torch import nn

from rl_triton import llm

ESTIMATORS = ("ppo", "grpo", "rloo", "reinforce++")
TASK = "reverse-digits"

# Token ids. The policy chooses among the first N_ACTIONS (the digits and EOS); PAD, SEP and TOOL are only ever
# written by the environment.
EOS, PAD, SEP, TOOL = 10, 11, 12, 13
N_ACTIONS, VOCAB = 11, 14

# Recorded in the --log file.
HYPER_PARAMETERS = (
    "prompts",
    "samples",
    "min_digits",
    "max_digits",
    "tool_every",
    "epochs",
    "minibatch",
    "lr",
    "gamma",
    "lam",
    "clip_ratio",
    "clip_value",
    "vf_coef",
    "entropy_coeff",
    "max_grad_norm",
    "d_model",
    "layers",
    "heads",
)


def build_parser():
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument(
        "--estimator",
        choices=ESTIMATORS,
        default="ppo",
        help="advantage estimator from rl_triton.llm: ppo (GAE with the value head), grpo, rloo or reinforce++",
    )
    p.add_argument("--device", default=common.default_device(), help="device of the model, rollouts and estimator")
    p.add_argument("--iters", type=int, default=600, help="maximum number of iterations (rollout + update)")
    p.add_argument("--seed", type=int, default=0, help="seeds Python, NumPy, torch and the prompt stream")
    p.add_argument(
        "--target-reward",
        type=float,
        default=0.95,
        help="stop once the mean reward of the last --window responses reaches this (<= 0: never stop early)",
    )
    p.add_argument("--window", type=int, default=512, help="responses in the running mean")
    # Task.
    p.add_argument("--min-digits", type=int, default=2, help="shortest prompt")
    p.add_argument("--max-digits", type=int, default=5, help="longest prompt")
    p.add_argument(
        "--tool-every",
        type=int,
        default=2,
        help="the environment inserts a masked TOOL token after every K answer tokens (0: never)",
    )
    # Batch and optimisation.
    p.add_argument("--prompts", type=int, default=64, help="prompts per iteration")
    p.add_argument("--samples", type=int, default=4, help="responses sampled per prompt (the group of GRPO/RLOO)")
    p.add_argument("--epochs", type=int, default=2, help="passes over each batch of responses")
    p.add_argument("--minibatch", type=int, default=64, help="responses per gradient step")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (constant)")
    p.add_argument("--gamma", type=float, default=1.0, help="discount over response tokens (GAE, REINFORCE++)")
    p.add_argument("--lam", type=float, default=0.95, help="GAE lambda")
    p.add_argument("--clip-ratio", type=float, default=0.2, help="PPO clip range of the probability ratio")
    p.add_argument("--clip-value", type=float, default=0.5, help="clip range of the value prediction (PPO)")
    p.add_argument("--vf-coef", type=float, default=0.5, help="weight of the value loss (PPO)")
    p.add_argument("--entropy-coeff", type=float, default=0.0, help="weight of the token-mean entropy bonus")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient norm clipping")
    # Model.
    p.add_argument("--d-model", type=int, default=64, help="width of the transformer")
    p.add_argument("--layers", type=int, default=2, help="transformer blocks")
    p.add_argument("--heads", type=int, default=4, help="attention heads per block")
    # Output.
    p.add_argument("--out", type=Path, default=Path("runs/llm_ppo"), help="folder of the default plot")
    p.add_argument(
        "--plot",
        default=None,
        help="PNG of the learning curve (default: OUT/<estimator>_seed<seed>.png; 'none': no plot)",
    )
    p.add_argument("--log", type=Path, default=None, help="write the per-response curve here (.csv or .json)")
    p.add_argument(
        "--smoke", action="store_true", help="3 iterations of 8 prompts x 4 samples, to check that everything runs (CI)"
    )
    p.add_argument("--no-progress", action="store_true", help="no tqdm progress bar")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (0: leave PyTorch's default)")
    return p


# ----------------------------------------------------------------------------- model


class Block(nn.Module):
    """Pre-norm causal self-attention and MLP."""

    def __init__(self, d_model: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        B, S, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, S, D))
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """A causal transformer with a policy head (logits over the digits and EOS) and a value head."""

    def __init__(self, context: int, d_model: int, layers: int, heads: int):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.policy = nn.Linear(d_model, N_ACTIONS)
        self.value = nn.Linear(d_model, 1)
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)

    def forward(self, tokens):
        """``tokens`` (B, S) -> logits (B, S, N_ACTIONS), values (B, S): both predict from position s the token
        at s + 1."""
        x = self.tok(tokens) + self.pos.weight[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        x = self.ln(x)
        return self.policy(x), self.value(x).squeeze(-1)


# ----------------------------------------------------------------------------- task


class Task:
    """Reverse a string of digits. Prompts are ``PAD.. d_1 .. d_L SEP`` (left-padded to one length); the answer
    is ``d_L .. d_1 EOS``. A response has a fixed layout of columns: ``answer_slots`` policy tokens (one more than
    the longest answer, so that a model that never stops is cut off and scored as too long), with a TOOL column
    after every ``tool_every`` of them."""

    def __init__(self, min_digits: int, max_digits: int, tool_every: int):
        if not 1 <= min_digits <= max_digits:
            raise ValueError("need 1 <= --min-digits <= --max-digits")
        self.min_digits, self.max_digits = min_digits, max_digits
        self.prompt_len = max_digits + 1
        self.answer_slots = max_digits + 1
        tool_cols = []
        for j in range(self.answer_slots):
            if tool_every > 0 and j > 0 and j % tool_every == 0:
                tool_cols.append(True)
            tool_cols.append(False)
        self.tool_col = torch.tensor(tool_cols)  # (R,) True where the environment writes TOOL
        self.response_len = len(tool_cols)

    def prompts(self, n: int, gen: torch.Generator):
        """``n`` prompts (n, prompt_len) and their digit counts (n,)."""
        lengths = torch.randint(self.min_digits, self.max_digits + 1, (n,), generator=gen)
        digits = torch.randint(0, 10, (n, self.max_digits), generator=gen)
        # Right-align the digits: column c holds a digit when c >= max_digits - L.
        cols = torch.arange(self.max_digits)
        digits = torch.where(cols >= self.max_digits - lengths[:, None], digits, PAD)
        return torch.cat([digits, torch.full((n, 1), SEP)], 1), lengths

    def score(self, prompts, lengths, response):
        """Outcome reward of each response (B, R), whether it is exact, and its answer length (EOS not counted)."""
        answer = response[:, ~self.tool_col.to(response.device)]  # (B, answer_slots): the policy's tokens in order
        is_eos = answer == EOS
        has_eos = is_eos.any(1)
        n = torch.where(has_eos, is_eos.int().argmax(1), self.answer_slots)  # digits before EOS (or all)
        # The target right-aligned in prompt order, read backwards: target_j = prompt[max_digits - 1 - j].
        target = prompts[:, : self.max_digits].flip(1)  # (B, max_digits); PAD beyond each length
        j = torch.arange(self.max_digits, device=response.device)
        hits = (answer[:, : self.max_digits] == target) & (j < n[:, None]) & (j < lengths[:, None])
        matches = hits.sum(1)
        reward = matches.float() / torch.maximum(n, lengths).float()
        exact = has_eos & (n == lengths) & (matches == lengths)
        return reward, exact, n


@torch.no_grad()
def rollout(model, task: Task, prompts):
    """Samples one response per prompt row. Returns the full sequences (B, P + R), the response tokens (B, R),
    and the response mask (B, R): 1 at the policy's tokens, 0 at TOOL tokens and at the padding after EOS."""
    B, R = prompts.shape[0], task.response_len
    device = prompts.device
    tool_col = task.tool_col.tolist()
    seq = prompts
    done = torch.zeros(B, dtype=torch.bool, device=device)
    mask = torch.zeros(B, R, dtype=torch.bool, device=device)
    for c in range(R):
        if tool_col[c]:
            tok = torch.where(done, PAD, TOOL)
        else:
            logits, _ = model(seq)
            sampled = torch.multinomial(torch.softmax(logits[:, -1].float(), -1), 1).squeeze(1)
            tok = torch.where(done, PAD, sampled)
            mask[:, c] = ~done
            done = done | (sampled == EOS)
        seq = torch.cat([seq, tok[:, None]], 1)
    return seq, seq[:, prompts.shape[1] :], mask


def outcome_rewards(reward, mask):
    """Token-level rewards (B, R): each response's reward on its last policy token, zero elsewhere."""
    cols = torch.arange(mask.shape[1], device=mask.device)
    last = torch.where(mask, cols, -1).argmax(1)
    return torch.zeros(mask.shape, device=mask.device).scatter_(1, last[:, None], reward[:, None].float())


def response_outputs(model, seq, prompt_len: int, response):
    """Log-probabilities of the response tokens, the values and the entropies at the response columns, all
    (B, R). Column c of the response is predicted from sequence position prompt_len - 1 + c."""
    logits, values = model(seq[:, :-1])
    logits, values = logits[:, prompt_len - 1 :].float(), values[:, prompt_len - 1 :].float()
    logp_all = torch.log_softmax(logits, -1)
    actions = torch.where(response < N_ACTIONS, response, 0)  # TOOL/PAD columns are masked: any index will do
    logp = logp_all.gather(-1, actions[..., None]).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, values, entropy


def advantages(args, rewards, values, mask, index):
    """(advantages, returns) from rl_triton.llm; returns are the value targets (PPO only)."""
    if args.estimator == "ppo":
        return llm.compute_gae_advantage_return(rewards, values, mask, args.gamma, args.lam)
    if args.estimator == "grpo":
        return llm.compute_grpo_outcome_advantage(rewards, mask, index)
    if args.estimator == "rloo":
        return llm.compute_rloo_outcome_advantage(rewards, mask, index)
    return llm.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, gamma=args.gamma)


def masked_mean(x, m):
    return (x * m).sum() / m.sum().clamp_min(1)


# ----------------------------------------------------------------------------- training


def main(argv=None):
    args = build_parser().parse_args(argv)
    if args.smoke:
        args.iters, args.prompts, args.samples, args.minibatch, args.epochs = 3, 8, 4, 16, 1
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    common.seed_everything(args.seed)
    device = torch.device(args.device)
    data_gen = torch.Generator().manual_seed(args.seed)  # prompts: the same sequence on every device

    task = Task(args.min_digits, args.max_digits, args.tool_every)
    model = TinyLM(task.prompt_len + task.response_len, args.d_model, args.layers, args.heads).to(device)
    optim = torch.optim.Adam(model.parameters(), lr=args.lr)
    use_values = args.estimator == "ppo"
    B = args.prompts * args.samples

    curve = common.Curve(window=args.window)
    history = {k: [] for k in ("iteration", "reward", "exact", "length", "target_length", "running_mean", "seconds")}
    tokens = updates = iteration = 0
    reached = False
    bar = progress_bar(args.iters, args.no_progress, args.target_reward)
    try:
        for iteration in range(1, args.iters + 1):
            # ---- rollout: `samples` responses for each prompt, scored by the task
            prompts, lengths = task.prompts(args.prompts, data_gen)
            index = torch.arange(args.prompts).repeat_interleave(args.samples) + iteration * args.prompts
            prompts = prompts.repeat_interleave(args.samples, 0).to(device)
            lengths = lengths.repeat_interleave(args.samples).to(device)
            model.eval()
            seq, response, mask = rollout(model, task, prompts)
            reward, exact, n = task.score(prompts, lengths, response)
            fmask = mask.float()
            token_rewards = outcome_rewards(reward, mask)
            with torch.no_grad():
                old_logp, old_values, _ = response_outputs(model, seq, task.prompt_len, response)
                adv, returns = advantages(args, token_rewards, old_values, mask, index.to(device))

            # ---- bookkeeping
            tokens += int(mask.sum())
            now = curve.elapsed()
            for r in reward.tolist():
                curve.add_episode(r, tokens, now)
            for k, v in (
                ("iteration", iteration),
                ("reward", float(reward.mean())),
                ("exact", float(exact.float().mean())),
                ("length", float(n.float().mean())),
                ("target_length", float(lengths.float().mean())),
                ("running_mean", curve.mean),
                ("seconds", now),
            ):
                history[k].append(v)
            bar.update(1)
            bar.set_postfix(reward=f"{curve.mean:.3f}", exact=f"{history['exact'][-1]:.2f}")
            reached = curve.reached(args.target_reward)
            if reached or iteration == args.iters:
                break  # no update that no rollout would see

            # ---- PPO updates: clipped surrogate (token-mean), clipped value loss for PPO
            model.train()
            for _ in range(args.epochs):
                for ids in torch.randperm(B, device=device).split(args.minibatch):
                    m = fmask[ids]
                    logp, values, entropy = response_outputs(model, seq[ids], task.prompt_len, response[ids])
                    ratio = torch.exp(logp - old_logp[ids])
                    a = adv[ids]
                    surrogate = torch.maximum(-a * ratio, -a * ratio.clamp(1 - args.clip_ratio, 1 + args.clip_ratio))
                    loss = masked_mean(surrogate, m) - args.entropy_coeff * masked_mean(entropy, m)
                    if use_values:
                        v_old, target = old_values[ids], returns[ids]
                        v_clip = v_old + (values - v_old).clamp(-args.clip_value, args.clip_value)
                        v_loss = 0.5 * masked_mean(torch.maximum((values - target) ** 2, (v_clip - target) ** 2), m)
                        loss = loss + args.vf_coef * v_loss
                    optim.zero_grad(set_to_none=True)
                    loss.backward()
                    nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                    optim.step()
                    updates += 1
    finally:
        common.close_bar(bar, iteration, reached)

    meta = {
        "algorithm": {"ppo": "PPO", "grpo": "GRPO", "rloo": "RLOO", "reinforce++": "REINFORCE++"}[args.estimator],
        "task": TASK,
        "estimator": args.estimator,
        "seed": args.seed,
        "device": str(device),
        "hyper_parameters": {k: getattr(args, k) for k in HYPER_PARAMETERS},
        "iterations": iteration,
        "updates": updates,
        "final_exact": round(sum(history["exact"][-2:]) / max(1, len(history["exact"][-2:])), 3),
    }
    final = None if math.isnan(curve.mean) else round(curve.mean, 3)
    meta.update(
        frames=tokens,
        episodes=len(curve.returns),
        final_mean_return=final,
        window=curve.window,
        target_reward=args.target_reward,
        reached_target=reached,
        wall_seconds=round(curve.elapsed(), 2),
        torch_threads=torch.get_num_threads(),
        triton_interpret=os.environ.get("TRITON_INTERPRET", "0"),
    )
    if args.log is not None:
        common.save_log(args.log, curve, meta)
    plot = args.plot if args.plot is not None else args.out / f"{args.estimator}_seed{args.seed}.png"
    if str(plot).lower() != "none":
        plot_history(history, Path(plot), meta, args.target_reward)
    status = "reached" if reached else "did not reach"
    print(
        f"{meta['algorithm']} {TASK} estimator={args.estimator}: {status} target {args.target_reward}; "
        f"iterations={iteration} responses={meta['episodes']} policy tokens={tokens}"
    )
    print(common.result_line(meta))  # frames: policy tokens sampled; episodes: responses
    print(
        f"final mean reward (last {curve.window} responses): {final if final is not None else 'n/a'}  "
        f"exact answers: {meta['final_exact']}  wall time: {meta['wall_seconds']:.1f} s"
    )
    return meta


def progress_bar(total: int, disable: bool, target: float):
    from tqdm import tqdm

    desc = f"iterations (stops early at mean reward {target:g})" if target > 0 else "iterations"
    return tqdm(total=total, desc=desc, unit="it", disable=disable, dynamic_ncols=True, smoothing=0.1)


def plot_history(history: dict, path: Path, meta: dict, target: float) -> None:
    """Mean reward per iteration (with the running mean over the last responses) and the exact-answer rate
    on the left; the mean answer and target lengths on the right."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_len) = plt.subplots(1, 2, figsize=(11, 4), dpi=120, gridspec_kw={"width_ratios": [2, 1]})
    it = history["iteration"]
    ax.plot(it, history["reward"], ".", alpha=0.35, markersize=3, label="mean reward of the batch")
    ax.plot(it, history["running_mean"], "-", linewidth=1.8, label=f"running mean ({meta['window']} responses)")
    ax.plot(it, history["exact"], "-", linewidth=1, alpha=0.8, label="exact answers")
    if target > 0:
        ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("iteration")
    ax.set_ylabel("reward")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"{meta['algorithm']} on {TASK} ({meta['wall_seconds']:.0f} s on {meta['device']})")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax_len.plot(it, history["length"], "-", linewidth=1.2, label="answers")
    ax_len.plot(it, history["target_length"], "-", color="grey", linewidth=1, alpha=0.7, label="targets")
    ax_len.legend(loc="upper right", fontsize=8)
    ax_len.set_xlabel("iteration")
    ax_len.set_ylabel("mean answer length (digits)")
    ax_len.grid(alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
