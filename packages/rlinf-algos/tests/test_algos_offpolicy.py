"""Off-policy / offline losses: loop references, hand-computed cases, numpy == torch, gradients, shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_algos import (
    aggregate_q,
    crossq_critic_target,
    expectile_loss,
    iql_actor_loss,
    iql_critic_loss,
    iql_critic_target,
    iql_value_loss,
    sac_actor_loss,
    sac_alpha,
    sac_alpha_param_init,
    sac_critic_loss,
    sac_critic_target,
    sac_temperature_loss,
    soft_target_update,
    split_crossq_q,
    subsample_q_heads,
    td3_critic_target,
    td3_target_actions,
)

# ------------------------------------------------------------------------------------------------------
# slow scalar references, written from docs/algorithms.md#off-policy
# ------------------------------------------------------------------------------------------------------


def ref_sac_target(rewards, next_q, next_logp, terms, *, gamma, alpha, agg, backup, bootstrap, idx=None):
    out = []
    for b in range(len(rewards)):
        heads = list(next_q[b]) if idx is None else [next_q[b][i] for i in idx]
        q = min(heads) if agg == "min" else sum(heads) / len(heads)
        if backup:
            q = q - alpha * sum(next_logp[b])
        r = sum(rewards[b])
        if bootstrap == "always":
            out.append(r + gamma * q)
        else:
            done = any(bool(t) for t in terms[b])
            out.append(r + (0.0 if done else 1.0) * gamma * q)
    return out


def ref_sac_critic_loss(q, y):
    total, n = 0.0, 0
    for b in range(len(q)):
        for h in range(len(q[b])):
            total += (q[b][h] - y[b]) ** 2
            n += 1
    return total / n


def ref_sac_actor_loss(logp, q, *, alpha, agg):
    total = 0.0
    for b in range(len(q)):
        qa = min(q[b]) if agg == "min" else sum(q[b]) / len(q[b])
        total += alpha * sum(logp[b]) - qa
    return total / len(q)


def ref_expectile(d, tau):
    return (1 - tau if d < 0 else tau) * d * d


def ref_iql_value(q, v, tau):
    return sum(ref_expectile(min(q[b]) - v[b], tau) for b in range(len(v))) / len(v)


def ref_iql_actor(logp, q, v, beta, wmax=100.0):
    return -sum(min(math.exp(beta * (min(q[b]) - v[b])), wmax) * logp[b] for b in range(len(v))) / len(v)


def ref_iql_critic(q, y):
    return sum(sum((q[b][h] - y[b]) ** 2 for h in range(len(q[b]))) for b in range(len(y))) / len(y)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def _batch(rng, b=6, h=4, c=3, k=2):
    return {
        "rewards": rng.normal(size=(b, c)).astype(np.float32),
        "next_q": rng.normal(size=(b, h)).astype(np.float32),
        "next_logp": rng.normal(size=(b, k)).astype(np.float32),
        "terms": rng.random((b, c)) < 0.2,
        "q": rng.normal(size=(b, h)).astype(np.float32),
    }


# ------------------------------------------------------------------------------------------------------
# SAC target and losses
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("agg", ["min", "mean"])
@pytest.mark.parametrize("backup", [True, False])
@pytest.mark.parametrize("bootstrap", ["standard", "always"])
def test_sac_target_matches_loop(rng, agg, backup, bootstrap):
    d = _batch(rng)
    d["terms"][0, 1] = True
    got = sac_critic_target(
        d["rewards"],
        d["next_q"],
        d["next_logp"],
        d["terms"],
        gamma=0.9,
        alpha=0.3,
        agg_q=agg,
        backup_entropy=backup,
        bootstrap_type=bootstrap,
    )
    want = ref_sac_target(
        d["rewards"].tolist(),
        d["next_q"].tolist(),
        d["next_logp"].tolist(),
        d["terms"].tolist(),
        gamma=0.9,
        alpha=0.3,
        agg=agg,
        backup=backup,
        bootstrap=bootstrap,
    )
    assert got.shape == (6, 1)
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-6, atol=1e-6)


def test_sac_target_hand_computed():
    rewards = np.array([[1.0, 0.5], [0.0, 0.0]], dtype=np.float32)
    next_q = np.array([[2.0, 3.0], [4.0, -1.0]], dtype=np.float32)
    next_logp = np.array([-1.0, 0.5], dtype=np.float32)
    terms = np.array([[False, False], [False, True]])
    y = sac_critic_target(rewards, next_q, next_logp, terms, gamma=0.5, alpha=0.2)
    # sample 0: r=1.5, min Q'=2, minus 0.2*(-1) -> 2.2, y = 1.5 + 0.5*2.2 = 2.6 ; sample 1: terminated -> 0
    np.testing.assert_allclose(y, [[2.6], [0.0]], rtol=1e-6)
    y_mean = sac_critic_target(
        rewards, next_q, None, None, gamma=0.5, agg_q="mean", backup_entropy=False, bootstrap_type="always"
    )
    np.testing.assert_allclose(y_mean, [[1.5 + 0.5 * 2.5], [0.5 * 1.5]], rtol=1e-6)


def test_sac_target_subsampled_heads_with_replacement(rng):
    d = _batch(rng, h=10)
    idx = np.array([3, 3, 7])
    got = sac_critic_target(
        d["rewards"], d["next_q"], d["next_logp"], d["terms"], gamma=0.96, alpha=0.1, head_index=idx
    )
    want = ref_sac_target(
        d["rewards"].tolist(),
        d["next_q"].tolist(),
        d["next_logp"].tolist(),
        d["terms"].tolist(),
        gamma=0.96,
        alpha=0.1,
        agg="min",
        backup=True,
        bootstrap="standard",
        idx=[3, 3, 7],
    )
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-6)
    np.testing.assert_array_equal(subsample_q_heads(d["next_q"], idx), d["next_q"][:, [3, 3, 7]])


def test_sac_target_1d_inputs_equal_2d(rng):
    d = _batch(rng, c=1, k=1)
    a = sac_critic_target(
        d["rewards"][:, 0], d["next_q"], d["next_logp"][:, 0], d["terms"][:, 0], gamma=0.9, alpha=0.5
    )
    b = sac_critic_target(d["rewards"], d["next_q"], d["next_logp"], d["terms"], gamma=0.9, alpha=0.5)
    np.testing.assert_allclose(a, b, rtol=1e-7)


def test_crossq_target_equals_sac_math_and_split(rng):
    d = _batch(rng)
    joint = np.concatenate([d["q"], d["next_q"]], axis=0)
    q, next_q = split_crossq_q(joint)
    np.testing.assert_array_equal(q, d["q"])
    np.testing.assert_array_equal(next_q, d["next_q"])
    a = crossq_critic_target(
        d["rewards"], next_q, d["next_logp"], None, gamma=0.8, alpha=0.1, bootstrap_type="always"
    )
    b = sac_critic_target(
        d["rewards"], d["next_q"], d["next_logp"], None, gamma=0.8, alpha=0.1, bootstrap_type="always"
    )
    np.testing.assert_allclose(a, b, rtol=1e-7)


def test_crossq_gradient_only_through_current_half():
    joint = torch.randn(8, 2, requires_grad=True)
    q, next_q = split_crossq_q(joint)
    y = crossq_critic_target(
        torch.zeros(4, 1), next_q, torch.zeros(4), None, gamma=0.9, bootstrap_type="always"
    )
    sac_critic_loss(q, y).backward()
    assert joint.grad is not None
    assert torch.all(joint.grad[4:] == 0) and torch.any(joint.grad[:4] != 0)


def test_sac_critic_loss_matches_loop(rng):
    d = _batch(rng)
    y = rng.normal(size=(6, 1)).astype(np.float32)
    got = sac_critic_loss(d["q"], y)
    assert np.ndim(got) == 0
    np.testing.assert_allclose(got, ref_sac_critic_loss(d["q"].tolist(), y[:, 0].tolist()), rtol=1e-6)
    np.testing.assert_allclose(sac_critic_loss(d["q"], y[:, 0]), got, rtol=1e-7)
    # equals torch's F.mse_loss(Q, y.expand_as(Q)) — RLinf's formula
    tq, ty = torch.from_numpy(d["q"]), torch.from_numpy(y)
    ref = torch.nn.functional.mse_loss(tq, ty.expand_as(tq))
    torch.testing.assert_close(sac_critic_loss(tq, ty), ref)


@pytest.mark.parametrize("agg", ["min", "mean"])
def test_sac_actor_loss_matches_loop(rng, agg):
    d = _batch(rng)
    loss, entropy = sac_actor_loss(d["next_logp"], d["q"], alpha=0.25, agg_q=agg)
    np.testing.assert_allclose(
        loss, ref_sac_actor_loss(d["next_logp"].tolist(), d["q"].tolist(), alpha=0.25, agg=agg), rtol=1e-6
    )
    np.testing.assert_allclose(entropy, -d["next_logp"].sum(-1).mean(), rtol=1e-6)


def test_sac_target_gradients_detached():
    rewards = torch.randn(5, 2, requires_grad=True)
    next_q = torch.randn(5, 3, requires_grad=True)
    next_logp = torch.randn(5, 2, requires_grad=True)
    alpha = torch.tensor([0.2], requires_grad=True)
    y = sac_critic_target(
        rewards, next_q, next_logp, torch.zeros(5, 2, dtype=torch.bool), gamma=0.9, alpha=alpha
    )
    assert not y.requires_grad
    q = torch.randn(5, 3, requires_grad=True)
    sac_critic_loss(q, y).backward()
    assert q.grad is not None and torch.any(q.grad != 0)
    for t in (rewards, next_q, next_logp, alpha):
        assert t.grad is None


def test_sac_actor_gradients_flow_to_logp_and_q_not_alpha():
    logp = torch.randn(4, 3, requires_grad=True)
    q = torch.randn(4, 2, requires_grad=True)
    alpha = torch.tensor([0.5], requires_grad=True)
    loss, entropy = sac_actor_loss(logp, q, alpha=alpha)
    assert not entropy.requires_grad
    loss.backward()
    torch.testing.assert_close(logp.grad, torch.full((4, 3), 0.5 / 4))
    assert alpha.grad is None
    # min over heads: gradient -1/B on the argmin head only
    expected = torch.zeros(4, 2)
    expected[torch.arange(4), q.detach().argmin(1)] = -0.25
    torch.testing.assert_close(q.grad, expected)


@pytest.mark.parametrize("alpha_type", ["softplus", "exp", "fixed_alpha"])
@pytest.mark.parametrize("initial_alpha", [0.01, 0.2, 1.0])
def test_alpha_parametrisations_roundtrip(alpha_type, initial_alpha):
    b = sac_alpha_param_init(initial_alpha, alpha_type=alpha_type)
    param = torch.tensor([b], dtype=torch.float64, requires_grad=True)
    alpha = sac_alpha(param, alpha_type=alpha_type)
    torch.testing.assert_close(alpha, torch.tensor([initial_alpha], dtype=torch.float64))
    np.testing.assert_allclose(sac_alpha(np.array([b]), alpha_type=alpha_type), [initial_alpha], rtol=1e-12)


def test_softplus_matches_torch_including_threshold():
    x = torch.tensor([-30.0, -2.0, 0.0, 3.0, 19.9, 20.0, 20.1, 60.0], requires_grad=True)
    a = sac_alpha(x)
    torch.testing.assert_close(a, torch.nn.functional.softplus(x.detach()))
    a.sum().backward()
    assert torch.all(torch.isfinite(x.grad))
    torch.testing.assert_close(x.grad, torch.sigmoid(x.detach()).where(x.detach() <= 20, torch.ones(())))


def test_temperature_loss_hand_computed_and_gradient():
    param = torch.tensor([sac_alpha_param_init(0.1, alpha_type="exp")], requires_grad=True)
    logp = torch.tensor([[-1.0, -2.0], [0.0, -1.0]], requires_grad=True)  # row sums -3, -1 -> mean -2
    alpha = sac_alpha(param, alpha_type="exp")
    loss = sac_temperature_loss(alpha, logp, target_entropy=-4.0)
    torch.testing.assert_close(loss, torch.tensor([-0.1 * (-2.0 - 4.0)]))
    loss.sum().backward()
    assert logp.grad is None
    # d/db of -exp(b) * (-6) = 6 * exp(b) = 0.6
    torch.testing.assert_close(param.grad, torch.tensor([0.6]))
    np.testing.assert_allclose(
        sac_temperature_loss(np.float32(0.1), logp.detach().numpy(), target_entropy=-4.0), 0.6, rtol=1e-6
    )


# ------------------------------------------------------------------------------------------------------
# IQL
# ------------------------------------------------------------------------------------------------------


def test_expectile_hand_computed():
    d = np.array([-2.0, -0.5, 0.0, 1.0, 3.0])
    np.testing.assert_allclose(expectile_loss(d, expectile=0.7), [0.3 * 4, 0.3 * 0.25, 0.0, 0.7, 0.7 * 9])
    np.testing.assert_allclose(expectile_loss(d, expectile=0.5), 0.5 * d**2)


@given(
    st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=12),
    st.floats(0.05, 0.95),
)
@settings(max_examples=50, deadline=None)
def test_iql_value_loss_property(vals, tau):
    v = np.array(vals)
    q = np.stack([v + 1.0, v - 0.5, v + 2.0], axis=1)  # min head = v - 0.5 + noise-free shift
    values = np.zeros_like(v)
    got = iql_value_loss(q, values, expectile=tau)
    np.testing.assert_allclose(got, ref_iql_value(q.tolist(), values.tolist(), tau), rtol=1e-9, atol=1e-12)


def test_iql_losses_match_loop(rng):
    b, h = 7, 2
    q_t = rng.normal(size=(b, h))
    v = rng.normal(size=b)
    logp = rng.normal(size=b)
    np.testing.assert_allclose(
        iql_value_loss(q_t, v, expectile=0.7), ref_iql_value(q_t.tolist(), v.tolist(), 0.7), rtol=1e-12
    )
    loss, adv = iql_actor_loss(logp, q_t * 5, v, temperature=3.0)  # some weights hit the 100 clamp
    assert np.any(np.exp(3.0 * adv) > 100.0)
    np.testing.assert_allclose(
        loss, ref_iql_actor(logp.tolist(), (q_t * 5).tolist(), v.tolist(), 3.0), rtol=1e-12
    )
    np.testing.assert_allclose(adv, (q_t * 5).min(1) - v)
    r, nv, m = rng.normal(size=b), rng.normal(size=b), (rng.random(b) > 0.3).astype(np.float64)
    y = iql_critic_target(r, nv, m, gamma=0.99)
    np.testing.assert_allclose(y, [r[i] + 0.99 * m[i] * nv[i] for i in range(b)])
    q = rng.normal(size=(b, h))
    np.testing.assert_allclose(iql_critic_loss(q, y), ref_iql_critic(q.tolist(), y.tolist()), rtol=1e-12)


def test_iql_gradients():
    q_t = torch.randn(5, 2, requires_grad=True)
    v = torch.randn(5, requires_grad=True)
    iql_value_loss(q_t, v, expectile=0.7).backward()
    assert q_t.grad is None and v.grad is not None
    v.grad = None
    logp = torch.randn(5, requires_grad=True)
    loss, adv = iql_actor_loss(logp, q_t, v, temperature=3.0)
    loss.backward()
    assert v.grad is None and q_t.grad is None and not adv.requires_grad
    torch.testing.assert_close(logp.grad, -torch.clamp(torch.exp(3.0 * adv), max=100.0) / 5)
    nv = torch.randn(5, requires_grad=True)
    y = iql_critic_target(torch.randn(5), nv, torch.ones(5), gamma=0.9)
    assert not y.requires_grad
    q = torch.randn(5, 2, requires_grad=True)
    iql_critic_loss(q, y).backward()
    torch.testing.assert_close(q.grad, 2 * (q.detach() - y[:, None]) / 5)


# ------------------------------------------------------------------------------------------------------
# TD3
# ------------------------------------------------------------------------------------------------------


def test_td3_target_actions_hand_computed():
    a = np.array([[0.9, -0.2], [0.0, -0.95]], dtype=np.float32)
    eps = np.array([[1.0, -5.0], [0.5, -1.0]], dtype=np.float32)
    got = td3_target_actions(a, eps, noise_std=0.2, noise_clip=0.5)
    # noise 0.2, -1.0->-0.5 ; 0.1, -0.2 ; then clip to [-1, 1]
    np.testing.assert_allclose(got, [[1.0, -0.7], [0.1, -1.0]], rtol=1e-6)
    got_b = td3_target_actions(
        a,
        eps,
        noise_std=0.2,
        noise_clip=0.5,
        action_low=np.array([-0.5, -2.0]),
        action_high=np.array([0.5, 2.0]),
    )
    np.testing.assert_allclose(got_b, [[0.5, -0.7], [0.1, -1.15]], rtol=1e-6)


def test_td3_target_is_sac_without_entropy(rng):
    d = _batch(rng)
    a = td3_critic_target(d["rewards"], d["next_q"], d["terms"], gamma=0.99)
    b = sac_critic_target(d["rewards"], d["next_q"], None, d["terms"], gamma=0.99, backup_entropy=False)
    np.testing.assert_allclose(a, b)
    t = td3_target_actions(torch.zeros(3, 2, requires_grad=True), torch.randn(3, 2))
    assert not t.requires_grad


# ------------------------------------------------------------------------------------------------------
# numpy == torch
# ------------------------------------------------------------------------------------------------------


def test_numpy_equals_torch(rng):
    d = _batch(rng)
    T = {k: torch.from_numpy(v) for k, v in d.items()}
    pairs = [
        (
            sac_critic_target(
                d["rewards"],
                d["next_q"],
                d["next_logp"],
                d["terms"],
                gamma=0.9,
                alpha=0.2,
                head_index=np.array([0, 2]),
            ),
            sac_critic_target(
                T["rewards"],
                T["next_q"],
                T["next_logp"],
                T["terms"],
                gamma=0.9,
                alpha=0.2,
                head_index=torch.tensor([0, 2]),
            ),
        ),
        (sac_critic_loss(d["q"], d["rewards"][:, :1]), sac_critic_loss(T["q"], T["rewards"][:, :1])),
        (
            sac_actor_loss(d["next_logp"], d["q"], alpha=0.3)[0],
            sac_actor_loss(T["next_logp"], T["q"], alpha=0.3)[0],
        ),
        (aggregate_q(d["q"], agg="mean"), aggregate_q(T["q"], agg="mean")),
        (sac_alpha(d["q"]), sac_alpha(T["q"])),
        (
            iql_value_loss(d["q"], d["rewards"][:, 0], expectile=0.7),
            iql_value_loss(T["q"], T["rewards"][:, 0], expectile=0.7),
        ),
        (
            iql_actor_loss(d["rewards"][:, 1], d["q"], d["rewards"][:, 0], temperature=3.0)[0],
            iql_actor_loss(T["rewards"][:, 1], T["q"], T["rewards"][:, 0], temperature=3.0)[0],
        ),
        (iql_critic_loss(d["q"], d["rewards"][:, 0]), iql_critic_loss(T["q"], T["rewards"][:, 0])),
        (td3_target_actions(d["q"], d["next_q"]), td3_target_actions(T["q"], T["next_q"])),
    ]
    for a, b in pairs:
        assert isinstance(b, torch.Tensor)
        np.testing.assert_allclose(np.asarray(a), b.numpy(), rtol=1e-6, atol=1e-7)


# ------------------------------------------------------------------------------------------------------
# soft target update
# ------------------------------------------------------------------------------------------------------


def test_soft_target_update_torch_parameters_match_rlinf():
    torch.manual_seed(0)
    online = torch.nn.Linear(3, 2)
    target = torch.nn.Linear(3, 2)
    expected = [
        (1 - 0.005) * t.detach().clone() + 0.005 * s.detach()
        for t, s in zip(target.parameters(), online.parameters(), strict=True)
    ]
    soft_target_update(target.parameters(), online.parameters(), tau=0.005)
    for t, e in zip(target.parameters(), expected, strict=True):
        torch.testing.assert_close(t.detach(), e)
        assert t.requires_grad and t.grad_fn is None
    soft_target_update(target.parameters(), online.parameters(), tau=1.0)
    for t, s in zip(target.parameters(), online.parameters(), strict=True):
        torch.testing.assert_close(t, s, rtol=0, atol=0)


def test_soft_target_update_numpy_in_place():
    t = [np.zeros(3), np.ones((2, 2))]
    s = [np.ones(3), np.zeros((2, 2))]
    ids = [id(x) for x in t]
    soft_target_update(t, s, tau=0.25)
    assert [id(x) for x in t] == ids
    np.testing.assert_allclose(t[0], 0.25)
    np.testing.assert_allclose(t[1], 0.75)


def test_soft_target_update_errors():
    with pytest.raises(ValueError, match=r"targets\[1\] has shape \[2\] but sources\[1\] has shape \[3\]"):
        soft_target_update([np.zeros(1), np.zeros(2)], [np.zeros(1), np.zeros(3)], tau=0.1)
    with pytest.raises(ValueError, match="same length"):
        soft_target_update([np.zeros(1)], [], tau=0.1)
    with pytest.raises(ValueError, match="tau"):
        soft_target_update([np.zeros(1)], [np.zeros(1)], tau=1.5)
    ro = np.zeros(2)
    ro.flags.writeable = False
    with pytest.raises(TypeError, match=r"targets\[0\]"):
        soft_target_update([ro], [np.ones(2)], tau=0.5)


# ------------------------------------------------------------------------------------------------------
# bad shapes and options
# ------------------------------------------------------------------------------------------------------


def test_bad_shapes_name_argument_and_shape():
    q = np.zeros((4, 2))
    with pytest.raises(ValueError, match=r"next_q_values.*\[B, H\].*\(4,\)"):
        sac_critic_target(np.zeros(4), np.zeros(4), None, None, gamma=0.9, backup_entropy=False)
    with pytest.raises(ValueError, match=r"rewards.*B=4.*\(3, 1\)"):
        sac_critic_target(np.zeros((3, 1)), q, np.zeros(4), np.zeros(4), gamma=0.9)
    with pytest.raises(ValueError, match=r"terminations.*\(4, 1, 1\)"):
        sac_critic_target(np.zeros(4), q, np.zeros(4), np.zeros((4, 1, 1)), gamma=0.9)
    with pytest.raises(ValueError, match=r"next_log_probs.*\(5,\)"):
        sac_critic_target(np.zeros(4), q, np.zeros(5), np.zeros(4), gamma=0.9)
    with pytest.raises(ValueError, match=r"target.*\(4, 2\)"):
        sac_critic_loss(q, np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"log_probs.*\(3,\)"):
        sac_actor_loss(np.zeros(3), q, alpha=0.1)
    with pytest.raises(ValueError, match=r"values.*\[B\].*\(4, 1\)"):
        iql_value_loss(q, np.zeros((4, 1)), expectile=0.7)
    with pytest.raises(ValueError, match=r"target_q_values.*\(4,\)"):
        iql_actor_loss(np.zeros(4), np.zeros(4), np.zeros(4), temperature=1.0)
    with pytest.raises(ValueError, match=r"masks.*\(3,\)"):
        iql_critic_target(np.zeros(4), np.zeros(4), np.zeros(3), gamma=0.9)
    with pytest.raises(ValueError, match=r"noise.*\[4, 2\].*\[4, 3\]"):
        td3_target_actions(q, np.zeros((4, 3)))
    with pytest.raises(ValueError, match=r"joint_q_values.*\(5, 2\)"):
        split_crossq_q(np.zeros((5, 2)))
    with pytest.raises(ValueError, match=r"head_index.*\[0, 2\)"):
        subsample_q_heads(q, np.array([0, 2]))
    with pytest.raises(ValueError, match="integer"):
        subsample_q_heads(q, np.array([0.0]))


def test_bad_options_list_allowed_values():
    q = np.zeros((2, 2))
    with pytest.raises(ValueError, match=r"agg.*\['min', 'mean'\].*'max'"):
        aggregate_q(q, agg="max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"bootstrap_type.*'never'"):
        sac_critic_target(np.zeros(2), q, np.zeros(2), np.zeros(2), gamma=0.9, bootstrap_type="never")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"alpha_type.*'relu'"):
        sac_alpha(q, alpha_type="relu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="initial_alpha"):
        sac_alpha_param_init(0.0)
    with pytest.raises(ValueError, match="expectile"):
        expectile_loss(q, expectile=1.0)
    with pytest.raises(ValueError, match="next_log_probs is required"):
        sac_critic_target(np.zeros(2), q, None, np.zeros(2), gamma=0.9)
    with pytest.raises(ValueError, match="terminations is required"):
        sac_critic_target(np.zeros(2), q, np.zeros(2), None, gamma=0.9)


@given(
    b=st.integers(1, 6),
    h=st.integers(1, 5),
    c=st.integers(1, 4),
    gamma=st.floats(0.0, 1.0),
    alpha=st.floats(0.0, 2.0),
    agg=st.sampled_from(["min", "mean"]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_sac_target_property_random_shapes(b, h, c, gamma, alpha, agg, seed):
    g = np.random.default_rng(seed)
    r, q, lp = g.normal(size=(b, c)), g.normal(size=(b, h)), g.normal(size=(b, c))
    term = g.random((b, c)) < 0.3
    got = sac_critic_target(r, q, lp, term, gamma=gamma, alpha=alpha, agg_q=agg)
    want = ref_sac_target(
        r.tolist(),
        q.tolist(),
        lp.tolist(),
        term.tolist(),
        gamma=gamma,
        alpha=alpha,
        agg=agg,
        backup=True,
        bootstrap="standard",
    )
    np.testing.assert_allclose(got[:, 0], want, rtol=1e-12, atol=1e-12)
    # gamma = 0: the target is the undiscounted chunk reward sum
    np.testing.assert_allclose(sac_critic_target(r, q, lp, term, gamma=0.0, alpha=alpha)[:, 0], r.sum(1))


def test_soft_target_update_float32_shadow_of_bf16_source():
    shadow = torch.zeros(4, dtype=torch.float32)
    online = torch.full((4,), 0.3, dtype=torch.bfloat16)
    soft_target_update([shadow], [online], tau=0.005)
    torch.testing.assert_close(shadow, torch.full((4,), 0.005 * float(online[0])), rtol=1e-6, atol=0)
    assert shadow.dtype == torch.float32
