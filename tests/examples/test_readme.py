"""The README's Python blocks run as written: all of them in order, as one script in a fresh process, the way a
reader pastes them (on the GPU when there is one; on the CPU through the PyTorch path, without TRITON_INTERPRET).
The README's first lines are its two set-up commands."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks() -> list[str]:
    return BLOCK.findall(README.read_text())


def test_readme_starts_with_the_two_set_up_commands():
    lines = README.read_text().splitlines()
    assert lines[0] == "# rl_triton" and lines[2] == "```bash" and lines[5] == "```"
    assert lines[3].startswith("bash scripts/demo.sh ") and lines[4].startswith("bash scripts/test.sh ")


def test_readme_python_blocks_run(tmp_path):
    pytest.importorskip("torchrl", reason="the README's TorchRL blocks need TorchRL (pip install rl-triton[torchrl])")
    blocks = python_blocks()
    assert len(blocks) >= 10
    script = tmp_path / "readme.py"
    script.write_text("\n\n".join(blocks))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # tests/conftest.py sets it
    env["RL_WARNINGS"] = "False"
    # this checkout's rl_triton, installed or not (the script runs in a temporary folder)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(README.parent), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    for line in (
        "GAE advantages:",
        "V-trace targets:",
        "Retrace Q-targets:",
        "Prefix sums:",
        "per-step gamma:",
        "token GAE:",
        "advantage:",
        "PPO",
    ):
        assert line in proc.stdout, proc.stdout


def test_readme_registration_block_runs_the_registered_estimator(tmp_path):
    """The block registering rl_triton's estimators with TorchRL shows the loss calling ours: the blocks up to it,
    with every call of rl_triton.modules.GAE counted, call it at least once inside that block."""
    pytest.importorskip("torchrl", reason="the README's TorchRL blocks need TorchRL (pip install rl-triton[torchrl])")
    blocks = python_blocks()
    at = next(i for i, b in enumerate(blocks) if "register_with_torchrl()" in b)
    count = (
        "import rl_triton.modules as _m\n_calls = []\n_forward = _m.GAE.forward\n"
        "def _counted(self, *a, **k):\n    _calls.append(1)\n    return _forward(self, *a, **k)\n"
        "_m.GAE.forward = _counted\n"
    )
    script = tmp_path / "readme.py"
    script.write_text("\n\n".join([*blocks[:at], count, blocks[at], "assert _calls, 'the loss never ran GAE'"]))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["RL_WARNINGS"] = "False"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(README.parent), env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "rl_triton.modules.gae.GAE" in proc.stdout
