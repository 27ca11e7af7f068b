"""examples/llm_ppo.py: the task's scoring and the rollout's masks against plain-Python definitions, smoke runs of
the training loop with each estimator, and (opt-in) the documented learning results.

The smoke runs call the script's ``main`` in this process (no interpreter start-up per run); under
``TRITON_INTERPRET=1``, as tests/conftest.py sets it on machines without a GPU, rl_triton.llm's Triton kernels
run through the interpreter. The slow tests run the default settings as a user would, in a subprocess, and are
skipped unless ``RL_TRITON_SLOW=1`` is set or ``-m slow`` is passed.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("tqdm", reason="the example needs tqdm")
pytest.importorskip("matplotlib", reason="the example's plot needs matplotlib")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SLOW_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def ex():
    """examples/llm_ppo.py as a module, imported the way it runs (its folder on sys.path, for _common)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        return importlib.import_module("llm_ppo")
    finally:
        sys.path.remove(str(EXAMPLES))


def parse_result(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line in the output:\n{out[-4000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


# ----------------------------------------------------------------------------- task and rollout


def reference_score(prompt_digits: list[int], answer_tokens: list[int], eos: int):
    """The reward as the docstring defines it, one response at a time: the answer is the policy's tokens up to
    the first EOS (all of them if there is none); reward = digits in the right place / max(answer, target)."""
    target = prompt_digits[::-1]
    answer = answer_tokens[: answer_tokens.index(eos)] if eos in answer_tokens else answer_tokens
    matches = sum(a == t for a, t in zip(answer, target, strict=False))
    exact = eos in answer_tokens and answer == target
    return matches / max(len(answer), len(target)), exact, len(answer)


def test_task_layout_and_golden_scores(ex):
    task = ex.Task(2, 5, tool_every=2)
    # 6 policy slots (5 digits + EOS), a TOOL column before the 3rd and the 5th.
    assert task.tool_col.tolist() == [False, False, True, False, False, True, False, False]
    assert (task.prompt_len, task.response_len) == (6, 8)
    P, E, T = ex.PAD, ex.EOS, ex.TOOL
    prompt = torch.tensor([[P, P, 3, 1, 4, ex.SEP]] * 5)
    lengths = torch.full((5,), 3)
    responses = torch.tensor(
        [
            [4, 1, T, 3, E, P, P, P],  # exact
            [4, 9, T, 3, E, P, P, P],  # one digit wrong
            [4, 1, T, 3, 7, T, 7, 7],  # never stops: 6 digits for a 3-digit target
            [4, E, P, P, P, P, P, P],  # stops too early
            [E, P, P, P, P, P, P, P],  # empty answer
        ]
    )
    reward, exact, n = task.score(prompt, lengths, responses)
    assert reward.tolist() == pytest.approx([1.0, 2 / 3, 0.5, 1 / 3, 0.0])
    assert exact.tolist() == [True, False, False, False, False]
    assert n.tolist() == [3, 3, 6, 1, 0]


@pytest.mark.parametrize("tool_every", [0, 2, 3])
def test_score_matches_the_definition_on_random_responses(ex, tool_every):
    task = ex.Task(1, 5, tool_every)
    gen = torch.Generator().manual_seed(tool_every)
    prompts, lengths = task.prompts(300, gen)
    policy_cols = (~task.tool_col).nonzero().squeeze(1)
    # Few distinct digits and a likely EOS, so that exact and partly right answers both occur.
    answers = torch.randint(0, 3, (300, task.answer_slots), generator=gen)
    answers = torch.where(torch.rand(answers.shape, generator=gen) < 0.25, ex.EOS, answers)
    prompts[:, : task.max_digits] = torch.where(
        prompts[:, : task.max_digits] == ex.PAD, ex.PAD, prompts[:, : task.max_digits] % 3
    )
    responses = torch.full((300, task.response_len), ex.TOOL)
    responses[:, policy_cols] = answers
    reward, exact, n = task.score(prompts, lengths, responses)
    for i in range(300):
        digits = [d for d in prompts[i, : task.max_digits].tolist() if d != ex.PAD]
        assert len(digits) == int(lengths[i])
        r, e, k = reference_score(digits, answers[i].tolist(), ex.EOS)
        assert (float(reward[i]), bool(exact[i]), int(n[i])) == (pytest.approx(r), e, k), i
    assert exact.any() and (~exact).any()


def test_rollout_masks_and_outcome_rewards(ex):
    torch.manual_seed(0)
    task = ex.Task(2, 5, tool_every=2)
    model = ex.TinyLM(task.prompt_len + task.response_len, d_model=16, layers=1, heads=2)
    prompts, _ = task.prompts(256, torch.Generator().manual_seed(0))
    seq, response, mask = ex.rollout(model, task, prompts)
    assert torch.equal(seq[:, : task.prompt_len], prompts) and seq.shape[1] == task.prompt_len + task.response_len
    for row, m in zip(response.tolist(), mask.tolist(), strict=True):
        done = False
        for c, (tok, on) in enumerate(zip(row, m, strict=True)):
            if done:
                assert (tok, on) == (ex.PAD, False)
            elif task.tool_col[c]:
                assert (tok, on) == (ex.TOOL, False)  # a masked token inside the response
            else:
                assert on and tok < ex.N_ACTIONS
                done = tok == ex.EOS
    ends = mask.sum(1)
    assert (ends < task.answer_slots).any() and (ends == task.answer_slots).any()  # padded and full rows

    reward = torch.rand(256)
    rewards = ex.outcome_rewards(reward, mask)
    for i in range(256):
        last = max(c for c in range(task.response_len) if mask[i, c])
        expected = torch.zeros(task.response_len)
        expected[last] = reward[i]
        assert torch.equal(rewards[i], expected), i


# ----------------------------------------------------------------------------- training loop


@pytest.mark.parametrize("estimator", ["ppo", "grpo", "rloo", "reinforce++"])
def test_smoke(ex, estimator, tmp_path, capsys):
    plot, log = tmp_path / "curve.png", tmp_path / "curve.csv"
    args = ["--smoke", "--device=cpu", "--no-progress", f"--estimator={estimator}", f"--plot={plot}", f"--log={log}"]
    meta = ex.main(args)
    out = capsys.readouterr().out
    result = parse_result(out)
    assert result["episodes"] == 3 * 8 * 4  # --smoke: 3 iterations of 8 prompts x 4 samples
    assert 0 < result["frames"] <= result["episodes"] * 6  # policy tokens: at most 6 per response
    assert 0 <= result["final_mean_return"] <= 1
    assert meta["updates"] == 2 * 2  # the last iteration stops after its rollout; 32 responses / 16 per step
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sys.path.insert(0, str(EXAMPLES))
    try:
        data = importlib.import_module("_common").load_log(log)
    finally:
        sys.path.remove(str(EXAMPLES))
    assert data["estimator"] == estimator and len(data["episode_return"]) == result["episodes"]
    assert data["frames"][-1] == result["frames"]


@pytest.mark.compiled
@pytest.mark.parametrize("estimator", ["ppo", "grpo"])
def test_learns_on_the_gpu(ex, estimator, tmp_path, capsys):
    """The default settings on CUDA, rl_triton.llm's compiled kernels: the target within the default budget."""
    plot = tmp_path / "curve.png"
    meta = ex.main(["--device=cuda", "--no-progress", f"--estimator={estimator}", f"--plot={plot}"])
    result = parse_result(capsys.readouterr().out)
    assert result["reached_target"] and result["final_mean_return"] >= 0.95, result
    assert meta["device"].startswith("cuda") and plot.stat().st_size > 0


def test_same_seed_same_run(ex, tmp_path, capsys):
    runs = []
    for _ in range(2):
        ex.main(["--smoke", "--device=cpu", "--no-progress", "--plot=none", "--seed=3"])
        result = parse_result(capsys.readouterr().out)
        runs.append({k: v for k, v in result.items() if k != "wall_seconds"})
    assert runs[0] == runs[1]


def test_help_names_every_estimator(ex):
    text = ex.build_parser().format_help()
    for name in ex.ESTIMATORS:
        assert name in text
    assert "--target-reward" in text and "--tool-every" in text


# ----------------------------------------------------------------------------- slow (opt-in)


def _slow_selected(config) -> bool:
    if os.environ.get("RL_TRITON_SLOW") == "1":
        return True
    markexpr = config.getoption("markexpr", default="") or ""
    return "slow" in markexpr and "not slow" not in markexpr


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["ppo", "grpo", "reinforce++"])
def test_default_settings_reach_the_target(estimator, tmp_path, request):
    if not _slow_selected(request.config):
        pytest.skip("slow: set RL_TRITON_SLOW=1 or pass -m slow to run the full training runs")
    cmd = [sys.executable, str(EXAMPLES / "llm_ppo.py"), "--device=cpu", f"--estimator={estimator}", "--no-progress"]
    # the checkout under test first on the path: the script's own folder, not the repository, is sys.path[0]
    path = os.pathsep.join(p for p in (str(EXAMPLES.parent), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=SLOW_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = parse_result(proc.stdout)
    assert result["reached_target"] and result["final_mean_return"] >= 0.95, result
