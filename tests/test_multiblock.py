"""Multi-block scans (rows split into time blocks), forced on small shapes (32-step chunks, every row
split) so the interpreter and the GPU exercise them, against the PyTorch path in float64: the
two-pass form (an aggregate pass, then a pass that folds the aggregates before each block and
rescans it) and the one-pass look-back (one env per program; windows of 4 blocks so that the fold of
the aggregates of earlier windows is exercised, or one window); blocks of one walked chunk or of two
(the longer blocks some kernels take, launch._SPLIT_POLICY), loop-free or walked."""

import pytest
import torch

import rl_triton as R
from rl_triton.functional import gae_with_next_values, returns_with_advantages
from rl_triton.kernels import launch


@pytest.fixture(params=["plain", "grouped", "env-major"])
def tile_form(monkeypatch, request):
    """The tile forms of kernels/core.py for the kernels that have a choice (GAE, V-trace, returns;
    Retrace: plain or group-major)."""
    group = {"plain": lambda tiles, dtype: 0, "grouped": launch._group_major, "env-major": lambda tiles, dtype: -4}
    monkeypatch.setattr(launch, "_group", group[request.param])
    monkeypatch.setattr(launch, "_grouped", lambda tiles: request.param == "grouped")
    return request.param


@pytest.fixture
def force_blocks(monkeypatch, request):
    min_chunks, per_block, window, one, factor = request.param
    monkeypatch.setattr(launch, "_ONE_CHUNK_BLOCKS", one)  # loop-free blocks of one chunk
    monkeypatch.setattr(launch, "_MIN_CHUNKS_FOR_SPLIT", min_chunks)
    monkeypatch.setattr(launch, "_MIN_CHUNKS_PER_BLOCK", per_block)
    monkeypatch.setattr(launch, "_TARGET_PROGRAMS", 4096)
    monkeypatch.setattr(launch, "_MAX_BT", 32)
    # every row walked in 32-step chunks; blocks of `factor` walked chunks (64 steps: one env per program)
    monkeypatch.setattr(launch, "_ONE_CHUNK_FACTOR", factor)
    monkeypatch.setattr(launch, "_SPLIT_FACTOR", factor)
    monkeypatch.setattr(launch, "_LOOKBACK", window is not None)
    if window is not None:
        monkeypatch.setattr(launch, "_BLOCK", 32)  # one env per program
        monkeypatch.setattr(launch, "_LOOKBACK_WINDOW", window)
    return request.param


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


CALLS = {
    "gae": lambda x: R.compute_gae(
        x["r"], x["v"], x["term"], x["trunc"], gamma=0.99, lambda_=0.95, bootstrap_values=x["boot"]
    ),
    "gae_last": lambda x: R.compute_gae(x["r"], x["v"], x["term"], gamma=0.99, lambda_=0.9, last_value=x["last"]),
    "gae_targets": lambda x: gae_with_next_values(
        x["r"], x["v"], x["nv"], x["term"], x["term"] | x["trunc"], gamma=0.99, lambda_=0.95, targets=True
    ),
    "vtrace": lambda x: R.compute_vtrace(
        x["lpt"], x["lpb"], x["v"], x["r"], x["term"], x["trunc"], gamma=0.99, bootstrap_values=x["boot"]
    ),
    "retrace": lambda x: R.compute_retrace(
        x["probs"], x["mu"], x["v"], x["nq"], x["act"], x["r"], x["term"], x["trunc"], gamma=0.99, lambda_=0.9
    ),
    "discounted": lambda x: R.compute_discounted_returns(
        x["r"], x["term"], x["trunc"], gamma=0.99, bootstrap_values=x["boot"]
    ),
    "lambda": lambda x: R.compute_lambda_returns(
        x["r"], x["nv"], x["term"], x["trunc"], gamma=0.99, lambda_=0.9, bootstrap_values=x["boot"]
    ),
    "returns_adv": lambda x: returns_with_advantages(
        x["r"], x["v"], x["term"], x["trunc"], gamma=0.99, lambda_=0.9, next_values=x["nv"], bootstrap_values=x["boot"]
    ),
    "traces": lambda x: R.compute_eligibility_traces(x["r"], x["term"], gamma=0.99, lambda_=0.9, seed_values=x["last"]),
    "prefix": lambda x: R.compute_episodic_prefix_sum(x["r"], x["term"], seed_values=x["last"]),
    "prefix_starts": lambda x: R.compute_episodic_prefix_sum(x["r"], x["term"], boundary="starts_at"),
}


def _matches_torch_path(fn, x):
    """CALLS[fn] on ``x`` (float64 inputs) equals the PyTorch path's result to 1e-10."""
    got = CALLS[fn](x)
    with R.use_backend("torch"):
        want = CALLS[fn]({k: v.cpu() for k, v in x.items()})
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.cpu(), w, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    "force_blocks",
    [
        (2, 1, None, False, 1),
        (2, 1, None, True, 1),
        (2, 1, None, True, 2),
        (2, 2, None, False, 1),
        (2, 1, 4, False, 1),
        (2, 1, 4, True, 1),
        (2, 1, 4, True, 2),
        (2, 1, 64, False, 1),
    ],  # fmt: skip
    indirect=True,
    ids=[
        "cpb1",
        "cpb1-one",
        "cpb1-one-x2",
        "cpb2",
        "lookback-w4",
        "lookback-w4-one",
        "lookback-w4-one-x2",
        "lookback-w64",
    ],  # fmt: skip
)
@pytest.mark.parametrize("shape", [(1, 300), (3, 449), (5, 100), (2, 1031)], ids=lambda s: f"N{s[0]}-T{s[1]}")
@pytest.mark.parametrize("fn", list(CALLS))
def test_multiblock_matches_reference(path, force_blocks, tile_form, shape, fn):
    if not path.is_kernel:
        pytest.skip("multi-block scans are a kernel-path feature")
    window = force_blocks[2]
    if (tile_form == "env-major" and (force_blocks[1] > 1 or window == 64)) or (tile_form == "plain" and window == 64):
        pytest.skip("combination covered by the others (env-major tiles serve single-chunk rows in production)")
    if force_blocks[3] and tile_form == "env-major":
        pytest.skip("loop-free blocks: plain and group-major tiles keep CI short")
    if fn in ("gae_targets", "returns_adv") and tile_form != "grouped":
        pytest.skip("the second output's store is the same in every tile form: group-major keeps CI short")
    forward = fn in ("traces", "prefix", "prefix_starts")
    if (forward and tile_form != "plain") or (fn == "retrace" and tile_form == "env-major"):
        pytest.skip("the same kernel as the plain form (forward kernels have one tile form; Retrace two)")
    if force_blocks[4] > 1 and ((tile_form == "plain" and not forward) or shape[1] > 500):
        pytest.skip(
            "longer blocks: the group-major form the reverse recurrences take there and short rows keep CI short"
        )
    if window is not None and shape[0] != 1 and shape[1] != 449:
        pytest.skip("look-back: N1-T300 and N3-T449 (10 and 15 blocks, several windows of 4) keep CI short")
    x = _inputs(*shape, path.device)
    tiles = launch._tiles(*shape)
    assert launch._time_blocks(-(-shape[0] // tiles.bn), -(-shape[1] // tiles.bt))[0] > 1
    _matches_torch_path(fn, x)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("fn", ["gae", "gae_last", "gae_targets", "vtrace", "discounted", "lambda", "returns_adv"])
def test_16bit_inputs_in_groups_of_8(path, dtype, fn):
    """2-byte floats take 8-step groups where every thread holds a whole group; single pass over a
    row of one chunk (N4-T1100: 2048 steps, loop-free; N4-T2100: 4096 steps, or three 1024-step chunks
    for GAE), and multi-block (N1-T5000)."""
    if not path.is_kernel:
        pytest.skip("tile forms are a kernel-path feature")
    kinds = {"gae_last": "gae", "gae_targets": "gae", "discounted": "returns", "lambda": "returns_nv"}
    kinds["returns_adv"] = "returns_nv"
    kind = kinds.get(fn, fn)
    for shape in [(4, 1100), (4, 2100), (1, 5000)]:
        assert launch._group(launch.scan_layout(kind, *shape).tiles, dtype) == 8
        x = {k: v.to(dtype) if v.is_floating_point() else v for k, v in _inputs(*shape, path.device).items()}
        got = CALLS[fn](x)
        with R.use_backend("torch"):
            want = CALLS[fn]({k: v.cpu().double() if v.is_floating_point() else v.cpu() for k, v in x.items()})
        got = got if isinstance(got, tuple) else (got,)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == dtype
            torch.testing.assert_close(g.cpu().double(), w, atol=5e-2, rtol=2e-2)
        if path.name != "interpret":  # the interpreter casts to bfloat16 toward zero
            if fn == "gae_targets":  # the value targets as the caller's add rounds them
                assert torch.equal(got[1], got[0] + x["v"])
            if fn == "returns_adv":
                assert torch.equal(got[1], got[0] - x["v"])


def _phases(kind, kernel, n, t):
    layout = launch.scan_layout(kind, n, t)
    plan = launch._scan_plan(kernel, n, torch.device("cpu"), {"ACC": None}, layout)
    return layout.tiles.bt, [(c["PHASE"], c["ONE"]) for _grid, c, _warps in plan.launches]


def test_launch_phases_follow_the_one_chunk_policy(monkeypatch):
    """Rows of one chunk run loop-free (ONE), up to the kernel's one-chunk limit (2048 steps for GAE,
    4096 for the others); longer rows walk 1024-step chunks, and long rows of few envs split into
    loop-free time blocks of one chunk (launch._SPLIT_POLICY: 2048-step look-back blocks for GAE
    and the forward traces; below _SMALL_BLOCKS blocks 4096-step ones for GAE and two passes over
    1024-step blocks for the traces); launch._ONE_CHUNK = False keeps the loop for every single pass."""
    from rl_triton.kernels import fused

    gae, vtrace, fwd = fused.gae_kernel, fused.vtrace_kernel, fused.forward_trace_kernel
    assert _phases("gae", gae, 4096, 512) == (512, [(0, True)])
    assert _phases("gae", gae, 4096, 2048) == (2048, [(0, True)])
    assert _phases("gae", gae, 4096, 4096) == (1024, [(0, False)])
    assert _phases("vtrace", vtrace, 4096, 4096) == (4096, [(0, True)])
    assert _phases("vtrace", vtrace, 4096, 4097) == (1024, [(0, False)])
    assert _phases("gae", gae, 1, 1 << 20) == (4096, [(5, True)])  # look-back by program id, epoch flags
    assert _phases("gae", gae, 1, 1 << 24) == (2048, [(4, True)])  # 8192 blocks: zeroed flags
    assert _phases("gae", gae, 16, 1 << 20) == (2048, [(4, True)])
    assert _phases("vtrace", vtrace, 16, 1 << 20) == (1024, [(4, True)])
    assert _phases("forward", fwd, 16, 1 << 20) == (2048, [(4, True)])
    assert _phases("forward", fwd, 1, 1 << 20) == (1024, [(1, True), (2, True)])
    assert launch.scan_layout("forward", 1, 1 << 20).nk == 1024  # one chunk per block
    assert launch.scan_layout("forward", 1, 1 << 24)[1:] == (8192, 1, True, 256, 72)
    assert launch.scan_layout("vtrace", 1, 1 << 24)[1:] == (16384, 1, True, 256, 80)  # register cap 80
    assert launch.scan_layout("gae", 1, 1 << 24)[1:] == (8192, 1, True, 128, 72)  # 64 raised to sqrt(8192)
    assert launch.scan_tiles("vtrace", 4096, 4096).warps == 16
    assert launch.scan_tiles("returns_nv", 4096, 4096).warps == 8
    assert launch.scan_tiles("gae", 4096, 4096, torch.bfloat16) == launch.Tiles(1, 4096, 8)  # 2-byte floats
    monkeypatch.setattr(launch, "_LOOKBACK_WINDOW", 16)  # 512 blocks a row: windows of 32, so at most 32 windows
    plan = launch._scan_plan(gae, 4, torch.device("cpu"), {"ACC": None}, launch.scan_layout("gae", 4, 1 << 20))
    assert plan.launches[0][1]["NKP"] == 32
    monkeypatch.setattr(launch, "_ONE_CHUNK", False)
    assert _phases("gae", gae, 4096, 512) == (512, [(0, False)])
    monkeypatch.setattr(launch, "_TICKET", True)
    assert _phases("gae", gae, 1, 1 << 20) == (4096, [(3, True)])
    monkeypatch.setattr(launch, "_LOOKBACK", False)
    assert _phases("gae", gae, 1, 1 << 20) == (4096, [(1, True), (2, True)])
    assert launch.scan_layout("forward", 1, 1 << 24)[1:] == (1024, 8, False, 1, None)  # at most 1024 blocks
    monkeypatch.setattr(launch, "_ONE_CHUNK_BLOCKS", False)  # blocks of several chunks, from _TARGET_PROGRAMS
    assert _phases("gae", gae, 16, 1 << 20) == (2048, [(1, False), (2, False)])
    assert launch.scan_layout("gae", 16, 1 << 20)[1:] == (64, 8, False, 1, None)


def test_lookback_register_caps(monkeypatch):
    """Look-back blocks of float32 inputs launch with _SPLIT_POLICY's register cap (Triton's maxnreg
    option, not a kernel argument) from _SMALL_BLOCKS blocks per launch on (GAE, the returns, TD(lambda)
    and the traces; V-trace and Retrace at any size); other dtypes, unmeasured, and the two-pass form
    without one; launch._MAXNREG overrides it (0: none)."""
    from rl_triton.kernels import fused

    def options(kind, kernel, n, t, dtype=torch.float32):
        layout = launch.scan_layout(kind, n, t, dtype)
        plan = launch._scan_plan(kernel, n, torch.device("cpu"), {"ACC": None}, layout)
        return [c.get("maxnreg") for _grid, c, _warps in plan.launches]

    gae, fwd = fused.gae_kernel, fused.forward_trace_kernel
    assert options("gae", gae, 16, 1 << 20) == [72]
    assert options("vtrace", fused.vtrace_kernel, 16, 1 << 20) == [80]
    assert options("returns", fused.returns_kernel, 16, 1 << 20) == [64]
    assert options("returns_nv", fused.returns_kernel, 16, 1 << 20) == [80]
    assert launch.retrace_layout(16, 1 << 20, 4, torch.float32).layout.maxnreg == 128
    assert options("gae", gae, 16, 1 << 20, torch.float64) == [None]
    assert options("gae", gae, 16, 1 << 20, torch.bfloat16) == [None]
    assert options("forward", fwd, 16, 1 << 20) == [72]
    assert options("forward", fwd, 1, 1 << 20) == [None, None]  # small launch: two passes
    assert options("gae", gae, 4096, 2048) == [None]  # single pass (test_single_pass_register_caps)
    assert options("gae", gae, 1, 1 << 20) == [None]  # 512 blocks: fewer than _SMALL_BLOCKS
    assert options("gae", gae, 4, 1 << 20) == [72]  # 2048 blocks
    assert options("vtrace", fused.vtrace_kernel, 1, 1 << 20) == [80]  # V-trace: capped at any size
    monkeypatch.setattr(launch, "_MAXNREG", 0)
    assert options("gae", gae, 16, 1 << 20) == [None]
    monkeypatch.setattr(launch, "_MAXNREG", 96)
    assert options("returns", fused.returns_kernel, 16, 1 << 20) == [96]


def test_single_pass_register_caps(monkeypatch):
    """Single-pass launches carry launch._SINGLE_CAPS' register caps where they were measured: GAE in
    one-chunk programs of 512 or 1024 steps and 4 warps, Retrace with 3-4 actions walking 1024-step chunks (and,
    for 2-byte dtypes, in rows of 512 steps); float32 and 2-byte dtypes only. launch._SINGLE_MAXNREG
    overrides them (0: none). A ROCm build of PyTorch launches without any cap (launch._CAPS)."""
    from rl_triton.kernels import fused

    def options(layout, kernel=fused.gae_kernel, n=64):
        plan = launch._scan_plan(kernel, n, torch.device("cpu"), {"ACC": None}, layout)
        return [c.get("maxnreg") for _grid, c, _warps in plan.launches]

    def gae(n, t, dtype=torch.float32):
        return options(launch.scan_layout("gae", n, t, dtype), n=n)

    def retrace(n, t, a=4, dtype=torch.float32):
        return options(launch.retrace_layout(n, t, a, dtype).layout, fused.retrace_kernel, n)

    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert gae(16384, 512, dtype) == gae(64, 300, dtype) == gae(8192, 1024, dtype) == gae(64, 1000, dtype) == [48]
        assert retrace(4096, 2048, 4, dtype) == retrace(8, 1100, 3, dtype) == [64]
    assert gae(16384, 512, torch.float64) == retrace(4096, 2048, 4, torch.float64) == [None]
    assert gae(4096, 2048) == gae(16384, 256) == gae(1024, 8) == [None]
    assert options(launch.scan_layout("vtrace", 16384, 512)) == [None]
    assert options(launch.scan_layout("returns", 16384, 512)) == [None]
    assert retrace(16384, 512, 4, torch.bfloat16) == [64]
    assert retrace(16384, 512, 4, torch.float32) == [None]  # float32 lost there
    assert retrace(4096, 1024, 4, torch.bfloat16) == [None]  # one 1024-step chunk: not measured
    assert retrace(4096, 2048, 8) == retrace(4096, 2048, 18) == retrace(4096, 2048, 2) == [None]
    assert retrace(1 << 20, 8, 4, torch.bfloat16) == [None]
    monkeypatch.setattr(launch, "_SINGLE_MAXNREG", 0)
    assert gae(16384, 512) == retrace(4096, 2048) == [None]
    monkeypatch.setattr(launch, "_SINGLE_MAXNREG", 96)
    assert gae(4096, 2048) == retrace(16384, 512) == [96]
    monkeypatch.setattr(launch, "_CAPS", False)  # a ROCm build: Triton's AMD backend has no maxnreg option
    assert gae(4096, 2048) == retrace(16384, 512) == [None]
    assert options(launch.scan_layout("gae", 16, 1 << 20), n=16) == [None]


def test_small_launch_policy(monkeypatch):
    """Launches of fewer than _SMALL_BLOCKS[kernel] time blocks (counted at _SPLIT_POLICY's block
    length) take _SMALL_SPLIT_POLICY's entry: GAE in 4096-step blocks and windows of up to 512, the
    traces in two passes of 1024-step blocks; from there on the main policy (2048-step look-back
    blocks for both). Layout fields after the tiles: (blocks, chunks per block, look-back, window,
    register cap; blocks and windows per row)."""

    def layout(kind, n, t):
        lay = launch.scan_layout(kind, n, t)
        return lay.tiles.bt, *lay[1:]

    assert layout("gae", 1, 1 << 20) == (4096, 256, 1, True, 256, None)  # one window: the row's 256 blocks
    assert layout("gae", 4, 1 << 20) == (2048, 512, 1, True, 64, 72)  # 2048 blocks in all
    assert layout("forward", 1, 1 << 20) == (1024, 1024, 1, False, 1, None)
    assert layout("forward", 4, 1 << 20) == (1024, 1024, 1, False, 1, None)  # 2048 blocks: still two passes
    assert layout("forward", 8, 1 << 20) == (2048, 512, 1, True, 256, 72)  # 4096 blocks
    assert layout("returns", 1, 1 << 20) == (2048, 512, 1, True, 128, None)
    assert layout("returns_nv", 1, 1 << 20) == (2048, 512, 1, True, 256, None)
    assert layout("vtrace", 1, 1 << 20) == (1024, 1024, 1, True, 256, 80)  # no small-launch entry
    monkeypatch.setattr(launch, "_SMALL_BLOCKS", {})
    assert layout("gae", 1, 1 << 20) == (2048, 512, 1, True, 64, 72)
    assert layout("forward", 1, 1 << 20) == (2048, 512, 1, True, 256, 72)


@pytest.mark.parametrize("shape", [(2, 1500), (2, 3000)], ids=["N2-T1500", "N2-T3000"])
@pytest.mark.parametrize("fn", list(CALLS))
def test_one_chunk_rows_match_reference(path, shape, fn):
    """Rows longer than a walked chunk but within a kernel's one-chunk limit (scan_tiles: 2048 steps
    for GAE, 4096 for the others) are one loop-free chunk (GAE at 3000 steps walks 1024-step chunks);
    against the PyTorch path in float64."""
    if not path.is_kernel:
        pytest.skip("tile policy of the kernel path")
    x = _inputs(*shape, path.device)
    _matches_torch_path(fn, x)


@pytest.mark.parametrize("force_blocks", [(2, 1, 4, True, 1)], indirect=True, ids=["lookback-w4-one"])
@pytest.mark.parametrize("fn", list(CALLS))
def test_lookback_numbered_by_ticket(path, monkeypatch, force_blocks, fn):
    """The look-back with blocks numbered by an atomic ticket instead of the program id (PHASE 3,
    launch._TICKET): 10 blocks of 32 steps in windows of 4."""
    if not path.is_kernel:
        pytest.skip("multi-block scans are a kernel-path feature")
    monkeypatch.setattr(launch, "_TICKET", True)
    layout = launch.scan_layout("gae", 1, 300)
    assert layout.lookback and layout.nk == 10
    _matches_torch_path(fn, _inputs(1, 300, path.device))
