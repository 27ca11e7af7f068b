"""Property tests: random small shapes, flags (terminated, truncated, both), dtypes, gamma and
lambda against the float64 reference.

Bounded in time: 25 examples per test and path, at most 4 envs x 40 steps, the same examples on every
run; under Triton's interpreter a failing example is reported as found, not shrunk (shrinking replays
the call hundreds of times, each kernel launch tens of milliseconds there)."""

import torch
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import rl_triton
from tests._helpers import check, env_shape, probs

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    database=None,  # nothing written to the working tree
    derandomize=True,  # the same examples on every run, so CI is reproducible
    phases=[Phase.explicit, Phase.generate] if rl_triton.INTERPRET else list(Phase),
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
TOL = {torch.float32: {"atol": 3e-5, "rtol": 1e-4}, torch.float64: {"atol": 1e-10, "rtol": 1e-10}}

unit = st.one_of(st.sampled_from([0.0, 1.0]), st.floats(0.0, 1.0))


@st.composite
def episodes(draw, max_envs=4, max_len=40):
    """Shape, flags (0 none, 1 terminated, 2 truncated, 3 both), dtypes and a seed for the values."""
    shape = draw(
        st.one_of(
            st.tuples(st.integers(1, max_len)),
            st.tuples(st.integers(1, max_envs), st.integers(1, max_len)),
        )
    )
    numel = shape[0] if len(shape) == 1 else shape[0] * shape[1]
    codes = draw(st.lists(st.sampled_from([0, 0, 0, 0, 0, 0, 1, 2, 3]), min_size=numel, max_size=numel))
    codes = torch.tensor(codes).reshape(shape)
    return {
        "shape": shape,
        "term": (codes == 1) | (codes == 3),
        "trunc": (codes == 2) | (codes == 3),
        "dtype": draw(st.sampled_from([torch.float32, torch.float64])),
        "flag_dtype": draw(st.sampled_from([torch.bool, torch.uint8, torch.float32])),
        "seed": draw(st.integers(0, 2**31 - 1)),
    }


class Maker:
    """Random tensors for one example, on the path's device."""

    def __init__(self, ep, device):
        self.ep, self.device = ep, device
        self.gen = torch.Generator().manual_seed(ep["seed"])

    def randn(self, shape=None, scale=1.0):
        shape = self.ep["shape"] if shape is None else shape
        x = torch.randn(shape, generator=self.gen, dtype=torch.float64) * scale
        return x.to(self.ep["dtype"]).to(self.device)

    def flag(self, mask):
        return mask.to(self.ep["flag_dtype"]).to(self.device)

    def bootstrap(self, trunc):
        boundary = trunc.clone()
        boundary[..., -1] = True
        return self.randn().masked_fill(~boundary.to(self.device), 0.0)


@SETTINGS
@given(ep=episodes(), gamma=unit, lambda_=unit, with_trunc=st.booleans(), with_boot=st.booleans())
def test_gae(path, ep, gamma, lambda_, with_trunc, with_boot):
    m = Maker(ep, path.device)
    args = [m.randn(), m.randn(), m.flag(ep["term"])]
    kwargs = {"gamma": gamma, "lambda_": lambda_}
    if with_trunc:
        args.append(m.flag(ep["trunc"]))
    if with_boot:
        kwargs["bootstrap_values"] = m.bootstrap(ep["trunc"])
    elif not with_trunc:
        kwargs["last_value"] = m.randn(env_shape(ep["shape"]))
    check("compute_gae", *args, **kwargs, **TOL[ep["dtype"]])


@SETTINGS
@given(
    ep=episodes(),
    gamma=unit,
    rho_bar=st.sampled_from([0.5, 1.0, 2.0]),
    c_bar=st.sampled_from([0.0, 0.9, 1.0]),
    with_trunc=st.booleans(),
)
def test_vtrace(path, ep, gamma, rho_bar, c_bar, with_trunc):
    m = Maker(ep, path.device)
    log_mu = m.randn()
    log_pi = (log_mu.double().cpu() + 0.5 * m.randn().double().cpu()).to(ep["dtype"]).to(path.device)
    args = [log_pi, log_mu, m.randn(), m.randn(), m.flag(ep["term"])]
    kwargs = {"gamma": gamma, "rho_bar": rho_bar, "c_bar": c_bar}
    if with_trunc:
        args.append(m.flag(ep["trunc"]))
        kwargs["bootstrap_values"] = m.bootstrap(ep["trunc"])
    else:
        kwargs["last_value"] = m.randn(env_shape(ep["shape"]))
    check("compute_vtrace", *args, **kwargs, **TOL[ep["dtype"]])


@SETTINGS
@given(ep=episodes(), gamma=unit, lambda_=unit, num_actions=st.integers(1, 5), with_next=st.booleans())
def test_retrace(path, ep, gamma, lambda_, num_actions, with_next):
    m = Maker(ep, path.device)
    shape = ep["shape"]
    a_shape = (*shape, num_actions)
    actions = torch.randint(0, num_actions, shape, generator=m.gen)
    behavior = probs(a_shape, torch.float64).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    args = [
        probs(a_shape, ep["dtype"], path.device),
        behavior.to(ep["dtype"]).to(path.device),
        m.randn(),
        m.randn(a_shape),
        actions.to(path.device),
        m.randn(),
        m.flag(ep["term"]),
        m.flag(ep["trunc"]),
    ]
    kwargs = {"gamma": gamma, "lambda_": lambda_}
    if with_next:
        kwargs["next_action_probs_target"] = probs(a_shape, ep["dtype"], path.device)
    check("compute_retrace", *args, **kwargs, **TOL[ep["dtype"]])


@SETTINGS
@given(ep=episodes(), gamma=unit, lambda_=unit, with_trunc=st.booleans(), with_boot=st.booleans())
def test_lambda_returns(path, ep, gamma, lambda_, with_trunc, with_boot):
    m = Maker(ep, path.device)
    args = [m.randn(), m.randn(), m.flag(ep["term"])]
    kwargs = {"gamma": gamma, "lambda_": lambda_}
    if with_trunc:
        args.append(m.flag(ep["trunc"]))
    if with_boot:
        kwargs["bootstrap_values"] = m.bootstrap(ep["trunc"])
    check("compute_lambda_returns", *args, **kwargs, **TOL[ep["dtype"]])


@SETTINGS
@given(ep=episodes(), gamma=unit, with_trunc=st.booleans(), with_boot=st.booleans())
def test_discounted_returns(path, ep, gamma, with_trunc, with_boot):
    m = Maker(ep, path.device)
    args = [m.randn(), m.flag(ep["term"])]
    kwargs = {"gamma": gamma}
    if with_trunc:
        args.append(m.flag(ep["trunc"]))
    if with_boot:
        kwargs["bootstrap_values"] = m.bootstrap(ep["trunc"])
    check("compute_discounted_returns", *args, **kwargs, **TOL[ep["dtype"]])


@SETTINGS
@given(ep=episodes(), gamma=unit, lambda_=unit, with_seed=st.booleans())
def test_eligibility_traces(path, ep, gamma, lambda_, with_seed):
    m = Maker(ep, path.device)
    kwargs = {"gamma": gamma, "lambda_": lambda_}
    if with_seed:
        kwargs["seed_values"] = m.randn(env_shape(ep["shape"]))
    check("compute_eligibility_traces", m.randn(), m.flag(ep["term"] | ep["trunc"]), **kwargs, **TOL[ep["dtype"]])


@SETTINGS
@given(ep=episodes(), boundary=st.sampled_from(["ends_at", "starts_at"]), with_seed=st.booleans())
def test_episodic_prefix_sum(path, ep, boundary, with_seed):
    m = Maker(ep, path.device)
    kwargs = {"boundary": boundary}
    if with_seed:
        kwargs["seed_values"] = m.randn(env_shape(ep["shape"]), scale=3.0)
    check("compute_episodic_prefix_sum", m.randn(), m.flag(ep["term"] | ep["trunc"]), **kwargs, **TOL[ep["dtype"]])
