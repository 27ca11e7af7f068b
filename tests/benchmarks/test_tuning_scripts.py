"""CPU checks of the tuning tools' host-side logic (their measurements need a GPU): the target
verdicts and table of benchmarks.targets, the policy override of benchmarks.tile_sweep, and the
offline sm_90 compile of benchmarks.offline_sass."""

import pytest
import torch

from benchmarks import targets, tile_sweep
from rl_triton.kernels import launch


def _row(fn, n, t, dtype="float32", kernel_us=10.0, fraction=0.9, call_us=50.0, num_actions=None):
    return {
        "function": fn, "num_envs": n, "seq_len": t, "dtype": dtype, "num_actions": num_actions,
        "bytes": n * t * (13 if dtype == "float32" else 7), "copy_GBps": 4000.0,
        "family": targets.family(n, t), "kernel_us": kernel_us, "full_call_us": call_us,
        "fraction_of_copy": fraction, "fraction_target": targets.fraction_target(fn, n, t),
        "time_target_us": targets.TIME_TARGET_US.get((n, t)),
        "full_call_target_us": targets.FULL_CALL_TARGET_US.get((fn, n, t)),
    }  # fmt: skip


def test_targets_families_and_thresholds():
    assert targets.fraction_target("compute_gae", 4096, 2048) == 0.85
    assert targets.fraction_target("compute_vtrace", 4096, 2048) == 0.80
    assert targets.fraction_target("compute_retrace", 8192, 4096) == 0.70
    assert targets.fraction_target("compute_gae", 1, 16777216) == 0.50
    assert targets.fraction_target("compute_gae", 1048576, 8) == 0.60
    assert targets.fraction_target("compute_gae", 64, 512) is None
    assert len(targets.jobs(quick=True)) < len(targets.jobs(quick=False))


def test_targets_verdicts():
    rows = targets.verdicts(
        [
            _row("compute_gae", 4096, 2048, kernel_us=40.0, fraction=0.9),
            _row("compute_gae", 4096, 2048, dtype="bfloat16", kernel_us=20.0, fraction=0.9),
            _row("compute_gae", 1, 1048576, kernel_us=20.0, fraction=0.6),  # fraction ok, time missed
            _row("compute_vtrace", 4096, 2048, fraction=0.79),
            _row("compute_gae", 64, 512, call_us=9.0),
        ]
    )
    assert [r["meets_targets"] for r in rows] == [True, True, False, False, False]
    assert rows[1]["speedup_over_float32"] == pytest.approx(2.0)
    assert rows[1]["copy_speedup_over_float32"] == pytest.approx(13 / 7)
    table = targets.markdown(rows)
    assert table.count("\n") == len(rows) + 2 and "2.00× fp32 (copy 1.86×)" in table and "**no**" in table


def test_tile_sweep_policy_override_restores():
    before = launch._tiles(4096, 2048)
    with tile_sweep.policy(_BLOCK=2048, _WARPS=8, _MAX_BT=2048):
        assert launch._tiles(4096, 2048) == launch.Tiles(1, 2048, 8)
        assert tile_sweep._effective("compute_gae", 4096, 2048, torch.float32)[:3] == (1, 2048, 8)
    with tile_sweep.policy(GROUPED="off"):
        assert tile_sweep._effective("compute_gae", 4096, 2048, torch.float32)[5] == 0
        assert launch.retrace_tiles(4096, 2048, 4)[1] is False
    with tile_sweep.policy(GROUPED="on"):
        assert tile_sweep._effective("compute_gae", 4096, 8, torch.float32)[5] == 4
    with tile_sweep.policy(GROUPED="env"):
        assert tile_sweep._effective("compute_gae", 4096, 2048, torch.float32)[5] == -4
    assert tile_sweep._effective("compute_gae", 1, 1 << 20, torch.float32)[1:] == (
        4096,
        8,
        256,
        1,
        4,
        True,
        256,
        None,
    )  # look-back (a small launch: 4096-step blocks, one window, no register cap)
    assert tile_sweep._effective("compute_retrace", 1, 1 << 20, torch.float32)[6] is True
    assert tile_sweep._effective("compute_eligibility_traces", 1, 1 << 20, torch.float32)[6] is False  # two passes
    with tile_sweep.policy(_LOOKBACK=False, _SPLIT_FACTOR=1):
        assert tile_sweep._effective("compute_gae", 1, 1 << 20, torch.float32)[1:] == (
            1024,
            4,
            1024,
            1,
            4,
            False,
            1,
            None,
        )
    assert launch._tiles(4096, 2048) == before
    f32, bf16 = torch.float32, torch.bfloat16
    assert [launch._group(launch._tiles(4096, t), f32) for t in (8, 16, 2048)] == [-4, 4, 4]
    assert [launch._group(launch._tiles(4096, t), bf16) for t in (8, 128, 2048)] == [-4, 4, 8]
    assert len(tile_sweep._grid({"a": (1, 2), "b": (3, 4, 5)})) == 6


def test_offline_sass_compiles_the_launch_plan_for_sm90(monkeypatch):
    """benchmarks.offline_sass compiles the launches of a public call for sm_90 without a GPU (a child
    process: the suite may run under TRITON_INTERPRET=1, whose kernels do not compile), with the
    launcher's register cap (GAE's 512-step programs: launch._SINGLE_CAPS) reaching ptxas."""
    import json
    import os
    import subprocess
    import sys

    from benchmarks import offline_sass

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "benchmarks.offline_sass", "gae", "64x512", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    if proc.returncode != 0 and "ptxas" in proc.stderr:
        pytest.skip(f"no working ptxas: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    (row,) = json.loads(proc.stdout)
    assert row["kernel"] == "gae_kernel" and row["grid"] == [32, 1] and row["warps"] == 4
    assert row["constexprs"]["BT"] == 512 and row["constexprs"]["maxnreg"] == 48
    assert 0 < row["registers"] <= 48 and row["stack_bytes"] == 0
    assert row["programs_per_sm"] == 65536 // (-(-row["registers"] // 8) * 8 * 128)
    assert row["sass_instructions"] > 100 and sum(row["top_opcodes"].values()) <= row["sass_instructions"]
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"), offline_sass.recorded_launches():
        pass


_TM_COMPILES = [
    ("gae", 4096, 24), ("vtrace", 4096, 24), ("returns", 4096, 24), ("lambda", 4096, 24), ("traces", 4096, 24),
    ("gae", 4096, 8), ("vtrace", 4096, 8), ("gae", 64, 2048), ("prefix", 64, 2048), ("returns", 4096, 2048),
    ("retrace", 4096, 24), ("retrace", 4096, 8), ("retrace", 64, 2048),
]  # fmt: skip


def test_time_major_launches_compile_for_sm90():
    """The time-major forms of every kernel compile for sm_90 (offline, no GPU): group-major and env-major
    tiles, the forward scans' plain tiles, the two-pass split, the look-back over blocks of envs. The
    interpreter runs the kernels as Python, so it cannot catch what only Triton's compiler rejects (such as a
    constexpr branch returning tiles of another shape)."""
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import json, torch\nfrom benchmarks import offline_sass\n"
        f"rows = [r for fn, n, t in {_TM_COMPILES!r} for r in offline_sass.report(fn, n, t, torch.float32, "
        "time_major=True)]\nprint(json.dumps(rows))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 and "ptxas" in proc.stderr:
        pytest.skip(f"no working ptxas: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert all(r["constexprs"]["TM"] >= 1 and r["registers"] > 0 and r["stack_bytes"] == 0 for r in rows)
    assert {r["constexprs"].get("GROUPED") for r in rows} >= {4, -4, None}  # None: the forward kernel's plain tiles
    assert {r["constexprs"]["PHASE"] for r in rows} == {0, 1, 2, 5}  # the two-pass split, the look-back
