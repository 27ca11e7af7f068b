"""rl_triton.modules.Retrace against a float64 loop written from docs/semantics.md (compute_retrace).

TorchRL has no Retrace estimator, so the reference is the normative formula applied to the
rollout's entries: Q(s_t, .) = "action_value", Q(s_{t+1}, .) = ("next", "action_value"),
pi(. | s_t) = "target_probs" (pi(. | s_{t+1}) = ("next", "target_probs") when present),
mu(a_t | s_t) = exp(behaviour log-prob), a_t = "action" (index or one-hot), and reward / done /
terminated / truncated under "next". Outputs "value_target" (Q targets) and "advantage" have the
reward's shape.
"""

import pytest
import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torch.distributions import Categorical
from torchrl.modules import ProbabilisticActor
from torchrl.objectives.value import ValueEstimatorBase

from rl_triton.modules import Retrace
from tests.modules._rollouts import LAYOUTS, OBS_DIM, assert_tensor_close, rollout, time_axis

A = 4
GAMMA = 0.95
F64 = torch.float64


def reference(td, *, gamma=GAMMA, lmbda=1.0, c_bar=1.0, rho_bar=1.0, axis=None, lp_key="action_log_prob",
              keys=None, q=None, next_q=None, pi=None, next_pi=None):  # fmt: skip
    """(value_target, advantage) by the docs/semantics.md loop in float64; shaped like the reward.
    Inputs that require grad keep their graph (for the gradient tests)."""
    k = {"reward": "reward", "done": "done", "terminated": "terminated", "action_value": "action_value",
         "target_probs": "target_probs", "action": "action", **(keys or {})}  # fmt: skip
    axis = td.ndim - 1 if axis is None else axis
    bs = td.batch_size

    def rows(x, extra=0):  # time to the last batch position, batch flattened: (N, T[, A])
        x = x.reshape(*bs, *x.shape[len(bs) :]) if extra else x.reshape(bs)
        x = x.movedim(axis, len(bs) - 1)
        return x.reshape(-1, bs[axis], *x.shape[len(bs) :]).to("cpu", F64)

    q_all = rows(td[k["action_value"]] if q is None else q, 1)
    nq_all = rows(td["next", k["action_value"]] if next_q is None else next_q, 1)
    pi_all = rows(td[k["target_probs"]] if pi is None else pi, 1).detach()
    if next_pi is None and ("next", k["target_probs"]) in td.keys(True):
        next_pi = td["next", k["target_probs"]]
    w_all = pi_all if next_pi is None else rows(next_pi, 1).detach()
    act = td[k["action"]]
    if act.shape[-1:] == (A,) and act.dim() == len(bs) + 1:
        act = act.argmax(-1)
    act = rows(act).long()
    mu = rows(td[lp_key]).detach().exp()
    r = rows(td["next", k["reward"]])
    term = rows(td["next", k["terminated"]]).bool()
    done = rows(td["next", k["done"]]).bool()
    trunc = done & ~term
    if ("next", "truncated") in td.keys(True):
        trunc = trunc | (rows(td["next", "truncated"]).bool() & ~term)
    N, T = r.shape
    qt_rows, adv_rows = [], []
    for n in range(N):
        qa = [q_all[n, t, act[n, t]] for t in range(T)]
        ratio = [(pi_all[n, t, act[n, t]] / mu[n, t]).item() for t in range(T)]
        c = [lmbda * min(c_bar, x) for x in ratio]
        rho = [min(rho_bar, x) for x in ratio]
        E = [(w_all[n, t] * nq_all[n, t]).sum() for t in range(T)]
        tm = [float(term[n, t]) for t in range(T)]
        dn = [float(done[n, t] or term[n, t]) for t in range(T)]
        delta = [r[n, t] + gamma * (1 - tm[t]) * E[t] - qa[t] for t in range(T)]
        D, qt = 0.0, [None] * T
        for t in reversed(range(T)):
            c_next = c[t + 1] if t < T - 1 else 0.0
            D = delta[t] + gamma * c_next * (1 - dn[t]) * D
            qt[t] = qa[t] + D
        adv = []
        for t in range(T):
            boundary = bool(trunc[n, t]) or t == T - 1
            X = E[t] if boundary else qt[t + 1]
            adv.append(rho[t] * (r[n, t] + gamma * (1 - tm[t]) * X - qa[t]))
        qt_rows.append(torch.stack([torch.as_tensor(x, dtype=F64) for x in qt]))
        adv_rows.append(torch.stack([torch.as_tensor(x, dtype=F64) for x in adv]))
    shape = td["next", k["reward"]].shape
    moved = (*bs[:axis], *bs[axis + 1 :], bs[axis])

    def back(y):
        return torch.stack(y).reshape(moved).movedim(-1, axis).reshape(shape)

    return back(qt_rows), back(adv_rows)


def retrace_rollout(batch_size, *, axis=None, names=None, device="cpu", one_hot=False, next_probs=False,
                    lp_key="action_log_prob", **kw):  # fmt: skip
    """A rollout with Q(s, .) consistent across steps inside an episode, target probabilities, a
    behaviour-sampled action and its behaviour log-prob."""
    td = rollout(batch_size, time_axis_=axis, names=names, device="cpu", **kw)
    bs = td.batch_size
    ax = len(bs) - 1 if axis is None else axis
    nq = torch.randn(*bs, A)
    q = torch.randn(*bs, A)
    # inside an episode Q(s_{t+1}, .) at row t is Q(s_{t+1}, .) at row t+1
    done = td["next", kw.get("done_key", "done")].squeeze(-1)
    q_next_row = nq.narrow(ax, 0, bs[ax] - 1)
    keep = ~done.narrow(ax, 0, bs[ax] - 1)
    q.narrow(ax, 1, bs[ax] - 1).copy_(torch.where(keep.unsqueeze(-1), q_next_row, q.narrow(ax, 1, bs[ax] - 1)))
    pi = torch.softmax(torch.randn(*bs, A), -1) * 0.9 + 0.1 / A
    behaviour = torch.softmax(torch.randn(*bs, A), -1) * 0.9 + 0.1 / A
    action = torch.distributions.Categorical(probs=behaviour).sample()
    td.set("action_value", q)
    td.set(("next", "action_value"), nq)
    td.set("target_probs", pi)
    if next_probs:
        td.set(("next", "target_probs"), torch.softmax(torch.randn(*bs, A), -1))
    td.set("action", nn.functional.one_hot(action, A) if one_hot else action)
    td.set(lp_key, behaviour.gather(-1, action.unsqueeze(-1)).squeeze(-1).log())
    return td.to(device)


def check(td, out, **ref_kw):
    vt, adv = reference(td, **ref_kw)
    assert_tensor_close(out["value_target"], vt.to(out["value_target"].dtype).to(out["value_target"].device),
                        what="value_target")  # fmt: skip
    assert_tensor_close(out["advantage"], adv.to(out["advantage"].dtype).to(out["advantage"].device), what="advantage")


def test_is_a_torchrl_value_estimator():
    assert issubclass(Retrace, ValueEstimatorBase)
    r = Retrace(gamma=0.9)
    assert r.out_keys == ["advantage", "value_target"]
    assert float(r.lmbda) == 1.0 and float(r.c_bar) == 1.0 and float(r.rho_bar) == 1.0


@pytest.mark.parametrize("one_hot", [False, True], ids=["index", "one-hot"])
@pytest.mark.parametrize("layout", ["T", "BT", "TB-td0", "BTA-td1", "BTA-named"])
def test_matches_reference(path, layout, one_hot, rl_triton_calls):
    bs, time_dim, names = LAYOUTS[layout]
    axis = time_axis(bs, time_dim, names)
    td = retrace_rollout(bs, axis=axis, names=names, device=path.device, one_hot=one_hot)
    data = td.clone()
    out = Retrace(gamma=GAMMA, lmbda=0.9, time_dim=time_dim)(data)
    assert out is data
    assert out["advantage"].shape == td["next", "reward"].shape
    check(td, out, lmbda=0.9, axis=axis)
    assert rl_triton_calls["compute_retrace"] > 0


@pytest.mark.parametrize(
    "lmbda, c_bar, rho_bar", [(1.0, 1.0, 1.0), (0.0, 1.0, 1.0), (0.7, 0.5, 2.0), (1.0, 2.0, 0.5)],
    ids=["l1", "l0", "l.7-c.5-r2", "c2-r.5"],
)  # fmt: skip
def test_hyper_parameters(path, lmbda, c_bar, rho_bar):
    td = retrace_rollout((3, 23), device=path.device)
    out = Retrace(gamma=0.9, lmbda=lmbda, c_bar=c_bar, rho_bar=rho_bar)(td.clone())
    check(td, out, gamma=0.9, lmbda=lmbda, c_bar=c_bar, rho_bar=rho_bar)


@pytest.mark.parametrize("pattern", ["none", "last", "trunc", "random"])
def test_done_patterns(path, pattern):
    td = retrace_rollout((3, 23), device=path.device, pattern=pattern, p_term=0.2, p_trunc=0.2)
    out = Retrace(gamma=GAMMA, lmbda=0.8)(td.clone())
    check(td, out, lmbda=0.8)


def test_truncated_entry_optional(path):
    """Without ("next", "truncated") a done step that is not terminated counts as a truncation."""
    td = retrace_rollout((3, 23), device=path.device, p_trunc=0.25)
    with_key = Retrace(gamma=GAMMA)(td.clone())
    without = Retrace(gamma=GAMMA)(td.clone().exclude(("next", "truncated")))
    assert_tensor_close(without["advantage"], with_key["advantage"], what="advantage")
    assert_tensor_close(without["value_target"], with_key["value_target"], what="value_target")
    check(td, with_key)


def test_next_state_target_probs(path):
    """("next", "target_probs") = pi(. | s_{t+1}) weights the expected next Q when present."""
    td = retrace_rollout((3, 23), device=path.device, next_probs=True)
    out = Retrace(gamma=GAMMA, lmbda=0.9)(td.clone())
    check(td, out, lmbda=0.9)


@pytest.mark.parametrize("lp_key", ["sample_log_prob", "action_log_prob"])
def test_behaviour_log_prob_key(path, lp_key):
    """Either of TorchRL's default names for the behaviour log-prob is read."""
    td = retrace_rollout((3, 23), device=path.device, lp_key=lp_key)
    out = Retrace(gamma=GAMMA)(td.clone())
    check(td, out, lp_key=lp_key)


def test_set_keys(path):
    td = retrace_rollout((3, 23), device=path.device, reward_key="my_reward", done_key="my_done",
                         terminated_key="my_terminated")  # fmt: skip
    td.rename_key_("action_value", "q")
    td.rename_key_(("next", "action_value"), ("next", "q"))
    td.rename_key_("target_probs", "pi")
    td.rename_key_("action", "act")
    td.rename_key_("action_log_prob", "mu_lp")
    keys = {"reward": "my_reward", "done": "my_done", "terminated": "my_terminated", "action_value": "q",
            "target_probs": "pi", "action": "act", "advantage": "adv", "value_target": ("out", "q_target")}  # fmt: skip
    mod = Retrace(gamma=GAMMA)
    mod.set_keys(sample_log_prob="mu_lp", **keys)
    out = mod(td.clone())
    vt, adv = reference(td, keys=keys, lp_key="mu_lp")
    assert_tensor_close(out["out", "q_target"], vt.float().to(path.device), what="value_target")
    assert_tensor_close(out["adv"], adv.float().to(path.device), what="advantage")


def test_value_and_actor_networks(path):
    """Q(s, .) from a Q-network on the root and "next" observations, pi from a categorical actor
    (pi(. | s_{t+1}) from the actor on the next observations)."""
    td = retrace_rollout((3, 23), device=path.device).exclude("action_value", ("next", "action_value"), "target_probs")
    qnet = TensorDictModule(nn.Linear(OBS_DIM, A), in_keys=["obs"], out_keys=["action_value"]).to(path.device)
    logits = TensorDictModule(nn.Linear(OBS_DIM, A), in_keys=["obs"], out_keys=["logits"])
    actor = ProbabilisticActor(logits, in_keys=["logits"], distribution_class=Categorical).to(path.device)
    out = Retrace(gamma=GAMMA, lmbda=0.9, value_network=qnet, actor_network=actor)(td.clone())
    with torch.no_grad():
        q, nq = qnet(td.select("obs").clone())["action_value"], qnet(td["next"].select("obs").clone())["action_value"]
        pi = actor.get_dist(td.select("obs").clone()).probs
        npi = actor.get_dist(td["next"].select("obs").clone()).probs
    check(td, out, lmbda=0.9, q=q, next_q=nq, pi=pi, next_pi=npi)


def test_differentiable_gradients(path):
    """Gradients reach the action values and the rewards as the float64 reference's do
    (probabilities are constants)."""
    td = retrace_rollout((2, 15), device=path.device)
    w = torch.randn(2, 15, 1, dtype=F64)
    data = td.clone()
    leaves = [data["action_value"], data["next", "action_value"], data["next", "reward"]]
    for x in leaves:
        x.requires_grad_()
    out = Retrace(gamma=GAMMA, lmbda=0.9, differentiable=True)(data)
    (out["value_target"].double().cpu() * w + out["advantage"].double().cpu().square()).sum().backward()

    ref_leaves = [x.detach().cpu().to(F64).requires_grad_() for x in leaves]
    ref_td = td.clone().cpu().set(("next", "reward"), ref_leaves[2])
    vt, adv = reference(ref_td, lmbda=0.9, q=ref_leaves[0], next_q=ref_leaves[1])
    (vt * w + adv.square()).sum().backward()
    for name, a, e in zip(["action_value", "next_action_value", "reward"], leaves, ref_leaves, strict=True):
        assert a.grad is not None, f"no gradient reached {name}"
        assert_tensor_close(a.grad.double().cpu(), e.grad, atol=1e-4, rtol=1e-4, what=f"grad of {name}")


def test_not_differentiable_by_default(path):
    td = retrace_rollout((2, 15), device=path.device)
    td["action_value"].requires_grad_()
    out = Retrace(gamma=GAMMA)(td)
    assert not out["value_target"].requires_grad and not out["advantage"].requires_grad


def test_average_adv(path):
    td = retrace_rollout((3, 23), device=path.device)
    out = Retrace(gamma=GAMMA, average_adv=True)(td.clone())
    _, adv = reference(td)
    adv = (adv - adv.mean()) / adv.std().clamp_min(1e-5)
    assert_tensor_close(out["advantage"], adv.float().to(path.device), what="advantage")


def test_value_estimate(path):
    td = retrace_rollout((3, 23), device=path.device)
    got = Retrace(gamma=GAMMA, lmbda=0.9).value_estimate(td.clone())
    vt, _ = reference(td, lmbda=0.9)
    assert_tensor_close(got, vt.float().to(path.device), what="value_estimate")


def test_errors(path):
    td = retrace_rollout((2, 9), device=path.device)
    with pytest.raises(KeyError):
        Retrace(gamma=GAMMA)(td.clone().exclude("action_value"))
    with pytest.raises(KeyError):
        Retrace(gamma=GAMMA)(td.clone().exclude("target_probs"))
    with pytest.raises(NotImplementedError):
        Retrace(gamma=GAMMA)(td.clone().set("steps_to_next_obs", torch.ones(2, 9, 1, device=path.device)))
    with pytest.raises(ValueError):
        Retrace(gamma=1.5)
