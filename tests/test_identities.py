"""Identities between the estimators (rlax-style): each side computed by the package on the same
path, so these hold independently of the reference implementation."""

import pytest
import torch

import rl_triton
from tests._helpers import boundary_values, env_shape, probs, randn, term_trunc, to_flags

TOL = {"atol": 1e-5, "rtol": 1e-5}
SHAPES = [pytest.param((4, 50), id="N4-T50"), pytest.param((37,), id="T37-1d")]


def episode_data(shape, device, p=0.1):
    term, trunc = term_trunc(shape, p, p)
    return {
        "rewards": randn(shape, device=device),
        "values": randn(shape, device=device),
        "terminateds": to_flags(term, device=device),
        "truncateds": to_flags(trunc, device=device),
        "bootstrap_values": boundary_values(trunc, device=device),
    }


def shift_next_values(values, bootstrap_values, truncateds):
    """next_values[t] = values[t+1], bootstrap at the last step and at truncated steps."""
    nv = torch.cat([values[..., 1:], bootstrap_values[..., -1:]], dim=-1)
    return torch.where(truncateds.bool(), bootstrap_values, nv)


@pytest.mark.parametrize("lambda_", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("shape", SHAPES)
def test_lambda_one_returns_equal_discounted_returns(path, shape, lambda_):
    """λ = 1: λ-returns do not depend on next_values and equal discounted returns (same bootstrap).
    For λ < 1 only the λ = 1 side is compared, as a negative control on the test itself."""
    d = episode_data(shape, path.device)
    disc = rl_triton.compute_discounted_returns(
        d["rewards"], d["terminateds"], d["truncateds"], gamma=0.95, bootstrap_values=d["bootstrap_values"]
    )
    lam = rl_triton.compute_lambda_returns(
        d["rewards"],
        randn(shape, device=path.device),
        d["terminateds"],
        d["truncateds"],
        gamma=0.95,
        lambda_=lambda_,
        bootstrap_values=d["bootstrap_values"],
    )
    if lambda_ == 1.0:
        torch.testing.assert_close(lam, disc, **TOL)
    else:
        assert not torch.allclose(lam, disc, **TOL)


@pytest.mark.parametrize("lambda_", [0.0, 0.5, 0.95, 1.0])
@pytest.mark.parametrize("shape", SHAPES)
def test_gae_plus_values_equals_lambda_returns(path, shape, lambda_):
    d = episode_data(shape, path.device)
    adv = rl_triton.compute_gae(
        d["rewards"],
        d["values"],
        d["terminateds"],
        d["truncateds"],
        gamma=0.9,
        lambda_=lambda_,
        bootstrap_values=d["bootstrap_values"],
    )
    next_values = shift_next_values(d["values"], d["bootstrap_values"], d["truncateds"])
    ret = rl_triton.compute_lambda_returns(
        d["rewards"],
        next_values,
        d["terminateds"],
        d["truncateds"],
        gamma=0.9,
        lambda_=lambda_,
        bootstrap_values=d["bootstrap_values"],
    )
    torch.testing.assert_close(adv + d["values"], ret, **TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_gae_last_value_equals_bootstrap_in_last_column(path, shape):
    d = episode_data(shape, path.device)
    last = randn(env_shape(shape), device=path.device)
    boot = torch.zeros(shape, device=path.device)
    boot[..., -1] = last
    a = rl_triton.compute_gae(d["rewards"], d["values"], d["terminateds"], gamma=0.9, lambda_=0.9, last_value=last)
    b = rl_triton.compute_gae(
        d["rewards"], d["values"], d["terminateds"], gamma=0.9, lambda_=0.9, bootstrap_values=boot
    )
    torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("shape", SHAPES)
def test_gae_lambda_zero_is_td_error(path, shape):
    d = episode_data(shape, path.device)
    adv = rl_triton.compute_gae(
        d["rewards"],
        d["values"],
        d["terminateds"],
        d["truncateds"],
        gamma=0.9,
        lambda_=0.0,
        bootstrap_values=d["bootstrap_values"],
    )
    next_values = shift_next_values(d["values"], d["bootstrap_values"], d["truncateds"])
    td = d["rewards"] + 0.9 * (1 - d["terminateds"].float()) * next_values - d["values"]
    torch.testing.assert_close(adv, td, **TOL)


@pytest.mark.parametrize("use_last_value", [False, True], ids=["bootstrap", "last_value"])
@pytest.mark.parametrize("shape", SHAPES)
def test_vtrace_on_policy_equals_gae_lambda_one(path, shape, use_last_value):
    """π = μ, ρ̄ = c̄ = 1: vs − values and the V-trace advantages both equal GAE(λ=1)."""
    d = episode_data(shape, path.device)
    log_pi = randn(shape, device=path.device)
    if use_last_value:
        extra = {"last_value": randn(env_shape(shape), device=path.device)}
        flags = (d["terminateds"],)
    else:
        extra = {"bootstrap_values": d["bootstrap_values"]}
        flags = (d["terminateds"], d["truncateds"])
    vs, adv = rl_triton.compute_vtrace(
        log_pi, log_pi.clone(), d["values"], d["rewards"], *flags, gamma=0.93, rho_bar=1.0, c_bar=1.0, **extra
    )
    gae = rl_triton.compute_gae(d["rewards"], d["values"], *flags, gamma=0.93, lambda_=1.0, **extra)
    torch.testing.assert_close(vs - d["values"], gae, **TOL)
    torch.testing.assert_close(adv, gae, **TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_vtrace_on_policy_clip_levels_do_not_matter(path, shape):
    """With π = μ every ratio is 1, so any ρ̄, c̄ >= 1 gives the same result."""
    d = episode_data(shape, path.device)
    log_pi = randn(shape, device=path.device)
    args = (log_pi, log_pi, d["values"], d["rewards"], d["terminateds"], d["truncateds"])
    a = rl_triton.compute_vtrace(*args, gamma=0.9, bootstrap_values=d["bootstrap_values"])
    b = rl_triton.compute_vtrace(*args, gamma=0.9, rho_bar=3.0, c_bar=2.0, bootstrap_values=d["bootstrap_values"])
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def retrace_data(shape, device, num_actions=5):
    term, trunc = term_trunc(shape, 0.1, 0.1)
    a_shape = (*shape, num_actions)
    actions = torch.randint(0, num_actions, shape)
    target = probs(a_shape)
    behavior = probs(a_shape).gather(-1, actions.unsqueeze(-1)).squeeze(-1)
    return [
        target.to(device),
        behavior.to(device),
        randn(shape, device=device),
        randn(a_shape, device=device),
        actions.to(device),
        randn(shape, device=device),
        to_flags(term, device=device),
        to_flags(trunc, device=device),
    ]


@pytest.mark.parametrize("shape", SHAPES)
def test_retrace_next_probs_equal_to_target_is_the_default(path, shape):
    args = retrace_data(shape, path.device)
    a = rl_triton.compute_retrace(*args, gamma=0.9, lambda_=0.8)
    b = rl_triton.compute_retrace(*args, gamma=0.9, lambda_=0.8, next_action_probs_target=args[0].clone())
    torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_retrace_lambda_zero_is_expected_sarsa(path, shape):
    """λ = 0 cuts every trace: q_targets_t = r_t + γ(1 − term_t)·Σ_a π(a|s_{t+1}) Q(s_{t+1}, a)."""
    args = retrace_data(shape, path.device)
    next_probs = probs((*shape, 5)).to(path.device)
    q_targets, _ = rl_triton.compute_retrace(*args, gamma=0.9, lambda_=0.0, next_action_probs_target=next_probs)
    rewards, term, next_q = args[5], args[6], args[3]
    expected = rewards + 0.9 * (1 - term.float()) * (next_probs * next_q).sum(-1)
    torch.testing.assert_close(q_targets, expected, **TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_retrace_next_probs_from_shifted_target(path, shape):
    """next_action_probs_target = target rows shifted by one step changes E_t (and only E_t):
    at λ = 0 the q-targets equal expected SARSA with π(·|s_{t+1}) taken from row t+1."""
    args = retrace_data(shape, path.device)
    target = args[0]
    shifted = torch.cat([target[..., 1:, :], target[..., -1:, :]], dim=-2)
    q_targets, _ = rl_triton.compute_retrace(*args, gamma=0.9, lambda_=0.0, next_action_probs_target=shifted)
    expected = args[5] + 0.9 * (1 - args[6].float()) * (shifted * args[3]).sum(-1)
    torch.testing.assert_close(q_targets, expected, **TOL)
    q_default, _ = rl_triton.compute_retrace(*args, gamma=0.9, lambda_=0.0)
    assert not torch.allclose(q_targets, q_default)


@pytest.mark.parametrize("shape", SHAPES)
def test_prefix_sum_ends_at_is_starts_at_with_shifted_dones(path, shape):
    """ends_at with dones d equals starts_at with d shifted one step later (d'_t = d_{t-1}, d'_0 = 0)."""
    x = randn(shape, device=path.device)
    dones = torch.rand(shape) < 0.2
    shifted = torch.cat([torch.zeros((*shape[:-1], 1), dtype=torch.bool), dones[..., :-1]], dim=-1)
    seed = randn(env_shape(shape), device=path.device)
    a = rl_triton.compute_episodic_prefix_sum(x, dones.to(path.device), boundary="ends_at", seed_values=seed)
    b = rl_triton.compute_episodic_prefix_sum(x, shifted.to(path.device), boundary="starts_at", seed_values=seed)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("boundary", ["ends_at", "starts_at"])
@pytest.mark.parametrize("shape", SHAPES)
def test_prefix_sum_no_dones_is_cumsum(path, shape, boundary):
    x = randn(shape, device=path.device, dtype=torch.float64)
    seed = randn(env_shape(shape), device=path.device, dtype=torch.float64)
    none = torch.zeros(shape, dtype=torch.bool, device=path.device)
    out = rl_triton.compute_episodic_prefix_sum(x, none, boundary=boundary, seed_values=seed)
    torch.testing.assert_close(out, x.cumsum(-1) + seed.unsqueeze(-1), atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("boundary", ["ends_at", "starts_at"])
@pytest.mark.parametrize("shape", SHAPES)
def test_prefix_sum_chunked_with_seed_values(path, shape, boundary):
    """Splitting the sequence and carrying S_{k-1} (cut if the episode ended at k-1 for ends_at)
    as seed_values of the second chunk gives the whole-sequence result."""
    x = randn(shape, device=path.device, dtype=torch.float64)
    dones = to_flags(torch.rand(shape) < 0.2, device=path.device)
    k = shape[-1] // 3
    whole = rl_triton.compute_episodic_prefix_sum(x, dones, boundary=boundary)
    first = rl_triton.compute_episodic_prefix_sum(x[..., :k], dones[..., :k], boundary=boundary)
    carry = first[..., -1]
    if boundary == "ends_at":
        carry = carry * (1 - dones[..., k - 1].double())
    second = rl_triton.compute_episodic_prefix_sum(x[..., k:], dones[..., k:], boundary=boundary, seed_values=carry)
    torch.testing.assert_close(torch.cat([first, second], -1), whole, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_eligibility_traces_chunked_with_seed_values(path, shape):
    g = randn(shape, device=path.device, dtype=torch.float64)
    dones = to_flags(torch.rand(shape) < 0.2, device=path.device)
    k = shape[-1] // 2
    whole = rl_triton.compute_eligibility_traces(g, dones, gamma=0.9, lambda_=0.8)
    first = rl_triton.compute_eligibility_traces(g[..., :k], dones[..., :k], gamma=0.9, lambda_=0.8)
    carry = first[..., -1] * (1 - dones[..., k - 1].double())
    second = rl_triton.compute_eligibility_traces(g[..., k:], dones[..., k:], gamma=0.9, lambda_=0.8, seed_values=carry)
    torch.testing.assert_close(torch.cat([first, second], -1), whole, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_eligibility_seed_adds_a_decaying_term(path, shape):
    """e(seed) − e(0) = seed·(γλ)^(t+1) until the first done (inclusive), 0 after it."""
    g = randn(shape, device=path.device, dtype=torch.float64)
    dones = torch.rand(shape) < 0.1
    seed = randn(env_shape(shape), device=path.device, dtype=torch.float64)
    with_seed = rl_triton.compute_eligibility_traces(g, dones.to(path.device), gamma=0.9, lambda_=0.5, seed_values=seed)
    without = rl_triton.compute_eligibility_traces(g, dones.to(path.device), gamma=0.9, lambda_=0.5)
    t = torch.arange(shape[-1], dtype=torch.float64)
    alive = torch.cat([torch.ones((*shape[:-1], 1)), (1 - dones.double()).cumprod(-1)[..., :-1]], dim=-1)
    expected = seed.cpu().unsqueeze(-1) * 0.45 ** (t + 1) * alive
    torch.testing.assert_close((with_seed - without).cpu(), expected, atol=1e-12, rtol=1e-9)


@pytest.mark.parametrize("shape", SHAPES)
def test_discounted_returns_chunked_with_bootstrap(path, shape):
    """Cutting the window at k and bootstrapping the first part's last step with the second part's
    G_k gives the whole-window returns."""
    d = episode_data(shape, path.device)
    r, term, trunc, boot = (
        d[k].double() if d[k].is_floating_point() else d[k]
        for k in ("rewards", "terminateds", "truncateds", "bootstrap_values")
    )
    k = shape[-1] // 2
    whole = rl_triton.compute_discounted_returns(r, term, trunc, gamma=0.9, bootstrap_values=boot)
    second = rl_triton.compute_discounted_returns(
        r[..., k:], term[..., k:], trunc[..., k:], gamma=0.9, bootstrap_values=boot[..., k:]
    )
    boot_first = boot[..., :k].clone()
    boot_first[..., -1] = torch.where(trunc[..., k - 1].bool(), boot[..., k - 1], second[..., 0])
    first = rl_triton.compute_discounted_returns(
        r[..., :k], term[..., :k], trunc[..., :k], gamma=0.9, bootstrap_values=boot_first
    )
    torch.testing.assert_close(torch.cat([first, second], -1), whole, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("shape", SHAPES)
def test_lambda_returns_lambda_zero_is_one_step_target(path, shape):
    d = episode_data(shape, path.device)
    nv = randn(shape, device=path.device)
    out = rl_triton.compute_lambda_returns(
        d["rewards"],
        nv,
        d["terminateds"],
        d["truncateds"],
        gamma=0.9,
        lambda_=0.0,
        bootstrap_values=d["bootstrap_values"],
    )
    x = torch.where(d["truncateds"].bool(), d["bootstrap_values"], nv)
    expected = d["rewards"] + 0.9 * (1 - d["terminateds"].float()) * x
    torch.testing.assert_close(out, expected, **TOL)


@pytest.mark.parametrize("fn", ["compute_gae", "compute_discounted_returns", "compute_lambda_returns"])
def test_rows_are_independent(path, fn):
    """A batched call equals one 1-D call per env."""
    shape = (5, 21)
    d = episode_data(shape, path.device, p=0.15)
    nv = randn(shape, device=path.device)

    def run(i=slice(None)):
        if fn == "compute_gae":
            return rl_triton.compute_gae(
                d["rewards"][i],
                d["values"][i],
                d["terminateds"][i],
                d["truncateds"][i],
                gamma=0.9,
                lambda_=0.9,
                bootstrap_values=d["bootstrap_values"][i],
            )
        if fn == "compute_discounted_returns":
            return rl_triton.compute_discounted_returns(
                d["rewards"][i],
                d["terminateds"][i],
                d["truncateds"][i],
                gamma=0.9,
                bootstrap_values=d["bootstrap_values"][i],
            )
        return rl_triton.compute_lambda_returns(
            d["rewards"][i],
            nv[i],
            d["terminateds"][i],
            d["truncateds"][i],
            gamma=0.9,
            lambda_=0.7,
            bootstrap_values=d["bootstrap_values"][i],
        )

    batched = run()
    for i in range(shape[0]):
        torch.testing.assert_close(run(i), batched[i], **TOL)
