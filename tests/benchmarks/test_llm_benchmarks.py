"""CPU tests of the token-level part of the benchmark suite (benchmarks/llm.py, benchmarks/llm_impls.py): the
loop and vectorised baselines against float64 loops of the formulas, the generated inputs, and the runner's
token-level rows on tiny shapes (``--device cpu``; rl_triton.llm on its PyTorch path, whose kernels are tested
in tests/llm; times are meaningless)."""

from __future__ import annotations

import math

import pytest
import torch

import rl_triton
from benchmarks import baselines, llm, llm_impls, report, run
from tests.llm import reference as ref

GAE, RPP = "compute_gae_advantage_return", "compute_reinforce_plus_plus_outcome_advantage"
GRPO, RLOO = "compute_grpo_outcome_advantage", "compute_rloo_outcome_advantage"


def _err(out, want) -> float:
    want = want.double()
    return float((out.double() - want).abs().max() / want.pow(2).mean().sqrt().clamp(min=1e-12))


def _edge_inputs(b=7, t=41):
    """Benchmark-style inputs plus the edges: a row with no valid token, one whose first tokens are masked,
    one valid only at its last position."""
    x = llm.TokenInputs(b, t, torch.float32, "cpu", group_size=3)
    m = x["mask"].clone()
    m[1] = False
    m[2, :9] = False
    m[3] = False
    m[3, -1] = True
    return x, m


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.99, 0.95), (1.0, 1.0), (0.9, 0.0), (0.0, 0.5)])
def test_scan_baselines_match_float64_formulas(gamma, lam):
    x, m = _edge_inputs()
    r, v = x["r"], x["v"]
    want_adv, want_ret, _ = ref.gae(r, v, m, gamma, lam)
    want_rpp_adv, want_rpp_ret = ref.reinforce_pp(r, m, gamma)
    got = {
        "loop": (llm_impls.loop_gae(r, v, m.long(), gamma, lam), llm_impls.loop_reinforce_pp(r, m.long(), gamma)),
        "loop, float mask": (
            llm_impls.loop_gae(r, v, m.float(), gamma, lam),
            llm_impls.loop_reinforce_pp(r, m.float(), gamma),
        ),
    }
    for chunk in (4, 64):  # 4: three levels of the chunked suffix sum at T = 41
        kw = {"gamma": gamma, "lam": lam, "chunk": chunk}
        gae = llm_impls.make_vectorised(GAE, x.t, "cpu", torch.float32, **kw)
        rpp = llm_impls.make_vectorised(RPP, x.t, "cpu", torch.float32, **kw)
        got[f"vectorised, chunk {chunk}"] = (gae(r, v, m), rpp(r, m))
    for name, ((adv, ret), (rpp_adv, rpp_ret)) in got.items():
        assert _err(adv, want_adv) < 1e-5 and _err(ret, want_ret) < 1e-5, (name, "gae")
        assert _err(rpp_adv, want_rpp_adv) < 1e-5 and _err(rpp_ret, want_rpp_ret) < 1e-5, (name, "rpp")


def test_outcome_baselines_match_float64_formulas():
    x, m = _edge_inputs(b=10, t=12)
    r = x["r_outcome"].clone()
    r[4, 2] = 0.7  # a reward before the last token counts in the score too
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 1, 2, 3, 3])  # group 2 has one sequence
    uid = [f"prompt-{i}" for i in ids.tolist()]
    for kind, loop, fn in (("grpo", llm_impls.loop_grpo, GRPO), ("rloo", llm_impls.loop_rloo, RLOO)):
        want = ref.outcome(kind, r, m, ids, epsilon=1e-6)
        vec = llm_impls.make_vectorised(fn, x.t, "cpu", torch.float32, gamma=1.0, num_groups=4)
        for name, (adv, adv2) in {"loop": loop(r, m.long(), uid), "vectorised": vec(r, m, ids)}.items():
            assert adv is adv2 or torch.equal(adv, adv2)
            assert _err(adv, want) < 1e-5, (kind, name)
    want = ref.outcome("drgrpo", r, m, ids)
    assert _err(llm_impls.loop_grpo(r, m.long(), uid, norm_adv_by_std_in_grpo=False)[0], want) < 1e-5
    assert _err(llm_impls.vec_outcome("drgrpo", r, m, ids, 4)[0], want) < 1e-5


@pytest.mark.parametrize("n", [1, 5, 17, 70])
@pytest.mark.parametrize("g", [0.0, 0.3, 0.95, 1.0])
def test_suffix_sum(n, g):
    """y_t = sum_{s >= t} g^(s-t) x_s, over one to three chunk levels."""
    x = torch.randn(3, n, dtype=torch.float64)
    want = torch.zeros_like(x)
    run_sum = torch.zeros(3, dtype=torch.float64)
    for t in reversed(range(n)):
        run_sum = x[:, t] + g * run_sum
        want[:, t] = run_sum
    got = llm_impls.SuffixSum(n, g, "cpu", torch.float64, chunk=4)(x)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_inputs():
    x = llm.TokenInputs(64, 256, torch.float32, "cpu", group_size=8)
    m = x["mask"]
    last = torch.where(m, torch.arange(256), -1).max(1).values
    assert m.dtype == torch.bool and bool(m[::8, -1].all())  # every 8th row has no padding
    assert int((last < 255).sum()) > 16  # right padding elsewhere
    inner = torch.arange(256) < last[:, None]
    assert int((~m & inner).sum()) > 64  # masked spans inside the responses
    r = x["r_outcome"]
    assert torch.equal(r != 0, torch.nn.functional.one_hot(last, 256).bool() & (r != 0))
    assert int((r != 0).sum()) == 64
    assert torch.equal(x["index"], torch.arange(8).repeat_interleave(8))
    uid = list(x["uid"])
    assert len(set(uid)) == 8 and all(uid[i] == uid[i - i % 8] for i in range(64))
    assert torch.equal(x["mask_verl"], m.long())
    again = llm.TokenInputs(64, 256, torch.float32, "cpu", group_size=8)
    assert torch.equal(again["mask"], m) and list(again["uid"]) == uid  # seeded
    spec = llm.SPECS[GAE]
    assert spec.nbytes(x) == 64 * 256 * (4 + 4 + 1 + 2 * 4)
    assert llm.SPECS[GRPO].nbytes(x) == 64 * 256 * (4 + 1 + 4) + 64 * 8


def test_functions_and_configs():
    rl, tok = llm.split_functions("llm")
    assert rl == [] and tok == list(llm.SPECS)
    rl, tok = llm.split_functions("gae,llm_grpo,rloo")
    assert rl == ["compute_gae"] and tok == [GRPO, RLOO]
    assert llm.split_functions(None)[1] == list(llm.SPECS)
    full = llm.configs(list(llm.SPECS))
    assert len(full) == 2 * 4 + 2 * 2 * 2
    assert {(c.num_envs, c.seq_len) for c in full if c.function == GAE} == set(llm.SCAN_SHAPES)
    assert {(c.num_envs, c.group_size) for c in full if c.function == RLOO} == {(1024, 8), (1024, 64), (8192, 8),
                                                                                (8192, 64)}  # fmt: skip
    quick = llm.configs(list(llm.SPECS), quick=True)
    assert [(c.num_envs, c.seq_len) for c in quick] == [(64, 32768), (64, 32768), (8192, 1024), (8192, 1024)]
    custom = llm.configs([GAE, GRPO], shapes=[(16, 32)], groups=[4, 16])
    assert [(c.function, c.group_size) for c in custom] == [(GAE, None), (GRPO, 4), (GRPO, 16)]
    assert llm.resolve_baselines("verl_loop,eager") == ("verl_loop", "eager")
    with pytest.raises(ValueError):
        llm.resolve_baselines("nope")


def test_targets():
    row = {"function": GAE, "num_envs": 64, "seq_len": 32768, "fraction_of_copy": 0.8, "baselines": [
        {"name": "verl_loop", "status": "ok", "speedup": 900.0, "speedup_primary": 1100.0}]}  # fmt: skip
    got = llm.targets(row)
    assert [(t["metric"], t["met"]) for t in got] == [
        ("fraction_of_copy", True),
        ("speedup:verl_loop", False),
        ("speedup_primary:verl_loop", True),
    ]
    row = {"function": GRPO, "num_envs": 8192, "seq_len": 1024, "group_size": 8, "kernel_us": 40.0, "baselines": []}
    got = llm.targets(row)
    assert [(t["metric"], t["met"]) for t in got] == [
        ("kernel_us", True),
        ("speedup:verl_loop", None),
        ("speedup_primary:verl_loop", None),
    ]
    text = report.targets_table([row | {"targets": got}])
    assert "| compute_grpo_outcome_advantage | 8,192×1,024 (groups of 8) | kernel <= 50 us | 40.0 µs | met |" in text
    assert "not measured | n/a |" in text
    assert llm.targets({"function": GRPO, "num_envs": 1024, "seq_len": 1024}) == []


def test_call_passes_check():
    """call(check=False), the call the kernel timing captures in a CUDA graph, skips the estimators' count check
    (its host sync); the checked call raises on a mask without a valid token."""
    r = torch.randn(3, 16)
    x = {"r": r, "v": torch.randn(3, 16), "mask": torch.zeros(3, 16, dtype=torch.bool)}
    with rl_triton.use_backend("torch"):
        for name in (GAE, RPP):
            with pytest.raises(ValueError, match="no valid token"):
                llm.call(llm.SPECS[name], x, "primary")
            adv, ret = llm.call(llm.SPECS[name], x, "primary", check=False)
            assert adv.shape == ret.shape == r.shape


@pytest.fixture(scope="module")
def llm_run():
    with rl_triton.use_backend("torch"):
        return run.main(["--device", "cpu", "--functions", "llm", "--no-update", "--no-floors"])


def test_cpu_run(llm_run):
    report.validate(llm_run)
    rows = llm_run["rows"]
    assert [r["function"] for r in rows] == list(llm.SPECS)
    assert llm_run["meta"]["llm"]["gamma"] == llm.GAMMA
    for row in rows:
        assert "error" not in row, row.get("traceback")
        assert (row["num_envs"], row["seq_len"]) == llm.CPU_SHAPE and row["verified_on"] == "all"
        assert row["correct"] and row["err"] < 1e-5
        assert row.get("group_size") == (llm.CPU_GROUP if llm.SPECS[row["function"]].outcome else None)
        assert row["bytes"] == llm.SPECS[row["function"]].nbytes(llm.TokenInputs(8, 16, torch.float32, "cpu", 4))
        assert set(row["ours_forms"]) == {"primary", "verl"} and all(f["correct"] for f in row["ours_forms"].values())
        got = {b["name"]: b for b in row["baselines"]}
        assert set(got) == {"verl_loop", "torch_vec", "compile"}
        for name, b in got.items():
            assert b["status"] == "ok", (row["function"], name, b.get("reason"), b.get("traceback"))
            assert b["err"] <= row["tolerance"] and b["full_call_us"] > 0
            assert b["speedup"] == pytest.approx(b["full_call_us"] / b["ours_full_call_us"])
        loop = got["verl_loop"]
        assert loop["ours"] == "verl" and loop["reps"] >= 1
        assert loop["speedup_primary"] == pytest.approx(loop["full_call_us"] / row["full_call_us"])
        assert got["compile"]["compiled"] is False and "NOT compiled" in got["compile"]["label"]
        assert row["targets"] == []  # none at this shape
    text = report.table(rows)
    assert "vs verl loop" in text and "8×16 (groups of 4)" in text


def test_targets_recorded_at_their_shape():
    opts = baselines.Options(device=torch.device("cpu"), budget=baselines.timing.CPU, baselines=("verl_loop",))
    with rl_triton.use_backend("torch"):
        row = llm.measure(llm.Config(RLOO, 8192, 2, "float32", "custom", 64), opts)
    assert row["correct"] and row["num_groups"] == 128
    assert [b["status"] for b in row["baselines"]] == ["ok"]
    assert [t["metric"] for t in row["targets"]] == ["kernel_us", "speedup:verl_loop", "speedup_primary:verl_loop"]
    assert all(t["value"] is not None and t["met"] in (True, False) for t in row["targets"])
    assert "targets:" in run.summary(row)


def test_incorrect_baseline_is_reported_not_timed(monkeypatch):
    def wrong(r, v, mask, gamma, lam):
        adv, ret = llm_impls.loop_gae(r, v, mask, gamma, lam)
        return adv, ret + 1.0

    monkeypatch.setitem(llm_impls.LOOPS, GAE, wrong)
    opts = baselines.Options(device=torch.device("cpu"), budget=baselines.timing.CPU, baselines=("verl_loop",))
    with rl_triton.use_backend("torch"):
        row = llm.measure(llm.Config(GAE, 4, 24, "float32", "custom"), opts)
    (b,) = row["baselines"]
    assert b["status"] == "incorrect" and b["err"] > row["tolerance"] and not math.isnan(b["err"])
    assert "full_call_us" not in b and "speedup" not in b
