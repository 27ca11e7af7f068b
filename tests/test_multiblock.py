"""Multi-block scans (rows split into time blocks), forced on small shapes through explicit plans so that the
interpreter and the GPU exercise them, against the PyTorch path in float64: two passes (an aggregate pass, then
a pass that folds the aggregates before each block and rescans it) and the one-pass look-back (windows of 4
blocks, so that the fold of earlier windows' aggregates is exercised, or one window), in every tile form each
kernel has. Also the plans :func:`rl_triton.kernels.plans.choose` picks for long rows."""

import dataclasses

import pytest
import torch

import rl_triton as R
from rl_triton.functional import gae_with_next_values, returns_with_advantages
from rl_triton.kernels import plans
from rl_triton.kernels.plans import Form, Plan, Split


def _inputs(n, t, device, num_actions=3):
    g = torch.Generator().manual_seed(7 * n + t)

    def randn(*shape):
        return torch.randn(*shape, dtype=torch.float64, generator=g).to(device)

    term = (torch.rand(n, t, generator=g) < 0.03).to(device)
    trunc = ((torch.rand(n, t, generator=g) < 0.03).to(device)) & ~term
    probs = torch.softmax(randn(n, t, num_actions), -1)
    return {
        "r": randn(n, t), "v": randn(n, t), "nv": randn(n, t), "boot": randn(n, t), "last": randn(n),
        "term": term, "trunc": trunc, "lpt": 0.3 * randn(n, t), "lpb": 0.3 * randn(n, t), "probs": probs,
        "mu": torch.rand(n, t, dtype=torch.float64, generator=g).to(device) * 0.9 + 0.1,
        "act": torch.randint(0, num_actions, (n, t), generator=g).to(device), "nq": randn(n, t, num_actions),
    }  # fmt: skip


# fn -> (kernel kind, call of the inputs under a plan)
CALLS = {
    "gae": lambda x, plan=None: R.compute_gae(
        x["r"], x["v"], x["term"], x["trunc"], gamma=0.99, lambda_=0.95, bootstrap_values=x["boot"], plan=plan
    ),
    "gae_last": lambda x, plan=None: R.compute_gae(
        x["r"], x["v"], x["term"], gamma=0.99, lambda_=0.9, last_value=x["last"], plan=plan
    ),
    "gae_targets": lambda x, plan=None: gae_with_next_values(
        x["r"], x["v"], x["nv"], x["term"], x["term"] | x["trunc"], gamma=0.99, lambda_=0.95, targets=True, plan=plan
    ),
    "vtrace": lambda x, plan=None: R.compute_vtrace(
        x["lpt"], x["lpb"], x["v"], x["r"], x["term"], x["trunc"], gamma=0.99, bootstrap_values=x["boot"], plan=plan
    ),
    "retrace": lambda x, plan=None: R.compute_retrace(
        x["probs"],
        x["mu"],
        x["v"],
        x["nq"],
        x["act"],
        x["r"],
        x["term"],
        x["trunc"],
        gamma=0.99,
        lambda_=0.9,
        plan=plan,
    ),  # fmt: skip
    "discounted": lambda x, plan=None: R.compute_discounted_returns(
        x["r"], x["term"], x["trunc"], gamma=0.99, bootstrap_values=x["boot"], plan=plan
    ),
    "lambda": lambda x, plan=None: R.compute_lambda_returns(
        x["r"], x["nv"], x["term"], x["trunc"], gamma=0.99, lambda_=0.9, bootstrap_values=x["boot"], plan=plan
    ),
    "returns_adv": lambda x, plan=None: returns_with_advantages(
        x["r"],
        x["v"],
        x["term"],
        x["trunc"],
        gamma=0.99,
        lambda_=0.9,
        next_values=x["nv"],
        bootstrap_values=x["boot"],
        plan=plan,
    ),  # fmt: skip
    "traces": lambda x, plan=None: R.compute_eligibility_traces(
        x["r"], x["term"], gamma=0.99, lambda_=0.9, seed_values=x["last"], plan=plan
    ),
    "prefix": lambda x, plan=None: R.compute_episodic_prefix_sum(x["r"], x["term"], seed_values=x["last"], plan=plan),
    "prefix_starts": lambda x, plan=None: R.compute_episodic_prefix_sum(
        x["r"], x["term"], boundary="starts_at", plan=plan
    ),
}
FORWARD = ("traces", "prefix", "prefix_starts")


def _matches_torch_path(fn, x, plan=None):
    """CALLS[fn] on ``x`` (float64 inputs) under ``plan`` equals the PyTorch path's result to 1e-10."""
    got = CALLS[fn](x, plan)
    with R.use_backend("torch"):
        want = CALLS[fn]({k: v.cpu() for k, v in x.items()})
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, atol=1e-10, rtol=1e-10)


def _forms(fn):
    """The tile forms a kernel has: plain, group-major and (chunks of 8 steps) env-major groups for the
    reverse scans; plain and group-major for Retrace; plain for the forward scans."""
    if fn in FORWARD:
        return [Form.PLAIN]
    if fn == "retrace":
        return [Form.PLAIN, Form.GROUPS4]
    return [Form.PLAIN, Form.GROUPS4, Form.ENV_GROUPS]


# split -> plan of chunks of bt steps in tile form `form`: two passes over blocks of one and of two chunks and over
# blocks of 4 envs, the look-back in windows of 4 (several per row), in one window, and with zeroed flags.
SPLITS = {
    "two-pass": lambda form, bt: Plan(1, bt, 4, form, Split.TWO_PASS),
    "two-pass-cpb2": lambda form, bt: Plan(1, bt, 4, form, Split.TWO_PASS, chunks_per_block=2),
    "two-pass-envs4": lambda form, bt: Plan(4, bt, 8, form, Split.TWO_PASS),
    "lookback-w4": lambda form, bt: Plan(1, bt, 4, form, Split.LOOKBACK, window=4),
    "lookback-w64": lambda form, bt: Plan(1, bt, 4, form, Split.LOOKBACK, window=64),
    "lookback-zeroed": lambda form, bt: Plan(1, bt, 4, form, Split.LOOKBACK, window=4, epochs=False),
}
SHAPES = {"two-pass": [(5, 100), (1, 300)], "two-pass-envs4": [(5, 100)]}  # default (1, 300): 10 blocks of 32 steps


def _cases():
    for fn in CALLS:
        for form in _forms(fn):
            for split, make in SPLITS.items():
                if form is Form.ENV_GROUPS:  # their scan is the single-pass one: one case, 13 blocks of 8 steps
                    if split == "lookback-w4":
                        yield pytest.param(fn, make(form, 8), 1, 100, id=f"{fn}-env_groups-lookback-w4-N1-T100")
                    continue
                for n, t in SHAPES.get(split, [(1, 300)]):
                    yield pytest.param(fn, make(form, 32), n, t, id=f"{fn}-{form.name.lower()}-{split}-N{n}-T{t}")


@pytest.mark.parametrize(("fn", "plan", "n", "t"), list(_cases()))
def test_multiblock_matches_reference(kernel_path, fn, plan, n, t):
    assert plans.cdiv(t, plan.bt) >= 4
    _matches_torch_path(fn, _inputs(n, t, kernel_path.device), plan)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("fn", ["gae", "gae_last", "gae_targets", "vtrace", "discounted", "lambda", "returns_adv"])
def test_16bit_inputs_in_groups_of_8(kernel_path, dtype, fn):
    """2-byte floats take 8-step groups where every thread holds a whole group; single pass over a row of one
    chunk (N4-T1100: 2048 steps, loop-free; N4-T2100: 4096 steps, or three 1024-step chunks for GAE), and
    multi-block (N1-T5000)."""
    kind = {"gae_last": "gae", "gae_targets": "gae", "discounted": "returns"}.get(fn, fn)
    kind = "returns_nv" if fn in ("lambda", "returns_adv") else kind
    for shape in [(4, 1100), (4, 2100), (1, 5000)]:
        assert plans.choose(kind, *shape, dtype).form is Form.GROUPS8
        x = {k: v.to(dtype) if v.is_floating_point() else v for k, v in _inputs(*shape, kernel_path.device).items()}
        got = CALLS[fn](x)
        with R.use_backend("torch"):
            want = CALLS[fn]({k: v.cpu().double() if v.is_floating_point() else v.cpu() for k, v in x.items()})
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == dtype
            torch.testing.assert_close(g.cpu().double(), w, atol=5e-2, rtol=2e-2)
        if kernel_path.name != "interpret":  # the interpreter casts to bfloat16 toward zero
            if fn == "gae_targets":  # the value targets as the caller's add rounds them
                assert torch.equal(got[1], got[0] + x["v"])
            if fn == "returns_adv":
                assert torch.equal(got[1], got[0] - x["v"])


def _split(kind, n, t, dtype=torch.float32):
    p = plans.choose(kind, n, t, dtype)
    blocks = plans.cdiv(plans.cdiv(t, p.bt), p.chunks_per_block) if p.split is Split.TWO_PASS else plans.cdiv(t, p.bt)
    return p.bt, p.split, blocks if p.split is not Split.SINGLE else 1, p.window, p.maxnreg


def test_long_row_plans():
    """Rows of one chunk up to the kind's one-chunk limit (2048 steps for GAE, 4096 for the others), longer ones
    walked in 1024-step chunks (the forward scans' 2-byte rows in 2048-step chunks of 4 warps); long rows of few
    envs split into time blocks: look-back blocks of 2048 steps for GAE and the traces (4096-step ones, and two
    passes for the traces, in launches of few blocks), register caps on float32 look-back blocks (lower ones on rows
    of at least 128 blocks), zeroed flags past EPOCH_MAX_BLOCKS blocks, windows raised to sqrt(blocks)."""
    single = Split.SINGLE
    assert _split("gae", 4096, 512) == (512, single, 1, 1, 48)
    assert _split("gae", 4096, 2048)[:2] == (2048, single)
    assert _split("gae", 4096, 4096)[:2] == (1024, single)
    assert _split("vtrace", 4096, 4096)[:2] == (4096, single)
    assert _split("vtrace", 4096, 4097)[:2] == (1024, single)
    assert _split("gae", 1, 1 << 20) == (4096, Split.LOOKBACK, 256, 256, None)  # small launch: one window
    assert _split("gae", 4, 1 << 20) == (2048, Split.LOOKBACK, 512, 64, 72)
    assert _split("gae", 1, 1 << 24) == (2048, Split.LOOKBACK, 8192, 128, 72)  # 64 raised to sqrt(8192)
    assert _split("vtrace", 1, 1 << 24) == (1024, Split.LOOKBACK, 16384, 128, 72)
    assert _split("vtrace", 1, 1 << 20)[4] == 72  # rows of at least 128 blocks: a lower cap
    assert _split("vtrace", 256, 1 << 16)[3:] == (64, 80)  # 64 blocks per row: the policy's cap
    for dtype in (torch.bfloat16, torch.float16):  # 2-byte V-trace keeps windows of 256
        assert _split("vtrace", 1, 1 << 24, dtype)[3:] == (256, 80)
    assert _split("returns", 16, 1 << 20)[4] == 64
    assert _split("returns", 1, 1 << 20) == (2048, Split.LOOKBACK, 512, 128, None)
    assert _split("returns_nv", 1, 1 << 20) == (2048, Split.LOOKBACK, 512, 256, None)
    assert _split("returns_nv", 16, 1 << 20)[4] == 72
    assert _split("returns_nv", 256, 1 << 16)[3:] == (32, 80)  # 32 blocks per row: the policy's cap
    assert _split("forward", 1, 1 << 20) == (1024, Split.TWO_PASS, 1024, 1, None)
    assert _split("forward", 4, 1 << 20) == (1024, Split.TWO_PASS, 1024, 1, None)  # 2048 blocks: still two passes
    assert _split("forward", 8, 1 << 20) == (2048, Split.LOOKBACK, 512, 128, 64)  # 4096 blocks
    assert _split("forward", 256, 1 << 16)[3:] == (32, 72)
    assert _split("gae", 16, 1 << 20, torch.float64)[4] is None  # caps measured with float32 only
    assert _split("gae", 16, 1 << 20, torch.bfloat16)[4] is None
    assert _split("vtrace", 16, 1 << 20, torch.bfloat16)[4] == _split("forward", 16, 1 << 20, torch.bfloat16)[4] == 80
    assert _split("returns", 64, 1 << 18, torch.bfloat16)[4] == _split("returns", 1, 1 << 24, torch.bfloat16)[4] == 64
    assert plans.choose("retrace", 16, 1 << 20, torch.float32, num_actions=4).maxnreg == 128
    assert plans.choose("gae", 1, 1 << 20, torch.float32).epochs
    assert not plans.choose("gae", 1, 1 << 24, torch.float32).epochs  # 8192 blocks: zeroed flags
    assert not plans.choose("gae", 16, 1 << 20, torch.float32).epochs
    assert plans.choose("vtrace", 4096, 4096, torch.float32).warps == 16
    assert plans.choose("returns_nv", 4096, 4096, torch.float32).warps == 8
    bf16 = plans.choose("gae", 4096, 4096, torch.bfloat16)
    assert (bf16.bn, bf16.bt, bf16.warps) == (1, 4096, 8)  # 2-byte floats: one 4096-step chunk
    for dtype in (torch.bfloat16, torch.float16):
        walked = [plans.choose("forward", n, t, dtype) for n, t in ((1024, 8192), (512, 16384), (2048, 4097))]
        assert {(p.bn, p.bt, p.warps, p.split) for p in walked} == {(1, 2048, 4, single)}
        assert plans.choose("returns", 1024, 8192, dtype).bt == 1024  # only the forward scans: the others lost
    assert plans.choose("forward", 1024, 8192, torch.float32).bt == 1024
    assert plans.choose("forward", 4096, 4096, torch.bfloat16).bt == 4096  # rows of one chunk keep it


def test_single_pass_register_caps():
    """Single-pass caps where they were measured: GAE in one-chunk programs of 512 or 1024 steps and 4 warps,
    V-trace in one-chunk programs of 2048 steps (and 4096 in 2-byte dtypes), TD(lambda) in 2-byte programs of
    4096 steps, Retrace with 3-4 actions walking 1024-step chunks; float32 and 2-byte dtypes only (2-byte rows of
    512 steps take one-env programs of 2 warps: GAE's uncapped, V-trace's at 72); programs that test late take the
    cap of plans._LATE."""

    def gae(n, t, dtype=torch.float32):
        return plans.choose("gae", n, t, dtype).maxnreg

    def retrace(n, t, a=4, dtype=torch.float32):
        return plans.choose("retrace", n, t, dtype, num_actions=a).maxnreg

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert gae(8192, 1024, dtype) == gae(64, 1000, dtype) == 48
        assert gae(16384, 512, dtype) == gae(64, 300, dtype) == (48 if dtype == torch.float32 else None)
        assert retrace(4096, 2048, 4, dtype) == retrace(8, 1100, 3, dtype) == 64
    assert gae(16384, 512, torch.float64) is retrace(4096, 2048, 4, torch.float64) is None
    assert gae(4096, 2048) is gae(16384, 256) is gae(1024, 8) is None
    assert plans.choose("vtrace", 16384, 512, torch.float32).maxnreg is None
    assert plans.choose("vtrace", 16384, 512, torch.bfloat16).maxnreg == 72
    for dtype in (torch.float32, torch.bfloat16):  # V-trace's one-chunk rows: 2048 steps, and 4096 in 2 bytes
        assert plans.choose("vtrace", 4096, 2048, dtype).maxnreg == 80
    assert plans.choose("vtrace", 8192, 4096, torch.bfloat16).maxnreg == 64
    assert plans.choose("vtrace", 8192, 4096, torch.float32).maxnreg is None
    assert plans.choose("returns_nv", 8192, 4096, torch.bfloat16).maxnreg == 64  # TD(lambda) in 2 bytes
    assert plans.choose("returns_nv", 8192, 4096, torch.float32).maxnreg == 64  # the late test's cap
    assert plans.choose("forward", 8192, 4096, torch.bfloat16).maxnreg is None  # a cap of 64 lost there
    assert plans.choose("returns", 16384, 512, torch.float32).maxnreg is None
    assert retrace(16384, 512, 4, torch.bfloat16) is retrace(16384, 512, 4, torch.float32) is None  # lost there
    assert retrace(4096, 1024, 4, torch.bfloat16) is None  # one 1024-step chunk: not measured
    assert retrace(4096, 2048, 8) is retrace(4096, 2048, 18) is retrace(4096, 2048, 2) is None
    assert retrace(1 << 20, 8, 4, torch.bfloat16) is None


def test_time_major_lookback_caps():
    """Time-major look-back blocks take a cap where it measured faster (V-trace float32 128, TD(lambda) 72 float32
    and 64 2-byte, GAE 64 2-byte), only in launches of at least _TM_CAP_MIN_BLOCKS blocks; no other split or kind."""

    def cap(kind, n, t, dtype=torch.float32):
        plan = plans.choose(kind, n, t, dtype, time_major=True)
        return plan.split, plan.maxnreg

    lookback = Split.LOOKBACK
    assert cap("vtrace", 4096, 2048) == cap("vtrace", 1024, 8192) == (lookback, 128)  # 4096 blocks
    assert cap("returns_nv", 8192, 4096) == (lookback, 72)
    for dtype in (torch.bfloat16, torch.float16):
        assert cap("returns_nv", 4096, 2048, dtype) == cap("gae", 4096, 2048, dtype) == (lookback, 64)
    assert cap("gae", 4096, 2048) == cap("vtrace", 256, 1 << 16, torch.bfloat16) == (lookback, None)
    assert cap("vtrace", 4096, 2048, torch.bfloat16) == (Split.TWO_PASS, None)
    assert cap("returns_nv", 64, 512) == cap("vtrace", 64, 512) == (lookback, None)  # 16 blocks: no cap
    assert cap("returns_nv", 16384, 512)[1] is cap("gae", 64, 512, torch.float64)[1] is None  # not look-back


def test_caps_are_launch_options(monkeypatch):
    """A cap is Triton's maxnreg launch option (not a kernel argument) on single-pass and look-back launches,
    never on two passes (check_plan refuses one there); a ROCm build of PyTorch launches without any (Triton's
    AMD backend has no such option)."""
    from rl_triton.kernels import launch
    from rl_triton.ops import gae

    class Call:
        num_envs, seq_len, dtype, device, time_major = 64, 512, torch.float32, torch.device("cpu"), False

    def options(plan, t=512):
        call = Call()
        call.seq_len = t
        built = launch._build(gae.gae_kernel, plan, call, {}, False)
        return [c.get("maxnreg") for _grid, c, _warps in built.launches]

    capped = Plan(1, 512, 4, maxnreg=48)
    assert options(capped) == [48]
    assert options(dataclasses.replace(capped, split=Split.LOOKBACK, window=2), t=2048) == [48]
    assert options(dataclasses.replace(capped, split=Split.TWO_PASS), t=2048) == [None, None]
    monkeypatch.setattr(launch, "_CAPS", False)
    assert options(capped) == [None]


@pytest.mark.parametrize("shape", [(2, 1500), (2, 3000)], ids=["N2-T1500", "N2-T3000"])
@pytest.mark.parametrize("fn", list(CALLS))
def test_one_chunk_rows_match_reference(kernel_path, shape, fn):
    """Rows longer than a walked chunk but within a kernel's one-chunk limit (2048 steps for GAE, 4096 for the
    others) are one loop-free chunk (GAE at 3000 steps walks 1024-step chunks); against the PyTorch path."""
    _matches_torch_path(fn, _inputs(*shape, kernel_path.device))


def test_explicit_plans_are_checked(kernel_path):
    """A plan the kernels cannot run raises a ValueError that names the plan and says why."""
    x = _inputs(1, 300, kernel_path.device)
    bad = [
        Plan(1, 32, 4, Form.ENV_GROUPS),  # env-major groups serve chunks of <= 8 steps
        Plan(1, 32, 4, split=Split.LOOKBACK, window=2),  # 10 blocks need windows of 4
        Plan(1, 32, 4, exact_t=True),  # rows of 300 steps, not 32
        Plan(3, 32, 4),  # bn a power of two
        Plan(1, 32, 4, split=Split.TWO_PASS, chunks_per_block=0),
        Plan(1, 32, 4, split=Split.TWO_PASS, chunks_per_block=2, maxnreg=64),  # two passes take no cap
    ]
    for plan in bad:
        with pytest.raises(ValueError, match="cannot launch gae"):
            CALLS["gae"](x, plan)
    with pytest.raises(ValueError, match="plain tiles"):
        CALLS["traces"](x, Plan(1, 32, 4, Form.GROUPS4))
    tm = {k: v.T.contiguous().T for k, v in _inputs(3, 300, kernel_path.device).items() if k in ("r", "v", "term")}
    with pytest.raises(ValueError, match="does not divide the 3 envs"):  # time-major rows read as (N, T) views
        R.compute_gae(tm["r"], tm["v"], tm["term"], gamma=0.99, lambda_=0.9, plan=Plan(32, 64, 4, env_div=8))
    miscompiled = Plan(32, 64, 8, Form.GROUPS4, split=Split.LOOKBACK, window=16)  # TD(lambda) look-back in 8 warps
    r, v = (tm[k].float().T.contiguous().T for k in "rv")
    with pytest.raises(ValueError, match="miscompiles"):
        R.compute_lambda_returns(r, v, tm["term"], gamma=0.99, lambda_=0.9, plan=miscompiled)
