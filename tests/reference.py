"""Float64 reference implementations, written literally from docs/semantics.md.

Deliberately slow and independent of the package: every function loops over environments and
time steps in plain Python. A cell is a Python float, or a 0-d float64 tensor when its input
requires grad, so autograd through these loops gives reference gradients. Flags are reduced to
0/1 integers ("nonzero means set"). Probabilities and log-probabilities are constants (detached),
as the API specifies. ``gamma`` and ``lambda_`` may be floats, 0-d tensors, or per-env / per-step
tensors (a grid of floats: gamma_t and lambda_t of each step, never differentiated).

The signatures match the public API; results are float64 tensors (1-D for 1-D calls). ``plan`` (the
kernel path's launch plan) is accepted and ignored, so one call's keyword arguments, a plan among them,
run both here and in the package (tests._helpers.check); a plan never changes what is computed.
"""

from __future__ import annotations

import math

import torch

F64 = torch.float64


# --------------------------------------------------------------------------------------------
# Plumbing: tensors <-> nested Python lists of cells.


def _scalar(x) -> float:
    return float(x.item()) if isinstance(x, torch.Tensor) else float(x)


def _check_unit(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value}")


def _per_step(name: str, x, n: int, t: int, one_d: bool) -> list[list[float]]:
    """gamma or lambda_ as an [n][t] grid of floats: x_t of env n (docs/semantics.md, "Per-step gamma and
    lambda"). A float or a 0-d tensor is the same at every step; an (N,) tensor per env; an (N, T) tensor (or
    (T,) in a 1-D call) per step. Never differentiated (detached)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0 or (x.dim() == 1 and x.numel() == 1):
        value = _scalar(x)
        _check_unit(name, value)
        return [[value] * t for _ in range(n)]
    cells = x.detach().to("cpu", F64).tolist()
    if one_d and x.shape == (t,):
        grid = [cells]
    elif not one_d and x.shape == (n,):
        grid = [[cells[i]] * t for i in range(n)]
    elif not one_d and x.shape == (n, t):
        grid = cells
    else:
        raise ValueError(f"{name}: shape {tuple(x.shape)} is neither per-env nor per-step")
    for row in grid:
        for value in row:
            _check_unit(name, value)
    return grid


def _as_2d(x: torch.Tensor | None, one_d: bool) -> torch.Tensor | None:
    if x is None:
        return None
    return x.unsqueeze(0) if one_d else x


def _cells(x: torch.Tensor | None, *, detach: bool = False):
    """(N, T[, A]) tensor -> nested lists of floats (or 0-d float64 tensors when it requires grad)."""
    if x is None:
        return None
    if detach or not x.requires_grad:
        return x.detach().to("cpu", F64).tolist()
    x = x.to("cpu", F64)

    def split(t):
        return list(t.unbind(0)) if t.dim() == 1 else [split(s) for s in t.unbind(0)]

    return split(x)


def _env_cells(x: torch.Tensor | None, one_d: bool):
    """Per-env tensor, (N,) or () for 1-D calls -> list of N cells."""
    if x is None:
        return None
    x = x.reshape(1) if one_d else x
    return _cells(x)


def _flags(x: torch.Tensor | None, n: int, t: int) -> list[list[int]]:
    """Flags -> 0/1 ints. Absent flags are all zero."""
    if x is None:
        return [[0] * t for _ in range(n)]
    return [[1 if v else 0 for v in row] for row in (x.detach().cpu() != 0).tolist()]


def _assemble(grid, n: int, t: int, one_d: bool) -> torch.Tensor:
    """Nested [n][t] cells -> float64 tensor, differentiable where the cells are tensors."""
    if n == 0 or t == 0 or not any(isinstance(c, torch.Tensor) for row in grid for c in row):
        out = torch.tensor(grid, dtype=F64).reshape(n, t)
    else:
        out = torch.stack(
            [
                torch.stack([c if isinstance(c, torch.Tensor) else torch.tensor(c, dtype=F64) for c in row])
                for row in grid
            ]
        )
    return out.squeeze(0) if one_d else out


def _shape(x: torch.Tensor) -> tuple[int, int, bool]:
    one_d = x.dim() == 1
    n = 1 if one_d else x.shape[0]
    return n, x.shape[-1], one_d


def _boot(boot, last, n: int, t: int, T: int):
    """boot_t: bootstrap_values[:, t] if given; last_value fills only t = T-1; else 0."""
    if boot is not None:
        return boot[n][t]
    if last is not None and t == T - 1:
        return last[n]
    return 0.0


# --------------------------------------------------------------------------------------------
# The seven functions.


def compute_gae(
    rewards, values, terminateds, truncateds=None, *, gamma, lambda_, bootstrap_values=None, last_value=None, plan=None
):
    if last_value is not None and bootstrap_values is not None:
        raise ValueError("last_value and bootstrap_values are mutually exclusive")
    if last_value is not None and truncateds is not None:
        raise ValueError("last_value cannot be combined with truncateds")
    N, T, one_d = _shape(rewards)
    G = _per_step("gamma", gamma, N, T, one_d)
    LAM = _per_step("lambda_", lambda_, N, T, one_d)
    R = _cells(_as_2d(rewards, one_d))
    V = _cells(_as_2d(values, one_d))
    B = _cells(_as_2d(bootstrap_values, one_d))
    L = _env_cells(last_value, one_d)
    term = _flags(_as_2d(terminateds, one_d), N, T)
    trunc = _flags(_as_2d(truncateds, one_d), N, T)

    out = [[0.0] * T for _ in range(N)]
    for n in range(N):
        a_next = 0.0  # A_T = 0
        for t in reversed(range(T)):
            done = term[n][t] or trunc[n][t]
            boundary = trunc[n][t] or t == T - 1
            v_next = _boot(B, L, n, t, T) if boundary else V[n][t + 1]
            gamma, lam = G[n][t], LAM[n][t]
            delta = R[n][t] + gamma * (1 - term[n][t]) * v_next - V[n][t]
            a = delta + gamma * lam * (1 - done) * a_next
            out[n][t] = a
            a_next = a
    return _assemble(out, N, T, one_d)


def compute_vtrace(
    log_pi_target,
    log_pi_behavior,
    values,
    rewards,
    terminateds,
    truncateds=None,
    *,
    gamma,
    rho_bar=1.0,
    c_bar=1.0,
    bootstrap_values=None,
    last_value=None,
    plan=None,
):
    rho_bar, c_bar = _scalar(rho_bar), _scalar(c_bar)
    if last_value is not None and bootstrap_values is not None:
        raise ValueError("last_value and bootstrap_values are mutually exclusive")
    if last_value is not None and truncateds is not None:
        raise ValueError("last_value cannot be combined with truncateds")
    N, T, one_d = _shape(rewards)
    G = _per_step("gamma", gamma, N, T, one_d)
    LPT = _cells(_as_2d(log_pi_target, one_d), detach=True)
    LPB = _cells(_as_2d(log_pi_behavior, one_d), detach=True)
    V = _cells(_as_2d(values, one_d))
    R = _cells(_as_2d(rewards, one_d))
    B = _cells(_as_2d(bootstrap_values, one_d))
    L = _env_cells(last_value, one_d)
    term = _flags(_as_2d(terminateds, one_d), N, T)
    trunc = _flags(_as_2d(truncateds, one_d), N, T)

    vs = [[0.0] * T for _ in range(N)]
    adv = [[0.0] * T for _ in range(N)]
    for n in range(N):
        rho = [0.0] * T
        v_next = [0.0] * T
        d_next = 0.0  # D_T = 0
        for t in reversed(range(T)):
            ratio = math.exp(LPT[n][t] - LPB[n][t])
            rho[t] = min(rho_bar, ratio)
            c = min(c_bar, ratio)
            done = term[n][t] or trunc[n][t]
            boundary = trunc[n][t] or t == T - 1
            v_next[t] = _boot(B, L, n, t, T) if boundary else V[n][t + 1]
            gamma = G[n][t]
            delta = rho[t] * (R[n][t] + gamma * (1 - term[n][t]) * v_next[t] - V[n][t])
            d = delta + gamma * c * (1 - done) * d_next
            vs[n][t] = V[n][t] + d
            d_next = d
        for t in range(T):
            boundary = trunc[n][t] or t == T - 1
            q = v_next[t] if boundary else vs[n][t + 1]
            adv[n][t] = rho[t] * (R[n][t] + G[n][t] * (1 - term[n][t]) * q - V[n][t])
    return _assemble(vs, N, T, one_d), _assemble(adv, N, T, one_d)


def compute_retrace(
    action_probs_target,
    action_probs_behavior,
    q_values,
    next_q_values_all,
    actions,
    rewards,
    terminateds,
    truncateds,
    *,
    gamma,
    lambda_=1.0,
    c_bar=1.0,
    rho_bar=1.0,
    next_action_probs_target=None,
    plan=None,
):
    c_bar, rho_bar = _scalar(c_bar), _scalar(rho_bar)
    if truncateds is None:
        raise ValueError("truncateds is required")
    N, T, one_d = _shape(rewards)
    G = _per_step("gamma", gamma, N, T, one_d)
    LAM = _per_step("lambda_", lambda_, N, T, one_d)
    P = _cells(_as_2d(action_probs_target, one_d), detach=True)
    MU = _cells(_as_2d(action_probs_behavior, one_d), detach=True)
    NP = _cells(_as_2d(next_action_probs_target, one_d), detach=True)
    Q = _cells(_as_2d(q_values, one_d))
    NQ = _cells(_as_2d(next_q_values_all, one_d))
    ACT = _as_2d(actions, one_d).tolist()
    R = _cells(_as_2d(rewards, one_d))
    term = _flags(_as_2d(terminateds, one_d), N, T)
    trunc = _flags(_as_2d(truncateds, one_d), N, T)

    q_targets = [[0.0] * T for _ in range(N)]
    adv = [[0.0] * T for _ in range(N)]
    for n in range(N):
        c = [0.0] * T
        rho = [0.0] * T
        E = [0.0] * T
        for t in range(T):
            ratio = P[n][t][ACT[n][t]] / MU[n][t]
            c[t] = LAM[n][t] * min(c_bar, ratio)  # c_t uses lambda_t
            rho[t] = min(rho_bar, ratio)
            dist = NP[n][t] if NP is not None else P[n][t]
            e = 0.0
            for a in range(len(dist)):
                e = e + dist[a] * NQ[n][t][a]
            E[t] = e
        delta_next = 0.0  # Δ_T = 0
        for t in reversed(range(T)):
            done = term[n][t] or trunc[n][t]
            gamma = G[n][t]
            delta = R[n][t] + gamma * (1 - term[n][t]) * E[t] - Q[n][t]
            c_next = c[t + 1] if t < T - 1 else 0.0
            d = delta + gamma * c_next * (1 - done) * delta_next
            q_targets[n][t] = Q[n][t] + d
            delta_next = d
        for t in range(T):
            boundary = trunc[n][t] or t == T - 1
            x = E[t] if boundary else q_targets[n][t + 1]
            adv[n][t] = rho[t] * (R[n][t] + G[n][t] * (1 - term[n][t]) * x - Q[n][t])
    return _assemble(q_targets, N, T, one_d), _assemble(adv, N, T, one_d)


def compute_discounted_returns(rewards, terminateds, truncateds=None, *, gamma, bootstrap_values=None, plan=None):
    N, T, one_d = _shape(rewards)
    G = _per_step("gamma", gamma, N, T, one_d)
    R = _cells(_as_2d(rewards, one_d))
    B = _cells(_as_2d(bootstrap_values, one_d))
    term = _flags(_as_2d(terminateds, one_d), N, T)
    trunc = _flags(_as_2d(truncateds, one_d), N, T)

    out = [[0.0] * T for _ in range(N)]
    for n in range(N):
        g_next = None
        for t in reversed(range(T)):
            boundary = trunc[n][t] or t == T - 1
            y = _boot(B, None, n, t, T) if boundary else g_next
            g = R[n][t] + G[n][t] * (1 - term[n][t]) * y
            out[n][t] = g
            g_next = g
    return _assemble(out, N, T, one_d)


def compute_lambda_returns(
    rewards, next_values, terminateds, truncateds=None, *, gamma, lambda_, bootstrap_values=None, plan=None
):
    N, T, one_d = _shape(rewards)
    G = _per_step("gamma", gamma, N, T, one_d)
    LAM = _per_step("lambda_", lambda_, N, T, one_d)
    R = _cells(_as_2d(rewards, one_d))
    NV = _cells(_as_2d(next_values, one_d))
    B = _cells(_as_2d(bootstrap_values, one_d))
    term = _flags(_as_2d(terminateds, one_d), N, T)
    trunc = _flags(_as_2d(truncateds, one_d), N, T)

    out = [[0.0] * T for _ in range(N)]
    for n in range(N):
        g_next = None
        for t in reversed(range(T)):
            boot = _boot(B, None, n, t, T)
            lam = LAM[n][t]
            nv = boot if (trunc[n][t] and B is not None) else NV[n][t]
            if trunc[n][t]:
                x = boot
            elif t == T - 1:
                x = (1 - lam) * nv + lam * boot
            else:
                x = (1 - lam) * nv + lam * g_next
            g = R[n][t] + G[n][t] * (1 - term[n][t]) * x
            out[n][t] = g
            g_next = g
    return _assemble(out, N, T, one_d)


def compute_eligibility_traces(gradients, dones, *, gamma, lambda_, seed_values=None, plan=None):
    gamma, lam = _scalar(gamma), _scalar(lambda_)
    _check_unit("gamma", gamma)
    _check_unit("lambda_", lam)
    N, T, one_d = _shape(gradients)
    G = _cells(_as_2d(gradients, one_d))
    S = _env_cells(seed_values, one_d)
    done = _flags(_as_2d(dones, one_d), N, T)

    out = [[0.0] * T for _ in range(N)]
    for n in range(N):
        e_prev = S[n] if S is not None else 0.0  # e_{-1}
        done_prev = 0  # done_{-1}
        for t in range(T):
            e = G[n][t] + gamma * lam * (1 - done_prev) * e_prev
            out[n][t] = e
            e_prev, done_prev = e, done[n][t]
    return _assemble(out, N, T, one_d)


def compute_episodic_prefix_sum(inputs, dones, *, boundary="ends_at", seed_values=None, plan=None):
    if boundary not in ("ends_at", "starts_at"):
        raise ValueError(f"unknown boundary {boundary!r}")
    N, T, one_d = _shape(inputs)
    X = _cells(_as_2d(inputs, one_d))
    S0 = _env_cells(seed_values, one_d)
    done = _flags(_as_2d(dones, one_d), N, T)

    out = [[0.0] * T for _ in range(N)]
    for n in range(N):
        s_prev = S0[n] if S0 is not None else 0.0  # S_{-1}
        for t in range(T):
            if boundary == "ends_at":
                reset = done[n][t - 1] if t > 0 else 0  # done_{-1} = 0
            else:
                reset = done[n][t]
            s = X[n][t] + (1 - reset) * s_prev
            out[n][t] = s
            s_prev = s
    return _assemble(out, N, T, one_d)
