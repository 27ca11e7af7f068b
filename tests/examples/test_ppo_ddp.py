"""examples/ppo_ddp.py runs end to end: two gloo processes under torchrun, and one process without it.

Like test_examples.py, each run is a subprocess in its own session, killed as a whole on timeout.
"""

from __future__ import annotations

import json
import sys

import pytest

from .test_examples import EXAMPLES, SMOKE_TIMEOUT_S, _import_common, parse_result, run_command

pytest.importorskip("torch.distributed.run", reason="needs torchrun (torch.distributed)")


def _run(cmd: list[str], cwd, timeout: float = SMOKE_TIMEOUT_S):
    return run_command(cmd, timeout=timeout, cwd=cwd)


def _ddp_line(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("DDP ")]
    assert len(lines) == 1, f"expected one DDP line (rank 0 only):\n{out[-4000:]}"
    return json.loads(lines[0][len("DDP ") :])


SMOKE = ["--smoke", "--device=cpu", "--no-progress"]


def test_two_gloo_processes(tmp_path):
    log, plot = tmp_path / "curve.csv", tmp_path / "curve.png"
    # "--" ends torchrun's own options: its parser would take --log for an abbreviation of --log-dir
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "--"]
    cmd += [str(EXAMPLES / "ppo_ddp.py"), *SMOKE, f"--log={log}", f"--plot={plot}"]
    rc, out, seconds = _run(cmd, tmp_path)
    assert rc == 0, f"exited with {rc} after {seconds:.0f} s:\n{out[-4000:]}"
    assert sum(line.startswith("RESULT ") for line in out.splitlines()) == 1, out[-4000:]
    result = parse_result(out)
    assert result["frames"] == 512 and result["episodes"] > 0
    ddp = _ddp_line(out)
    assert ddp == {"world_size": 2, "backend": "gloo", "replicas_in_sync": True, "updates": 8}
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = _import_common().load_log(log)
    assert data["world_size"] == 2 and len(data["episode_return"]) == result["episodes"]


def test_one_process_without_torchrun(tmp_path):
    """Plain ``python ppo_ddp.py`` runs as a group of one; --adv-norm batch normalises per global batch."""
    cmd = [sys.executable, str(EXAMPLES / "ppo_ddp.py"), *SMOKE, "--adv-norm=batch"]
    rc, out, seconds = _run(cmd, tmp_path)
    assert rc == 0, f"exited with {rc} after {seconds:.0f} s:\n{out[-4000:]}"
    assert parse_result(out)["frames"] == 512
    assert _ddp_line(out) == {"world_size": 1, "backend": "gloo", "replicas_in_sync": True, "updates": 8}
