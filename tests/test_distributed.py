"""rl_triton.distributed: moments and advantage normalisation over all ranks of a process group.

The two-process cases run in one ``torch.multiprocessing`` spawn of two gloo workers on the CPU (a
module-scoped fixture, a few seconds), which write their results to files; the tests compare them with
float64 statistics of the concatenation of both ranks' valid entries. The one-process cases run a
gloo group of one in this process.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rl_triton.distributed import (
    DEFAULT_EPS,
    _fold_moments,
    combine_moments,
    global_moments,
    local_moments,
    normalize_advantages,
)

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")

WORLD = 2


def _ref_moments(xs, masks):
    """float64 (count, mean, m2) of the valid entries of all shards, by a plain loop over them."""
    vals = []
    for x, m in zip(xs, masks, strict=True):
        x64 = x.double().reshape(-1)
        keep = torch.ones_like(x64, dtype=torch.bool) if m is None else m.to(torch.bool).expand_as(x).reshape(-1)
        vals += [float(v) for v, k in zip(x64, keep, strict=True) if k]
    n = len(vals)
    mean = sum(vals) / n if n else 0.0
    m2 = sum((v - mean) ** 2 for v in vals)
    return n, mean, m2


def _ref_normalize(x, n, mean, m2, unbiased, eps=DEFAULT_EPS):
    var = m2 / max(n - 1 if unbiased else n, 1)
    return (x.double() - mean) / max(math.sqrt(var), eps)


def _make_cases():
    """Per-rank inputs: (name, [x_rank0, x_rank1], [mask_rank0, mask_rank1])."""
    g = torch.Generator().manual_seed(1234)

    def rnd(*shape, dtype=torch.float32, loc=0.0, scale=1.0):
        return (loc + scale * torch.randn(*shape, generator=g, dtype=torch.float64)).to(dtype)

    def bern(*shape, p=0.6):
        return torch.rand(*shape, generator=g) < p

    poisoned = rnd(4, 6)
    poisoned[0, 0], poisoned[1, 2] = float("nan"), float("inf")
    cases = [
        ("uneven-f32", [rnd(37), rnd(5, 11)], [None, None]),
        ("uneven-masked-f32", [rnd(3, 40), rnd(7, 9)], [bern(3, 40), bern(7, 9)]),
        (
            "uneven-f64-offset",
            [rnd(50, dtype=torch.float64, loc=1e4), rnd(3, dtype=torch.float64, loc=1e4)],
            [None, None],
        ),
        (
            "masked-f64-broadcast",
            [rnd(6, 30, dtype=torch.float64), rnd(2, 8, dtype=torch.float64)],
            [bern(6, 1), bern(1, 8)],
        ),
        # rank 1 has no valid entry, and garbage (NaN, inf) where its mask is false
        ("rank1-empty", [rnd(8, 13, scale=3.0), poisoned], [bern(8, 13), torch.zeros(4, 6, dtype=torch.bool)]),
        # rank 0 empty: the fold starts from an empty triple
        ("rank0-empty", [rnd(0), rnd(9, 7, loc=-2.0)], [None, bern(9, 7)]),
        ("bf16", [rnd(64, dtype=torch.bfloat16, loc=0.5), rnd(16, 3, dtype=torch.bfloat16)], [None, bern(16, 3)]),
        (
            "one-valid",
            [rnd(5), rnd(4)],
            [torch.tensor([False, False, True, False, False]), torch.zeros(4, dtype=torch.bool)],
        ),
        ("all-empty", [rnd(5), rnd(0)], [torch.zeros(5, dtype=torch.bool), None]),
    ]
    return cases


def _worker(rank, world, init_file, cases_file, out_dir):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        group = dist.group.WORLD
        results = {}
        for name, xs, masks in torch.load(cases_file):
            x, m = xs[rank], masks[rank]
            count, mean, m2 = global_moments(x, m, process_group=group)
            results[name] = {
                "moments": (count, mean, m2),
                "norm_unbiased": normalize_advantages(x, m, process_group=group),
                "norm_population": normalize_advantages(x, m, process_group=group, unbiased=False, eps=1e-4),
            }
        # combine_moments on its own: float32 and float64 triples, an empty rank with a NaN mean.
        for dtype in (torch.float32, torch.float64):
            if rank == 0:
                t = (torch.tensor(3.0, dtype=dtype), torch.tensor(1.5, dtype=dtype), torch.tensor(2.0, dtype=dtype))
            else:
                t = (
                    torch.tensor(0.0, dtype=dtype),
                    torch.tensor(float("nan"), dtype=dtype),
                    torch.tensor(float("nan"), dtype=dtype),
                )
            results[f"combine-empty-{dtype}"] = combine_moments(*t, process_group=group)
            t = (
                torch.tensor(2.0 + rank, dtype=dtype),
                torch.tensor(rank - 1.0, dtype=dtype),
                torch.tensor(0.5 * rank, dtype=dtype),
            )
            results[f"combine-{dtype}"] = combine_moments(*t, process_group=group)
        # elementwise moments of (n_r, 3) shards, per column
        cols = torch.load(cases_file.replace("cases", "columns"))[rank]
        c = torch.full((3,), float(cols.shape[0]), dtype=torch.float64)
        mu = cols.mean(0)
        results["columns"] = combine_moments(c, mu, (cols - mu).square().sum(0), process_group=group)
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Runs every two-process case once; returns (cases, [results_rank0, results_rank1])."""
    d = tmp_path_factory.mktemp("dist")
    cases = _make_cases()
    torch.save(cases, d / "cases.pt")
    g = torch.Generator().manual_seed(99)
    columns = [
        torch.randn(5, 3, generator=g, dtype=torch.float64),
        3 + torch.randn(12, 3, generator=g, dtype=torch.float64),
    ]
    torch.save(columns, d / "columns.pt")
    mp.start_processes(
        _worker,
        args=(WORLD, str(d / "init"), str(d / "cases.pt"), str(d)),
        nprocs=WORLD,
        join=True,
        start_method="spawn",
    )
    results = [torch.load(d / f"rank{r}.pt") for r in range(WORLD)]
    return {name: (xs, masks) for name, xs, masks in cases} | {"columns": columns}, results


CASE_TOL = {  # per input dtype: (rtol of the moments, atol of the normalised values)
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-12, 1e-10),
    torch.bfloat16: (1e-5, 2e-2),  # moments accumulate in float32 from the bf16 values; the output is rounded to bf16
}


@pytest.mark.parametrize(
    "name",
    [
        "uneven-f32",
        "uneven-masked-f32",
        "uneven-f64-offset",
        "masked-f64-broadcast",
        "rank1-empty",
        "rank0-empty",
        "bf16",
        "one-valid",
        "all-empty",
    ],
)
def test_two_ranks_match_concatenation(two_ranks, name):
    cases, results = two_ranks
    xs, masks = cases[name]
    n, mean, m2 = _ref_moments(xs, masks)
    rtol, atol = CASE_TOL[xs[0].dtype]
    acc = torch.float64 if xs[0].dtype == torch.float64 else torch.float32
    for rank in range(WORLD):
        count, mu, s = results[rank][name]["moments"]
        assert count.dtype == mu.dtype == s.dtype == acc
        assert count.item() == n
        assert mu.item() == pytest.approx(mean, rel=rtol, abs=rtol * (1 + abs(mean)))
        assert s.item() == pytest.approx(m2, rel=rtol, abs=rtol)
        for key, unbiased, eps in (("norm_unbiased", True, DEFAULT_EPS), ("norm_population", False, 1e-4)):
            out = results[rank][name][key]
            assert out.dtype == xs[rank].dtype and out.shape == xs[rank].shape
            ref = _ref_normalize(xs[rank], n, mean, m2, unbiased, eps)
            m = masks[rank]
            valid = torch.ones_like(ref, dtype=torch.bool) if m is None else m.expand_as(ref)
            finite_in = torch.isfinite(xs[rank].double())
            check = valid | finite_in  # the formula applies everywhere; garbage inputs stay garbage
            torch.testing.assert_close(out.double()[check], ref[check], rtol=rtol * 10, atol=atol)
    # every rank holds the same statistics, bit for bit
    for a, b in zip(results[0][name]["moments"], results[1][name]["moments"], strict=True):
        assert torch.equal(a, b)


def test_two_ranks_all_empty_is_zero_not_nan(two_ranks):
    _, results = two_ranks
    count, mean, m2 = results[0]["all-empty"]["moments"]
    assert (count.item(), mean.item(), m2.item()) == (0.0, 0.0, 0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_two_ranks_combine_moments(two_ranks, dtype):
    _, results = two_ranks
    for rank in range(WORLD):
        # rank 1 empty with NaN moments: rank 0's triple comes back unchanged
        count, mean, m2 = results[rank][f"combine-empty-{dtype}"]
        assert all(t.dtype == dtype for t in (count, mean, m2))
        assert (count.item(), mean.item(), m2.item()) == (3.0, 1.5, 2.0)
        # (2, -1, 0) and (3, 0, 0.5): n = 5, mean = -0.4, m2 = 0.5 + 1 * 2 * 3 / 5
        count, mean, m2 = results[rank][f"combine-{dtype}"]
        assert count.item() == 5.0
        assert mean.item() == pytest.approx(-0.4, rel=1e-6)
        assert m2.item() == pytest.approx(0.5 + 6 / 5, rel=1e-6)


def test_two_ranks_elementwise_moments(two_ranks):
    cases, results = two_ranks
    full = torch.cat(cases["columns"])
    for rank in range(WORLD):
        count, mean, m2 = results[rank]["columns"]
        assert count.tolist() == [17.0] * 3
        torch.testing.assert_close(mean, full.mean(0), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(m2, (full - full.mean(0)).square().sum(0), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- the fold on its own


@pytest.mark.parametrize("seed", range(3))
def test_fold_many_ranks_matches_concatenation(seed):
    """The rank-order fold over 7 shards (some empty, empty ones carrying NaN) gives the moments of the
    concatenation."""
    g = torch.Generator().manual_seed(seed)
    sizes = [int(s) for s in torch.randint(0, 20, (7,), generator=g)]
    sizes[0], sizes[3] = 0, 0
    shards = [torch.randn(s, generator=g, dtype=torch.float64) * 2 + 5 for s in sizes]
    triples = []
    for x in shards:
        c, mu, s = local_moments(x)
        if x.numel() == 0:
            mu, s = torch.tensor(float("nan"), dtype=torch.float64), torch.tensor(float("nan"), dtype=torch.float64)
        triples.append(torch.stack([c, mu, s]))
    n, mean, m2 = _fold_moments(torch.stack(triples))
    rn, rmean, rm2 = _ref_moments(shards, [None] * len(shards))
    assert n.item() == rn
    assert mean.item() == pytest.approx(rmean, rel=1e-12)
    assert m2.item() == pytest.approx(rm2, rel=1e-10)


# ----------------------------------------------------------------------------- one process


@pytest.fixture(params=["gloo", pytest.param("nccl", marks=pytest.mark.cuda)])
def group_of_one(request):
    """(group, device): a group of this process alone (the default group; gloo on the CPU, NCCL on the GPU),
    torn down afterwards."""
    if dist.is_initialized():
        pytest.skip("a default process group already exists in this process")
    backend = request.param
    if backend == "nccl" and not dist.is_nccl_available():
        pytest.skip("this PyTorch has no NCCL")
    device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
    kwargs = {"device_id": device} if backend == "nccl" else {}
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    try:
        yield dist.group.WORLD, device
    finally:
        dist.destroy_process_group()


def test_no_group_returns_inputs():
    t = (torch.tensor(4.0), torch.tensor(0.25), torch.tensor(3.0))
    out = combine_moments(*t)
    assert all(a is b for a, b in zip(out, t, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
def test_group_of_one_is_bit_identical(group_of_one, dtype, masked):
    group, device = group_of_one
    g = torch.Generator().manual_seed(7)
    x = (torch.randn(13, 29, generator=g, dtype=torch.float64) * 3 + 1).to(dtype).to(device)
    m = (torch.rand(13, 29, generator=g) < 0.7).to(device) if masked else None
    local = local_moments(x, m)
    combined = combine_moments(*local, process_group=group)
    for a, b in zip(local, combined, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)
    for unbiased in (True, False):
        ref = normalize_advantages(x, m, unbiased=unbiased)
        out = normalize_advantages(x, m, process_group=group, unbiased=unbiased)
        assert out.dtype == dtype and torch.equal(out, ref)


def test_group_of_one_combine_keeps_dtypes(group_of_one):
    group, device = group_of_one
    t = (
        torch.tensor(7, dtype=torch.int64),
        torch.tensor(0.1, dtype=torch.float32),
        torch.tensor(1 / 3, dtype=torch.float64),
    )
    t = tuple(x.to(device) for x in t)
    out = combine_moments(*t, process_group=group)
    for a, b in zip(t, out, strict=True):
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.cuda
def test_cuda_no_host_sync():
    """Moments, the fold and the normalisation queue on the GPU without a host synchronisation (the
    collective itself is NCCL's business and is left out)."""
    x = torch.randn(64, 300, device="cuda")
    m = torch.rand(64, 300, device="cuda") < 0.5
    gathered = torch.stack(
        [torch.stack(local_moments(x, m)).double(), torch.zeros(3, device="cuda", dtype=torch.float64)]
    )
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        local_moments(x, m)
        local_moments(x.half())
        normalize_advantages(x, m)
        _fold_moments(gathered)
    finally:
        torch.cuda.set_sync_debug_mode(previous)


# ----------------------------------------------------------------------------- local semantics


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_local_matches_reference_and_torchrl(dtype):
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(8, 50, generator=g, dtype=torch.float64) * 2 - 1).to(dtype)
    n, mean, m2 = _ref_moments([x], [None])
    ref = _ref_normalize(x, n, mean, m2, unbiased=True)
    out = normalize_advantages(x)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(out.double(), ref, rtol=tol, atol=tol)
    torchrl_utils = pytest.importorskip("torchrl._utils")
    torch.testing.assert_close(out, torchrl_utils._standardize(x), rtol=tol, atol=tol)


def test_local_masked_ignores_garbage():
    x = torch.tensor([1.0, 2.0, float("nan"), 4.0, float("inf")])
    m = torch.tensor([1, 1, 0, 1, 0], dtype=torch.uint8)
    count, mean, m2 = local_moments(x, m)
    assert count.item() == 3.0 and mean.item() == pytest.approx(7 / 3)
    assert m2.item() == pytest.approx((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2)


def test_errors():
    with pytest.raises(TypeError, match="floating-point"):
        local_moments(torch.arange(4))
    with pytest.raises(ValueError, match="does not broadcast"):
        local_moments(torch.randn(3, 4), torch.ones(5, dtype=torch.bool))
