"""Every error rule of docs/semantics.md: the exception type, and a message naming the argument.
Also empty inputs, which are not errors: they return empty outputs."""

import re

import pytest
import torch

import rl_triton
from tests._helpers import FUNCTIONS, cpu_paths, env_shape, n_outputs, valid_kwargs

SHORT = {
    "compute_gae": "gae",
    "compute_vtrace": "vtrace",
    "compute_retrace": "retrace",
    "compute_discounted_returns": "disc",
    "compute_lambda_returns": "lambda",
    "compute_eligibility_traces": "elig",
    "compute_episodic_prefix_sum": "prefix",
}
PER_ENV = {"last_value", "seed_values"}
PER_ACTION = {"action_probs_target", "next_q_values_all", "next_action_probs_target"}
FLAGS = {"terminateds", "truncateds", "dones"}
SHAPE = (3, 5)


def named(name: str) -> str:
    """Regex matching `name` as a whole word (so "values" does not match inside "next_values")."""
    return rf"(?<![A-Za-z0-9_]){re.escape(name)}(?![A-Za-z0-9_])"


def call(fn: str, kwargs: dict):
    return getattr(rl_triton, fn)(**kwargs)


def _variants():
    """(fn, last_value) pairs: GAE and V-trace also in their last_value form."""
    for fn in FUNCTIONS:
        yield fn, False
        if fn in ("compute_gae", "compute_vtrace"):
            yield fn, True


def _tensor_args(kind=None):
    params = []
    for fn, lv in _variants():
        kwargs = valid_kwargs(fn, SHAPE, last_value=lv)
        for arg, v in kwargs.items():
            if not isinstance(v, torch.Tensor):
                continue
            if kind == "float" and not (v.is_floating_point() and arg not in FLAGS):
                continue
            tag = f"{SHORT[fn]}{'-lv' if lv else ''}-{arg}"
            params.append(pytest.param(fn, lv, arg, id=tag))
    return params


def _float_args_after_first():
    """Float arguments other than the first float tensor of the call (which fixes the dtype)."""
    params = []
    for p in _tensor_args("float"):
        fn, lv, arg = p.values
        first = next(k for k, v in valid_kwargs(fn, SHAPE, last_value=lv).items() if isinstance(v, torch.Tensor))
        if arg != first:
            params.append(p)
    return params


# ------------------------------------------------------------------------------------------
# Shapes and ranks


def wrong_shape(arg: str, x: torch.Tensor) -> torch.Tensor:
    """Same dtype and device, one dimension off."""
    if arg in PER_ENV:
        return torch.zeros(x.shape[0] + 1, dtype=x.dtype, device=x.device)
    if arg in PER_ACTION:
        n, t, a = x.shape
        return torch.zeros(n, t + 1, a, dtype=x.dtype, device=x.device)
    n, t = x.shape
    return torch.zeros(n, t + 1, dtype=x.dtype, device=x.device)


@pytest.mark.parametrize("fn, lv, arg", _tensor_args())
def test_shape_mismatch_names_argument(path, fn, lv, arg):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device, last_value=lv)
    kwargs[arg] = wrong_shape(arg, kwargs[arg])
    with pytest.raises(ValueError, match=named(arg)):
        call(fn, kwargs)


@pytest.mark.parametrize("fn, lv, arg", _tensor_args())
def test_wrong_rank_names_argument(path, fn, lv, arg):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device, last_value=lv)
    x = kwargs[arg]
    kwargs[arg] = x.unsqueeze(-1)  # one dimension too many
    with pytest.raises(ValueError, match=named(arg)):
        call(fn, kwargs)


@pytest.mark.parametrize("fn, lv, arg", _tensor_args())
def test_scalar_instead_of_tensor_names_argument(path, fn, lv, arg):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device, last_value=lv)
    if arg in PER_ENV:
        kwargs[arg] = kwargs[arg][0]  # () instead of (N,)
    else:
        kwargs[arg] = kwargs[arg].flatten()[0]  # a 0-d tensor
    with pytest.raises(ValueError, match=named(arg)):
        call(fn, kwargs)


@pytest.mark.parametrize("arg", ["next_q_values_all", "next_action_probs_target"])
def test_retrace_num_actions_mismatch(path, arg):
    kwargs = valid_kwargs("compute_retrace", SHAPE, num_actions=4, device=path.device)
    kwargs[arg] = kwargs[arg][..., :3]
    with pytest.raises(ValueError, match=named(arg)):
        call("compute_retrace", kwargs)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_one_d_mixed_with_two_d(path, fn):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device)
    first = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    kwargs[first] = kwargs[first][0]
    with pytest.raises(ValueError):
        call(fn, kwargs)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_non_tensor_argument(path, fn):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device)
    first = next(k for k, v in kwargs.items() if isinstance(v, torch.Tensor))
    kwargs[first] = kwargs[first].tolist()
    with pytest.raises(TypeError, match=named(first)):
        call(fn, kwargs)


# ------------------------------------------------------------------------------------------
# Dtypes


@pytest.mark.parametrize("fn, lv, arg", _float_args_after_first())
def test_mixed_float_dtypes_names_argument(path, fn, lv, arg):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device, last_value=lv)
    kwargs[arg] = kwargs[arg].double()
    with pytest.raises((TypeError, ValueError), match=named(arg)):
        call(fn, kwargs)


@pytest.mark.parametrize("fn, lv, arg", _tensor_args("float"))
def test_non_float_values_names_argument(path, fn, lv, arg):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device, last_value=lv)
    kwargs[arg] = kwargs[arg].to(torch.int32)
    with pytest.raises(TypeError, match=named(arg)):
        call(fn, kwargs)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_int_rewards_type_error(path, fn):
    """An integer first input (rewards, gradients, inputs...) with float others is a TypeError."""
    kwargs = valid_kwargs(fn, SHAPE, device=path.device)
    arg = {"compute_eligibility_traces": "gradients", "compute_episodic_prefix_sum": "inputs"}.get(fn, "rewards")
    kwargs[arg] = torch.randint(-3, 3, SHAPE, device=path.device)
    with pytest.raises(TypeError, match=named(arg)):
        call(fn, kwargs)


@pytest.mark.parametrize("fn", FUNCTIONS)
def test_all_float_float64_is_fine(path, fn):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device, dtype=torch.float64)
    outs = call(fn, kwargs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert all(o.dtype == torch.float64 for o in outs)


# ------------------------------------------------------------------------------------------
# Scalars


GAMMA_FNS = [f for f in FUNCTIONS if f != "compute_episodic_prefix_sum"]
LAMBDA_FNS = ["compute_gae", "compute_retrace", "compute_lambda_returns", "compute_eligibility_traces"]
BAD_UNIT = [
    pytest.param(-0.1, id="neg"),
    pytest.param(1.0001, id="above1"),
    pytest.param(2.0, id="2"),
    pytest.param(torch.tensor(1.5, dtype=torch.float64), id="tensor1.5"),
    pytest.param(float("nan"), id="nan"),
]


@pytest.mark.parametrize("value", BAD_UNIT)
@pytest.mark.parametrize("fn", GAMMA_FNS)
def test_gamma_out_of_range(path, fn, value):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device)
    kwargs["gamma"] = value
    with pytest.raises(ValueError, match=rf"^{fn}: 'gamma' must be in \[0, 1\], got "):
        call(fn, kwargs)


@pytest.mark.parametrize("value", BAD_UNIT)
@pytest.mark.parametrize("fn", LAMBDA_FNS)
def test_lambda_out_of_range(path, fn, value):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device)
    kwargs["lambda_"] = value
    with pytest.raises(ValueError, match=rf"^{fn}: 'lambda_' must be in \[0, 1\], got "):
        call(fn, kwargs)


@pytest.mark.parametrize("fn", GAMMA_FNS)
def test_gamma_bounds_are_inclusive(path, fn):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device)
    for g in (0.0, 1.0, torch.tensor(1.0)):
        kwargs["gamma"] = g
        call(fn, kwargs)


# ------------------------------------------------------------------------------------------
# Argument combinations


@pytest.mark.parametrize("fn", ["compute_gae", "compute_vtrace"])
def test_last_value_with_bootstrap_values(path, fn):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device, last_value=True)
    kwargs["bootstrap_values"] = torch.zeros(SHAPE, device=path.device)
    with pytest.raises(ValueError, match="last_value"):
        call(fn, kwargs)


@pytest.mark.parametrize("fn", ["compute_gae", "compute_vtrace"])
def test_last_value_with_truncateds(path, fn):
    kwargs = valid_kwargs(fn, SHAPE, device=path.device, last_value=True)
    kwargs["truncateds"] = torch.zeros(SHAPE, dtype=torch.bool, device=path.device)
    with pytest.raises(ValueError, match="last_value"):
        call(fn, kwargs)


def test_retrace_requires_truncateds(path):
    kwargs = valid_kwargs("compute_retrace", SHAPE, device=path.device)
    kwargs["truncateds"] = None
    with pytest.raises((ValueError, TypeError), match="truncateds"):
        call("compute_retrace", kwargs)
    del kwargs["truncateds"]
    with pytest.raises(TypeError):
        call("compute_retrace", kwargs)


@pytest.mark.parametrize("boundary", ["end", "ends", "STARTS_AT", "", None])
def test_unknown_boundary(path, boundary):
    kwargs = valid_kwargs("compute_episodic_prefix_sum", SHAPE, device=path.device)
    kwargs["boundary"] = boundary
    with pytest.raises((ValueError, TypeError), match="boundary"):
        call("compute_episodic_prefix_sum", kwargs)


@pytest.mark.parametrize("bad", [-1, 4, 100])
@cpu_paths  # actions are range-checked on CPU tensors (no host sync on GPU)
def test_retrace_actions_out_of_range(path, bad):
    kwargs = valid_kwargs("compute_retrace", SHAPE, num_actions=4, device=path.device)
    kwargs["actions"] = kwargs["actions"].clone()
    kwargs["actions"][1, 2] = bad
    with pytest.raises(ValueError, match="actions"):
        call("compute_retrace", kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool], ids=["float", "bool"])
def test_retrace_actions_must_be_integer(path, dtype):
    kwargs = valid_kwargs("compute_retrace", SHAPE, device=path.device)
    kwargs["actions"] = kwargs["actions"].to(dtype)
    with pytest.raises(TypeError, match="actions"):
        call("compute_retrace", kwargs)


@pytest.mark.cuda
@pytest.mark.parametrize("fn, lv, arg", _tensor_args())
def test_device_mismatch_names_argument(fn, lv, arg):
    kwargs = valid_kwargs(fn, SHAPE, device="cuda", last_value=lv)
    kwargs[arg] = kwargs[arg].cpu()
    with rl_triton.use_backend("triton"), pytest.raises(ValueError, match=named(arg)):
        call(fn, kwargs)


# ------------------------------------------------------------------------------------------
# Empty inputs


@pytest.mark.parametrize(
    "shape", [pytest.param((0, 5), id="N0-T5"), pytest.param((3, 0), id="N3-T0"), pytest.param((0,), id="T0-1d")]
)
@pytest.mark.parametrize(
    "fn, lv", [pytest.param(f, lv, id=f"{SHORT[f]}{'-lv' if lv else ''}") for f, lv in _variants()]
)
def test_empty_inputs_give_empty_outputs(path, fn, lv, shape):
    kwargs = valid_kwargs(fn, shape, device=path.device, dtype=torch.float16, last_value=lv)
    for k in ("last_value", "seed_values"):
        if k in kwargs:
            assert tuple(kwargs[k].shape) == env_shape(shape)
    outs = call(fn, kwargs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    assert len(outs) == n_outputs(fn)
    for o in outs:
        assert tuple(o.shape) == shape
        assert o.dtype == torch.float16
        assert o.device.type == path.device.type
