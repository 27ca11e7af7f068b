"""CPU checks of the tuning tool's host-side logic (its measurements need a GPU): the target verdicts and table of
benchmarks.targets, the plan variants of benchmarks.tune, and its offline sm_90 compile."""

import pytest
import torch

from benchmarks import targets, tune
from rl_triton.kernels.plans import Form, Phase


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


def test_tune_varies_plan_fields():
    """benchmarks.tune parses --vary into typed Plan fields and lists the chosen plan first."""
    base = tune.chosen_plan("compute_gae", 4096, 2048, torch.float32, False)
    vary = tune.parse_vary(["warps=8,4", "form=plain,groups4", "maxnreg=0,48", "exact_t=1"])
    assert vary["form"] == [Form.PLAIN, Form.GROUPS4] and vary["maxnreg"] == [None, 48] and vary["exact_t"] == [True]
    found = tune.variants(base, vary)
    assert found[0] == base and len(found) == 8 and len(set(found)) == 8
    with pytest.raises(SystemExit, match="FIELD"):
        tune.parse_vary(["blocks=3"])


def _child(cmd):
    """The JSON that ``cmd`` prints, run in a child process without TRITON_INTERPRET (the suite may run under
    TRITON_INTERPRET=1, whose kernels do not compile)."""
    import json
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 and "ptxas" in proc.stderr:
        pytest.skip(f"no working ptxas: {proc.stderr[-300:]}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _offline(*argv):
    """benchmarks.tune --offline in a child process, as a user runs it."""
    import sys

    return _child([sys.executable, "-m", "benchmarks.tune", *argv, "--offline", "--json"])


_MANY = """
import contextlib, io, json, sys
from benchmarks import tune
rows = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()):
        rows.append(tune.main([*argv, "--offline"]))
print(json.dumps(rows))
"""


def _offline_many(*argvs):
    """benchmarks.tune --offline for each of ``argvs``, one after the other in one child process (one import of
    torch and Triton, about 4 s, instead of one per compile); a list of each one's rows."""
    import json
    import sys

    return _child([sys.executable, "-c", _MANY, json.dumps(argvs)])


def test_tune_compiles_plans_for_sm90(monkeypatch):
    """benchmarks.tune --offline compiles the launches of a call's plan and its variants for sm_90 without a GPU,
    the plan's register cap (GAE's 512-step programs) reaching ptxas, and reports plans the kernels cannot run."""
    rows = _offline("gae", "64x512", "--vary", "maxnreg=48,0", "form=groups4,env_groups")
    chosen, bad, uncapped, _ = rows  # the chosen plan first, then the product in order
    assert chosen["chosen"] and chosen["plan"]["maxnreg"] == 48 and uncapped["plan"]["maxnreg"] is None
    (launch,) = chosen["launches"]
    assert launch["kernel"] == "gae_kernel" and launch["grid"] == [32, 1] and launch["warps"] == 4
    assert launch["constexprs"]["BT"] == 512 and launch["constexprs"]["maxnreg"] == 48
    assert 0 < launch["registers"] <= 48 and launch["stack_bytes"] == 0
    assert launch["programs_per_sm"] == 65536 // (-(-launch["registers"] // 8) * 8 * 128)
    assert launch["sass_instructions"] > 100 and sum(launch["top_opcodes"].values()) <= launch["sass_instructions"]
    assert "env-major groups" in bad["skipped"]
    assert all(trips and all(n > 0 for n in trips) for trips in launch["load_trips"])
    assert launch["barriers"] >= 2  # at least the per-chunk test's reduction across warps
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"), tune.recorded_launches():
        pass


def _sass(*lines: str) -> str:
    return "".join(f"        /*{16 * i:04x}*/                   {line} ;  /* 0x0 */\n" for i, line in enumerate(lines))


def test_load_trips_count_the_waits_on_memory():
    """A trip ends where an instruction reads what a load in flight writes (a 128-bit load writes four registers,
    a 64-bit address names two; UR registers are not R registers); loops are the innermost backward branches."""
    one = _sass(
        "LDG.E.128 R4, desc[UR4][R2.64]", "LDG.E R8, desc[UR4][R2.64+0x800]", "IADD3 R10, R11, UR8, RZ",
        "FADD R12, R7, R8", "STG.E desc[UR4][R2.64], R12",
    )  # fmt: skip
    assert tune.load_trips(one) == [[2]]
    serial = _sass(
        "MOV R1, RZ", "LDG.E.128 R4, desc[UR4][R2.64]", "FFMA R9, R5, UR6, R1", "LDG.E.128 R4, desc[UR4][R12.64]",
        "LDG.E R8, desc[UR4][R14.64]", "@P0 STG.E.64 desc[UR4][R16.64], R6", "FADD R9, R9, R8",
        "LDG.E R20, desc[UR4][R14.64+0x4]", "ISETP.GE.AND P1, PT, R20, R9, PT", "@P1 BRA 0x10", "EXIT",
    )  # fmt: skip
    assert tune.load_trips(serial) == [[1, 2, 1]]  # the loop from 0x10; the store reads R7 of the 128-bit load
    nested = _sass("LDG.E R4, desc[UR4][R2.64]", "FADD R5, R4, R4", "BRA 0x0", "LDG.E R6, desc[UR4][R2.64]", "BRA 0x0")
    assert tune.load_trips(nested) == [[1]]


def test_functions_called_are_reported_apart():
    """A function Triton does not inline is listed after the kernel's code: its loads and barriers are the called
    function's (each CALL.REL target starts one), not the kernel's."""
    sass = _sass(
        "LDG.E R4, desc[UR4][R2.64]", "LDG.E R5, desc[UR4][R2.64+0x4]", "FADD R6, R4, R5",
        "BAR.SYNC.DEFER_BLOCKING 0x0", "@!P0 EXIT", "CALL.REL.NOINC 0x70", "EXIT", "LDG.E R8, desc[UR4][R2.64]",
        "FADD R9, R8, R8",
        "LDG.E R10, desc[UR4][R2.64]", "BAR.SYNC.DEFER_BLOCKING 0x0", "BAR.SYNC.DEFER_BLOCKING 0x0",
        "RET.REL.NODEC R4 0x0",
    )  # fmt: skip
    own, (apart,) = tune.split_functions(sass)
    assert tune.load_trips(own) == [[2]] and tune.opcode_counts(own)["BAR"] == 1
    assert tune.load_trips(apart) == [[1, 1]] and tune.opcode_counts(apart)["BAR"] == 2
    alone = _sass("LDG.E R4, desc[UR4][R2.64]", "FADD R5, R4, R4", "EXIT")
    own, apart = tune.split_functions(alone)
    assert apart == [] and tune.load_trips(own) == tune.load_trips(alone) == [[1]]


_TM_COMPILES = [  # every kernel, every time-major form, both splits: each a compile of its own (about 2 s)
    ("gae", 4096, 24), ("vtrace", 4096, 8), ("lambda", 4096, 24), ("returns", 4096, 2048), ("gae", 64, 2048),
    ("prefix", 64, 2048), ("retrace", 4096, 24), ("retrace", 64, 2048),
]  # fmt: skip


def test_time_major_launches_compile_for_sm90():
    """The time-major forms of every kernel compile for sm_90 (offline, no GPU): group-major and env-major
    tiles, the forward scans' plain tiles, the two-pass split, the look-back over blocks of envs. The
    interpreter runs the kernels as Python, so it cannot catch what only Triton's compiler rejects (such as a
    constexpr branch returning tiles of another shape)."""
    found = _offline_many(*([fn, f"{n}x{t}", "--time-major"] for fn, n, t in _TM_COMPILES))
    assert len(found) == len(_TM_COMPILES)
    launches = [r for rows in found for row in rows for r in row["launches"]]
    assert all(r["constexprs"]["TM"] >= 1 and r["registers"] > 0 for r in launches)
    # no stack but the forward scans' look-back blocks' 8 bytes (their chunk test measured faster all the same)
    stacks = {(r["kernel"], r["constexprs"]["PHASE"]): r["stack_bytes"] for r in launches if r["stack_bytes"]}
    assert stacks in ({}, {("forward_trace_kernel", Phase.LOOKBACK_EPOCHS): 8}), stacks
    forms = {r["constexprs"].get("FORM") for r in launches}
    assert forms >= {Form.GROUPS4, Form.ENV_GROUPS, Form.DESCENDING, None}  # None: the forward kernel's tiles
    phases = {r["constexprs"]["PHASE"] for r in launches}
    assert phases == {Phase.SINGLE, Phase.AGGREGATES, Phase.RESCAN, Phase.LOOKBACK_EPOCHS}  # both splits
