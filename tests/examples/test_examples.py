"""The example scripts (examples/ppo.py, examples/impala.py, examples/plot_curves.py) run end to end.

Each script runs as a subprocess, the way a user runs it, in its own session (process group) so
that a hang -- e.g. actor processes of impala.py's multi-process collector that never exit -- is
killed as a whole after a timeout instead of blocking the suite.

* Smoke tests (always on): ``--smoke`` (a few hundred frames) with either estimator, with
  ``TRITON_INTERPRET=1`` in the environment as CI sets it, must exit 0 and print a RESULT line.
* Slow tests (opt-in): the default settings must reach the documented returns (PPO >= 450,
  IMPALA >= 195). They take a few minutes of CPU; run them with ``RL_TRITON_SLOW=1 pytest
  tests/examples`` or ``pytest -m slow tests/examples``.

The examples need gymnasium and TorchRL; without them these tests are skipped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torchrl", reason="the examples need TorchRL (pip install rl-triton[torchrl])")
pytest.importorskip("gymnasium", reason="the examples need gymnasium (pip install gymnasium)")
pytest.importorskip("tqdm", reason="the examples need tqdm")

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMOKE_TIMEOUT_S = 240  # a smoke run takes ~5-20 s on 2 busy cores; this only guards against hangs
SLOW_TIMEOUT_S = 900  # the default settings finish in 1-2 minutes on 2 cores, well inside 10


def _slow_selected(config) -> bool:
    if os.environ.get("RL_TRITON_SLOW") == "1":
        return True
    markexpr = config.getoption("markexpr", default="") or ""
    return "slow" in markexpr and "not slow" not in markexpr


@pytest.fixture
def require_slow(request):
    if not _slow_selected(request.config):
        pytest.skip("slow: set RL_TRITON_SLOW=1 or pass -m slow to run the full training runs")


def _env() -> dict:
    env = dict(os.environ)
    if os.environ.get("RL_TRITON_TEST_NO_INTERPRET") != "1":
        env["TRITON_INTERPRET"] = "1"
    env.setdefault("RL_WARNINGS", "False")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_script(script: str, *args: str, timeout: float, cwd: Path):
    """Runs ``python examples/<script> args`` and returns (returncode, output, seconds). On timeout
    the whole process group (the script and any actor processes it started) is killed."""
    return run_command([sys.executable, str(EXAMPLES / script), *args], timeout=timeout, cwd=cwd)


def run_command(cmd: list[str], *, timeout: float, cwd: Path):
    """Runs ``cmd`` in a process group of its own; returns (returncode, output, seconds), as run_script."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        out, _ = proc.communicate()
        pytest.fail(f"{' '.join(cmd)} did not finish within {timeout} s; output:\n{out[-4000:]}")
    finally:
        _kill_group(proc)  # leftovers (actor processes) of a script that exited
    return proc.returncode, out, time.perf_counter() - start


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _import_common():
    """examples/_common.py, imported the way the scripts import it (their folder on sys.path)."""
    sys.path.insert(0, str(EXAMPLES))
    try:
        import _common
    finally:
        sys.path.remove(str(EXAMPLES))
    return _common


def parse_result(out: str) -> dict:
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no RESULT line in the output:\n{out[-4000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


# ----------------------------------------------------------------------------- smoke


@pytest.mark.parametrize("estimator", ["rl_triton", "torchrl"])
@pytest.mark.parametrize("script", ["ppo.py", "impala.py"])
def test_smoke(script, estimator, tmp_path):
    log, plot = tmp_path / "curve.csv", tmp_path / "curve.png"
    # IMPALA with TorchRL's V-trace: one actor process (the collector still runs in its own processes), not the
    # default two, each of which imports TorchRL (about 5 s); the two actors run with rl_triton's estimator
    extra = ["--workers=1"] if (script, estimator) == ("impala.py", "torchrl") else []
    rc, out, seconds = run_script(
        script,
        "--smoke",
        *extra,
        "--device=cpu",
        f"--estimator={estimator}",
        "--no-progress",
        f"--log={log}",
        f"--plot={plot}",
        timeout=SMOKE_TIMEOUT_S,
        cwd=tmp_path,
    )
    assert rc == 0, f"{script} --smoke exited with {rc} after {seconds:.0f} s:\n{out[-4000:]}"
    result = parse_result(out)
    assert result["frames"] > 0 and result["episodes"] > 0
    assert result["final_mean_return"] is not None and result["final_mean_return"] > 0
    assert plot.stat().st_size > 0

    data = _import_common().load_log(log)
    assert data["estimator"] == estimator
    assert len(data["frames"]) == len(data["episode_return"]) == result["episodes"]
    assert data["final_mean_return"] == result["final_mean_return"]


def test_progress_bar_counts_the_frames_run(tmp_path):
    """The bar's total is the frames the collector will run (its budget rounded up to whole batches), and it ends
    at the frames the run reports."""
    args = ["--device=cpu", "--frames=700", "--num-envs=4", "--steps-per-env=64", "--epochs=1", "--minibatch=128"]
    rc, out, _ = run_script("ppo.py", *args, "--target-return=0", timeout=SMOKE_TIMEOUT_S, cwd=tmp_path)
    assert rc == 0, out[-4000:]
    frames = parse_result(out)["frames"]
    assert frames == 768  # 700 frames in batches of 4 x 64 steps
    last = [p for p in out.replace("\r", "\n").splitlines() if "frames/s" in p][-1]
    assert f"{frames}/{frames}" in last, last


def test_progress_bar_ends_at_the_frames_of_an_early_stop():
    import io

    common = _import_common()
    assert [common.frame_budget(f, 256) for f in (1, 256, 257, 500_000)] == [256, 256, 512, 500_224]
    bar = common.progress_bar(1024, disable=False, target=450.0)
    bar.fp = io.StringIO()
    bar.update(512)
    common.close_bar(bar, 512, stopped_early=True)
    assert (bar.n, bar.total) == (512, 512)
    assert "stops early at mean return 450" in bar.desc


def test_plot_curves(tmp_path):
    """plot_curves.py puts a CSV and a JSON log (as ppo.py --log writes them) on one PNG."""
    common = _import_common()
    logs = []
    for estimator, suffix in (("rl_triton", ".csv"), ("torchrl", ".json")):
        curve = common.Curve(window=3)
        for i, r in enumerate((10.0, 30.0, 80.0, 200.0, 500.0)):
            curve.add_episode(r, 100 * (i + 1), float(i))
        meta = {"algorithm": "PPO", "estimator": estimator, "seed": 0, "final_mean_return": curve.mean}
        meta.update(wall_seconds=5.0, target_return=450.0)
        log = tmp_path / f"{estimator}{suffix}"
        common.save_log(log, curve, meta)
        back = common.load_log(log)
        assert back["frames"] == curve.frames and back["estimator"] == estimator
        assert back["running_mean"] == pytest.approx(curve.means, rel=1e-5)
        logs.append(str(log))
    png = tmp_path / "both.png"
    rc, out, _ = run_script("plot_curves.py", str(png), *logs, timeout=SMOKE_TIMEOUT_S, cwd=tmp_path)
    assert rc == 0, out[-4000:]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- slow (opt-in)


@pytest.mark.slow
@pytest.mark.parametrize(
    "script, threshold",
    [("ppo.py", 450.0), ("impala.py", 195.0)],
)
def test_default_settings_reach_threshold(script, threshold, tmp_path, require_slow):
    # Default settings, rl_triton's estimator, on the CPU, with the estimator's Triton kernels run
    # through the interpreter as in the smoke tests (~0.1 s a call: PPO took 67 s instead of 34 s).
    rc, out, seconds = run_script(
        script, "--device=cpu", "--estimator=rl_triton", "--no-progress", timeout=SLOW_TIMEOUT_S, cwd=tmp_path
    )
    assert rc == 0, out[-4000:]
    result = parse_result(out)
    assert result["final_mean_return"] is not None and result["final_mean_return"] >= threshold, result
    assert result["reached_target"], result
    assert seconds < 600, f"{script} took {seconds:.0f} s (budget: 600 s on 2 cores)"
