"""The validation cache (``_validation.prepare``): a call whose signature (shapes, dtypes, devices,
which optional inputs are given) passed before skips the checks; anything else is validated in full."""

import pytest
import torch

import rl_triton as R
from rl_triton import _validation
from tests._helpers import kernel_paths


@pytest.fixture(autouse=True)
def _fresh_cache():
    _validation._CACHE.clear()
    yield
    _validation._CACHE.clear()


def _gae(r, v, term, **kw):
    return R.compute_gae(r, v, term, gamma=0.9, lambda_=0.8, **kw)


def test_hit_gives_the_same_result_as_a_miss():
    r, v = torch.randn(3, 7, dtype=torch.float64), torch.randn(3, 7, dtype=torch.float64)
    term = torch.rand(3, 7) < 0.2
    first = _gae(r, v, term)
    assert len(_validation._CACHE) == 1
    second = _gae(r, v, term)
    torch.testing.assert_close(first, second, rtol=0, atol=0)
    one_d = _gae(r[0], v[0], term[0])  # a different signature: validated, cached separately
    torch.testing.assert_close(one_d, first[0], rtol=1e-12, atol=1e-12)
    assert len(_validation._CACHE) == 2


def test_a_cached_signature_does_not_hide_errors_of_other_calls():
    r, v, term = torch.randn(3, 7), torch.randn(3, 7), torch.zeros(3, 7, dtype=torch.bool)
    _gae(r, v, term)
    with pytest.raises(ValueError, match="shape"):
        _gae(r, torch.randn(3, 6), term)
    with pytest.raises(TypeError, match="share one dtype"):
        _gae(r, v.double(), term)
    with pytest.raises(ValueError, match="shape"):
        _gae(r, v, term, last_value=torch.randn(4))
    with pytest.raises(TypeError, match="torch.Tensor"):
        _gae(r, v.tolist(), term)
    with pytest.raises(ValueError, match="gamma"):
        R.compute_gae(r, v, term, gamma=1.5, lambda_=0.8)
    with pytest.raises(ValueError, match="gamma"):
        R.compute_gae(r, v, term, gamma=float("nan"), lambda_=0.8)


def test_non_contiguous_and_cpu_actions_are_never_cached():
    r = torch.randn(7, 3).t()  # non-contiguous (3, 7)
    v, term = torch.randn(3, 7), torch.zeros(3, 7, dtype=torch.bool)
    _gae(r, v, term)
    _gae(r, v, term)
    assert not _validation._CACHE
    probs = torch.softmax(torch.randn(2, 5, 3), -1)
    args = (probs, torch.rand(2, 5) * 0.9 + 0.1, torch.randn(2, 5), torch.randn(2, 5, 3))
    flags = (torch.randn(2, 5), torch.zeros(2, 5, dtype=torch.bool), torch.zeros(2, 5, dtype=torch.bool))
    R.compute_retrace(*args, torch.randint(0, 3, (2, 5)), *flags, gamma=0.9, lambda_=0.9)
    with pytest.raises(ValueError, match="index the last dim"):  # the range check reads the values every call
        R.compute_retrace(*args, torch.full((2, 5), 3), *flags, gamma=0.9, lambda_=0.9)


@kernel_paths
def test_the_entry_keeps_its_launches(path):
    """On the kernel path a cached signature keeps the launches of its chosen plan, and of every explicit plan a
    call passed, each under its own key; the same plan given explicitly gives the same bits."""
    from rl_triton.kernels import launch, plans

    if not path.is_kernel:
        pytest.skip("launch plans belong to the kernel path")
    d = path.device
    r, v = torch.randn(3, 40, device=d), torch.randn(3, 40, device=d)
    term = torch.zeros(3, 40, dtype=torch.bool, device=d)
    first = _gae(r, v, term)
    (entry,) = _validation._CACHE.values()
    assert len(entry.plans) == 1 and all(isinstance(x, launch._Launch) for x in entry.plans.values())
    chosen = plans.choose("gae", 3, 40, torch.float32)
    again = _gae(r, v, term, plan=chosen)
    assert len(entry.plans) == 2 and any(chosen in key for key in entry.plans)
    torch.testing.assert_close(again, first, rtol=0, atol=0)


@pytest.mark.parametrize("one_d", [False, True], ids=["2d", "1d"])
def test_a_hit_hands_the_kernels_the_tensors_a_miss_does(one_d):
    """Same views (1-D calls get a leading env dim, per-env scalars too), same dtypes (bool flags
    stay bool), same storage, whether the signature was cached or not."""
    shape = (7,) if one_d else (3, 7)
    r, v = torch.randn(shape), torch.randn(shape)
    term, trunc = torch.rand(shape) < 0.2, (torch.rand(shape) < 0.2).to(torch.uint8)

    def prepare():
        return _validation.prepare(
            "compute_gae",
            steps={"rewards": r, "values": v, "bootstrap_values": None},
            flags={"terminateds": term, "truncateds": trunc},
            per_env={"last_value": torch.randn(shape[:-1])},
            required=("rewards", "values", "terminateds"),
        )

    miss, hit = prepare(), prepare()
    assert len(_validation._CACHE) == 1
    assert miss.tensors.keys() == hit.tensors.keys()
    for name, a in miss.tensors.items():
        b = hit.tensors[name]
        if a is None:
            assert b is None, name
            continue
        assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride()), name
        assert a.dim() == (1 if name == "last_value" else 2), name
    assert hit.tensors["terminateds"].dtype == torch.bool
    for name in ("rewards", "values", "terminateds", "truncateds"):
        assert hit.tensors[name].data_ptr() == miss.tensors[name].data_ptr()
    assert hit.like is hit.tensors["rewards"] and hit.new_output().shape == hit.tensors["rewards"].shape
