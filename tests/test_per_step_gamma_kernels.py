"""The kernels reading per-env and per-step ``gamma`` / ``lambda_`` tensors (docs/semantics.md, "Per-step gamma and
lambda"; ops/common.py, ``discount``), on the kernel paths, against the float64 loop references: rows split
into time blocks (two passes, the look-back in several windows and with zeroed flags) under explicit plans,
env-major rows of one chunk (Retrace's register shift of c_{t+1} included), time-major inputs with discounts in
either layout, per-env discounts as stride-0 views, and float and tensor calls alternating on one call signature
(the launch keys: a float call never picks up a tensor kernel, new values never add a launch)."""

import pytest
import torch

import rl_triton as R
from rl_triton import _validation
from rl_triton.kernels import launch as L
from rl_triton.kernels import plans
from rl_triton.kernels.plans import Form, Plan, Split
from tests import reference
from tests._helpers import F32_TOL, assert_close, call_unmutated, non_contiguous, valid_kwargs

NAMES = ["compute_gae", "compute_vtrace", "compute_retrace", "compute_discounted_returns", "compute_lambda_returns"]
HAS_LAMBDA = {"compute_gae", "compute_retrace", "compute_lambda_returns"}


def discount(n: int, t: int, form: str, device, dtype=torch.float32) -> torch.Tensor:
    """A gamma/lambda tensor: "env" (N,), "step" (N, T) contiguous, "step-T" the (N, T) view of a (T, N) tensor.
    Values in [0.3, 1] with exact 0s and 1s among them (a zero discount cuts the recursion)."""
    full = (n,) if form == "env" else (n, t) if form == "step" else (t, n)
    x = torch.rand(full, dtype=torch.float64) * 0.7 + 0.3
    x = torch.where(torch.rand(full) < 0.1, 0.0, x)
    x = torch.where(torch.rand(full) < 0.1, 1.0, x).to(dtype).to(device)
    return x.T if form == "step-T" else x


def with_discounts(name, kwargs, n, t, gamma_form, lambda_form, device):
    kwargs = dict(kwargs)
    if gamma_form:
        kwargs["gamma"] = discount(n, t, gamma_form, device)
    if lambda_form and name in HAS_LAMBDA:
        kwargs["lambda_"] = discount(n, t, lambda_form, device)
    return kwargs


def checked(name, kwargs, plan=None):
    """rl_triton.<name> (under ``plan``) against the float64 loop reference; returns the outputs as a tuple."""
    out = call_unmutated(getattr(R, name), **kwargs, **({} if plan is None else {"plan": plan}))
    ref = getattr(reference, name)(**kwargs)
    out, ref = (x if isinstance(x, tuple) else (x,) for x in (out, ref))
    like = kwargs["rewards"]
    for o, r in zip(out, ref, strict=True):
        assert_close(o, r, **F32_TOL, dtype=like.dtype, device=like.device)
    return out


# Rows split into time blocks of 32-step chunks (10 blocks of a 300-step row; 4 of 100 steps over blocks of 4
# envs): two passes, the look-back in windows of 4 (the fold of earlier windows' aggregates) and with flags zeroed
# per call. The discount forms rotate so that each split sees per-step, per-env (stride 0) and transposed views.
SPLITS = {
    "two-pass": ((1, 300), lambda form: Plan(1, 32, 4, form, Split.TWO_PASS)),
    "two-pass-envs4": ((5, 100), lambda form: Plan(4, 32, 8, form, Split.TWO_PASS)),
    "lookback-w4": ((1, 300), lambda form: Plan(1, 32, 4, form, Split.LOOKBACK, window=4)),
    "lookback-zeroed": ((1, 300), lambda form: Plan(1, 32, 4, form, Split.LOOKBACK, window=4, epochs=False)),
}
DISCOUNT_FORMS = [("step", "env"), ("env", "step"), ("step-T", "step-T")]


def _split_cases():
    i = 0
    for name in NAMES:
        for split in SPLITS:
            for form in (Form.PLAIN, Form.GROUPS4) if split in ("two-pass", "lookback-w4") else (Form.PLAIN,):
                forms = DISCOUNT_FORMS[i % len(DISCOUNT_FORMS)]
                i += 1
                yield pytest.param(name, split, form, forms, id=f"{name}-{split}-{form.name.lower()}-{'-'.join(forms)}")


@pytest.mark.parametrize("name, split, form, forms", list(_split_cases()))
def test_split_rows(kernel_path, name, split, form, forms):
    (n, t), make = SPLITS[split]
    plan = make(form)
    assert plans.cdiv(t, plan.bt) >= 4
    kwargs = with_discounts(name, valid_kwargs(name, (n, t), device=kernel_path.device), n, t, *forms,
                            kernel_path.device)  # fmt: skip
    out = checked(name, kwargs, plan)
    if plan.split is Split.LOOKBACK and plan.epochs:
        again = getattr(R, name)(**kwargs, plan=plan)  # the cached launch, its epochs advanced: the same bits
        for a, b in zip(out, again if isinstance(again, tuple) else (again,), strict=True):
            assert torch.equal(a, b)


@pytest.mark.parametrize("name", NAMES)
def test_env_groups(kernel_path, name):
    """Env-major groups of 4 steps: exact rows of one 8-step chunk (two env blocks, the second partial), and a
    100-step row in 13 look-back blocks of 8 steps."""
    for (n, t), plan in [
        ((5, 8), Plan(4, 8, 4, Form.ENV_GROUPS, Split.SINGLE, exact_t=True)),
        ((1, 100), Plan(1, 8, 4, Form.ENV_GROUPS, Split.LOOKBACK, window=4)),
    ]:
        kwargs = valid_kwargs(name, (n, t), device=kernel_path.device)
        checked(name, with_discounts(name, kwargs, n, t, "step", "step", kernel_path.device), plan)


@pytest.mark.parametrize("shift", [True, False], ids=["shift", "reload"])
def test_retrace_lambda_of_the_next_step(kernel_path, shift):
    """Retrace's carry at step t is gamma_t lambda_{t+1} min(c_bar, ratio_{t+1}): with c_{t+1} shifted in registers
    from the step's own tile (SHIFT, PI_TILE) and reloaded at t + 1, per-step lambda_ and per-env gamma."""
    n, t = 6, 8
    plan = Plan(4, 8, 4, Form.ENV_GROUPS, Split.SINGLE, exact_t=True, shift=shift, pi_tile=shift)
    kwargs = valid_kwargs("compute_retrace", (n, t), device=kernel_path.device)
    kwargs = with_discounts("compute_retrace", kwargs, n, t, "env", "step", kernel_path.device)
    checked("compute_retrace", kwargs, plan)
    # lambda_ read at t + 1: a change at step 0 alone leaves every output as it was (c_0 is never read)
    lam = kwargs["lambda_"].clone()
    lam[:, 0] = 1.0 - lam[:, 0]
    out = R.compute_retrace(**kwargs, plan=plan)
    moved = R.compute_retrace(**dict(kwargs, lambda_=lam), plan=plan)
    for a, b in zip(out, moved, strict=True):
        assert torch.equal(a, b)


def _time_major(x):
    """The same values as (N, T) views of (T, N) tensors, (N, T, A) views of (T, N, A) ones."""
    if isinstance(x, torch.Tensor) and x.dim() in (2, 3) and x.shape[0] > 1 and x.shape[1] > 1:
        return non_contiguous(x, "transpose") if x.dim() == 2 else x.transpose(0, 1).contiguous().transpose(0, 1)
    return x


TM_FORMS = [("step", "env"), ("step-T", "step"), ("env", "step-T")]
# one env-major group in every discount layout; rows split into time blocks in one layout per function
TM_CASES = [
    pytest.param(name, shape, forms, id=f"{name}-N{shape[0]}-T{shape[1]}-{'-'.join(forms)}")
    for i, name in enumerate(NAMES)
    for shape, all_forms in (((33, 7), TM_FORMS), ((3, 700), [TM_FORMS[i % len(TM_FORMS)]]))
    for forms in all_forms
]


@pytest.mark.parametrize("name, shape, forms", TM_CASES)
def test_time_major_inputs(kernel_path, name, shape, forms):
    """Time-major inputs read in place (the launcher's plans: one env-major group; rows of several chunks split
    into time blocks) with discounts in the other layout, in the same one, and per env."""
    n, t = shape
    kwargs = {k: _time_major(v) for k, v in valid_kwargs(name, shape, device=kernel_path.device).items()}
    assert _validation._is_time_major(kwargs["rewards"])
    out = checked(name, with_discounts(name, kwargs, n, t, *forms, kernel_path.device))
    assert all(o.T.is_contiguous() for o in out)


def _entry(name, n, t):
    """The validation cache entry of the one call signature of rl_triton.<name> with (n, t) rows, or None where
    the call is not cached (Retrace with CPU actions, whose range check reads them on every call)."""
    found = [e for k, e in _validation._CACHE.items() if k[0] == name and (e.num_envs, e.seq_len) == (n, t)]
    assert len(found) <= 1
    return found[0] if found and found[0].plans is not None else None


@pytest.mark.parametrize("name", NAMES)
def test_float_and_tensor_calls_on_one_signature(kernel_path, name):
    """Float and tensor discounts alternate on one call signature (one validation cache entry): every call
    matches the reference, the float calls give the same bits each time (the float launch never becomes the tensor
    one), each tensor layout and dtype gets its own launch, and new values of a tensor reuse it."""
    n, t = 3, 37  # a shape no other test of this module uses
    _validation.clear_cache()  # other modules' tests may have left entries of (3, 37) rows with other dtypes
    base = valid_kwargs(name, (n, t), device=kernel_path.device)
    dev = kernel_path.device
    g64 = discount(n, t, "step", dev, torch.float64)
    calls = [
        {},
        {"gamma": discount(n, t, "step", dev)},
        {},
        {"gamma": discount(n, t, "env", dev)},
        {"gamma": g64},
        {"gamma": discount(n, t + 1, "step", dev)[:, 1:]},  # an offset view: another alignment class
        {"gamma": torch.tensor(base["gamma"], device=dev)},  # 0-d: the float's launch
        {"gamma": discount(n, t, "step", dev)},  # new values, the first tensor's launch
        {"gamma": g64.flip(0).contiguous()},
        {},
    ]
    if name in HAS_LAMBDA:
        calls[3]["lambda_"] = discount(n, t, "step-T", dev)
        calls[7]["lambda_"] = discount(n, t, "step", dev)
    floats = []
    for extra in calls:
        out = checked(name, {**base, **extra})
        if not extra:
            floats.append(out)
    for out in floats[1:]:
        for a, b in zip(out, floats[0], strict=True):
            assert torch.equal(a, b)
    e = _entry(name, n, t)
    if e is None:
        assert name == "compute_retrace" and kernel_path.device.type == "cpu"
        return
    keys = list(e.plans)
    float_keys = [k for k in keys if not any(isinstance(x, tuple) for x in k)]
    assert len(float_keys) == 1
    assert not e.plans[float_keys[0]].launches[0].constexprs["G_TENSOR"]
    # float; step f32; env (with per-step lambda_ transposed); step f64; offset view; (0-d: float); step f32 again
    # with lambda_ (a new key only where the function has one); step f64 again
    assert len(keys) == 5 + (name in HAS_LAMBDA)
    for k in keys:
        if k not in float_keys:
            assert e.plans[k].launches[0].constexprs["G_TENSOR"]


def test_new_values_do_not_recompile(kernel_path):
    """Per-step discounts are pointers, not constexprs: new values reuse the cached launch (and on the GPU its
    compiled kernel: Triton's cache gains no entry)."""
    n, t = 4, 41
    kwargs = valid_kwargs("compute_gae", (n, t), device=kernel_path.device)
    g = discount(n, t, "step", kernel_path.device)
    checked("compute_gae", dict(kwargs, gamma=g, lambda_=discount(n, t, "env", kernel_path.device)))
    e = _entry("compute_gae", n, t)
    launches = dict(e.plans)
    compiled = len(L.COMPILED)
    for _ in range(2):
        lam = discount(n, t, "env", kernel_path.device)
        checked("compute_gae", dict(kwargs, gamma=torch.rand_like(g), lambda_=lam))
    assert dict(e.plans) == launches and all(e.plans[k] is launches[k] for k in launches)
    assert len(L.COMPILED) == compiled
