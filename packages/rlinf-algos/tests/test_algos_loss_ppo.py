"""PPO actor / critic / decoupled / OPD losses: loop references, numpy == torch, gradients, bad shapes."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from rlinf_algos import (
    CRITIC_EXPLAINED_VARIANCE_STAT_KEYS,
    compute_critic_explained_variance_from_stats,
    compute_decoupled_ppo_actor_loss,
    compute_opd_actor_loss,
    compute_ppo_actor_critic_loss,
    compute_ppo_actor_loss,
    compute_ppo_critic_loss,
    get_loss_agg_func,
    huber_loss,
    masked_mean,
    rollout_importance_weights,
    stop_gradient,
)

_spec = importlib.util.spec_from_file_location("_loss_refs", Path(__file__).with_name("_loss_refs.py"))
assert _spec is not None and _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

TOL = {"rtol": 1e-5, "atol": 1e-6}
FAST = settings(max_examples=30, deadline=None)
ACTOR_KEYS = {
    "actor/policy_loss",
    "actor/policy_loss_abs",
    "actor/ratio",
    "actor/ratio_abs",
    "actor/clipped_ratio",
    "actor/dual_cliped_ratio",
    "actor/approx_kl",
    "actor/clip_fraction",
}


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def make(seed: int, shape: tuple[int, ...], mask_shape: tuple[int, ...] | None = None, p: float = 0.7):
    g = np.random.default_rng(seed)
    lp = (g.normal(size=shape) * 0.5 - 1).astype(np.float32)
    old = (lp + 0.4 * g.normal(size=shape)).astype(np.float32)
    ms = mask_shape or shape
    adv = g.normal(size=ms).astype(np.float32)
    mask = g.random(ms) < p
    return lp, old, adv, mask


def assert_metrics(got: dict, want: dict, **tol) -> None:
    assert set(got) == set(want)
    for k, v in want.items():
        np.testing.assert_allclose(float(got[k]), v, err_msg=k, **(tol or TOL))


# ----------------------------------------------------------------------------------------- actor loss
CASES = [
    # shape, mask_shape, kwargs
    ((6, 9), None, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}),
    ((6, 9), None, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0}),  # DAPO + dual
    (
        (6, 9),
        None,
        {
            "clip_ratio_low": 0.1,
            "clip_ratio_high": 0.3,
            "clip_log_ratio_min": -0.3,
            "clip_log_ratio_max": 0.2,
        },
    ),
    (
        (5, 4, 7),
        (5, 4, 1),
        {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_ratio_c": 2.0},
    ),  # token level
    ((12,), None, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}),  # chunk level
    ((5, 3), (5, 1), {"clip_ratio_low": 0.2, "clip_ratio_high": 0.25}),  # mask broadcast over C
]


@pytest.mark.parametrize(("shape", "mask_shape", "kw"), CASES)
@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_actor_loss_matches_loop_reference(shape, mask_shape, kw, agg):
    lp, old, adv, mask = make(1, shape, mask_shape)
    if agg == "seq-mean-token-mean":
        mask[..., 0] = True  # every row needs a token (else NaN, as in RLinf)
    rkw = {"low": kw["clip_ratio_low"], "high": kw["clip_ratio_high"], "c": kw.get("clip_ratio_c")}
    rkw |= {"lr_min": kw.get("clip_log_ratio_min"), "lr_max": kw.get("clip_log_ratio_max")}
    want_loss, want = ref.ppo_actor_ref(lp, old, adv, mask, agg=agg, **rkw)
    for xp_args in ((lp, old, adv, mask), tuple(t(x) for x in (lp, old, adv, mask))):
        loss, metrics = compute_ppo_actor_loss(*xp_args, loss_agg_func=get_loss_agg_func(agg), **kw)
        np.testing.assert_allclose(float(loss), want_loss, **TOL)
        assert_metrics(metrics, want)


def test_actor_loss_embodied_ratio_aggregation_and_warmup():
    lp, old, adv, mask = make(2, (8, 4))
    lms = np.broadcast_to(mask.sum(axis=1, keepdims=True), mask.shape).astype(np.float32) + 1
    kw = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
    want_loss, want = ref.ppo_actor_ref(
        lp, old, adv, mask, low=0.2, high=0.28, max_episode_steps=30, loss_mask_sum=lms
    )
    loss, metrics = compute_ppo_actor_loss(lp, old, adv, mask, max_episode_steps=30, loss_mask_sum=lms, **kw)
    np.testing.assert_allclose(float(loss), want_loss, **TOL)
    assert_metrics(metrics, want)
    # Critic warm-up zeroes the loss but keeps the other metrics.
    loss_w, metrics_w = compute_ppo_actor_loss(t(lp), t(old), t(adv), t(mask), critic_warmup=True, **kw)
    _, want_w = ref.ppo_actor_ref(lp, old, adv, mask, low=0.2, high=0.28, critic_warmup=True)
    assert float(loss_w) == 0.0
    assert_metrics(metrics_w, want_w)


def test_actor_loss_without_mask_is_plain_mean():
    lp, old, adv, _ = make(3, (4, 5))
    want_loss, want = ref.ppo_actor_ref(lp, old, adv, None, low=0.2, high=0.2)
    loss, metrics = compute_ppo_actor_loss(t(lp), t(old), t(adv), clip_ratio_low=0.2, clip_ratio_high=0.2)
    np.testing.assert_allclose(float(loss), want_loss, **TOL)
    assert_metrics(metrics, want)


def test_actor_loss_empty_mask_gives_zero_not_nan():
    lp, old, adv, mask = make(4, (3, 4))
    loss, metrics = compute_ppo_actor_loss(
        lp, old, adv, np.zeros_like(mask), clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    assert float(loss) == 0.0
    assert all(math.isfinite(float(v)) for v in metrics.values())


def test_fast_path_checks_only_first_row_like_rlinf():
    lp, old, adv, mask = make(5, (3, 4))
    mask[0] = False
    mask[1:] = True
    loss, metrics = compute_ppo_actor_loss(
        t(lp), t(old), t(adv), t(mask), clip_ratio_low=0.2, clip_ratio_high=0.2, fast_path_zero_loss_mask=True
    )
    assert float(loss) == 0.0
    assert "actor/token_num" in metrics and "actor/policy_loss_mbs_mean" in metrics
    assert all(float(v) == 0.0 for v in metrics.values())
    # Without the switch the same inputs give the real loss.
    loss2, _ = compute_ppo_actor_loss(t(lp), t(old), t(adv), t(mask), clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert float(loss2) != 0.0


@pytest.mark.parametrize("c", [None, 1.5])
def test_actor_gradient_matches_loop_reference(c):
    lp, old, adv, mask = make(6, (7, 6))
    lpt = t(lp).requires_grad_(True)
    loss, _ = compute_ppo_actor_loss(
        lpt, t(old), t(adv), t(mask), clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=c
    )
    loss.backward()
    want = ref.ppo_actor_grad_ref(lp, old, adv, mask, low=0.2, high=0.28, c=c) / mask.sum()
    np.testing.assert_allclose(lpt.grad.numpy(), want, rtol=1e-5, atol=1e-7)


def test_actor_gradient_equals_max_formulation():
    """The where-based selection gives exactly torch.max/min's gradients (RLinf's formulation)."""
    lp, old, adv, mask = make(7, (9, 11))
    a, b = t(lp).requires_grad_(True), t(lp).requires_grad_(True)
    ours, _ = compute_ppo_actor_loss(
        a, t(old), t(adv), t(mask), clip_ratio_low=0.2, clip_ratio_high=0.3, clip_ratio_c=3.0
    )
    ratio = torch.where(t(mask), torch.exp(b - t(old)), 0)
    l1, l2 = -t(adv) * ratio, -t(adv) * torch.clamp(ratio, 0.8, 1.3)
    pl = torch.min(torch.max(l1, l2), torch.sign(t(adv)) * 3.0 * t(adv))
    theirs = (pl * t(mask)).sum() / t(mask).sum()
    ours.backward()
    theirs.backward()
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-6)
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-9)


def test_actor_metrics_are_detached():
    lp, old, adv, mask = make(8, (3, 4))
    _, metrics = compute_ppo_actor_loss(
        t(lp).requires_grad_(True), t(old), t(adv), t(mask), clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    assert not any(v.requires_grad for v in metrics.values())


@pytest.mark.parametrize(
    ("lp_shape", "adv_shape", "bad"),
    [
        ((6,), (6, 1), "advantages"),  # logprob chunk_level + reward action_level: RLinf's silent [N, N]
        ((6, 3), (3, 6), "advantages"),
        ((6, 3, 2), (6, 3), "advantages"),  # token level without the unsqueeze
    ],
)
def test_actor_rejects_mis_broadcast_shapes(lp_shape, adv_shape, bad):
    g = np.random.default_rng(0)
    lp = g.normal(size=lp_shape).astype(np.float32)
    adv = g.normal(size=adv_shape).astype(np.float32)
    with pytest.raises(ValueError, match=rf"{bad} with shape \[{', '.join(map(str, adv_shape))}\]") as e:
        compute_ppo_actor_loss(lp, lp, adv, clip_ratio_low=0.2, clip_ratio_high=0.2)
    assert f"logprobs with shape [{', '.join(map(str, lp_shape))}]" in str(e.value)


def test_actor_rejects_bad_arguments():
    lp, old, adv, mask = make(9, (3, 4))
    with pytest.raises(ValueError, match="old_logprobs"):
        compute_ppo_actor_loss(lp, old[:2], adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    with pytest.raises(ValueError, match=r"loss_mask with shape \[4, 3\]"):
        compute_ppo_actor_loss(lp, old, adv, mask.T, clip_ratio_low=0.2, clip_ratio_high=0.2)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        compute_ppo_actor_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="advantages must be a real floating"):
        compute_ppo_actor_loss(lp, old, adv.astype(np.int64), mask, clip_ratio_low=0.2, clip_ratio_high=0.2)


@FAST
@given(
    seed=st.integers(0, 2**16),
    rows=st.integers(1, 5),
    cols=st.integers(1, 6),
    low=st.floats(0.05, 0.5),
    high=st.floats(0.05, 0.5),
)
def test_property_on_policy_ratio_is_one(seed, rows, cols, low, high):
    """With logprobs == old_logprobs the loss is -masked_mean(A), nothing is clipped and approx_kl is 0."""
    lp, _, adv, mask = make(seed, (rows, cols))
    loss, metrics = compute_ppo_actor_loss(lp, lp, adv, mask, clip_ratio_low=low, clip_ratio_high=high)
    np.testing.assert_allclose(float(loss), -ref.masked_mean_ref(adv, mask), rtol=1e-5, atol=1e-6)
    assert float(metrics["actor/clip_fraction"]) == 0.0
    assert float(metrics["actor/approx_kl"]) == 0.0


@FAST
@given(seed=st.integers(0, 2**16), c=st.floats(1.01, 10.0))
def test_property_dual_clip_bounds_loss(seed, c):
    """Per entry the dual-clipped loss never exceeds c·|A|, so the token mean is at most c·mean|A|."""
    lp, old, adv, mask = make(seed, (4, 6))
    old = old - 3.0  # large ratios so the dual clip binds
    loss, _ = compute_ppo_actor_loss(
        lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=c
    )
    assert float(loss) <= c * ref.masked_mean_ref(np.abs(adv), mask) + 1e-5


# ---------------------------------------------------------------------------------------- critic loss
def test_huber_loss_matches_loop_reference():
    e = np.linspace(-3, 3, 25).astype(np.float32)
    want = np.array([ref.huber_ref(float(x), 1.3) for x in e])
    np.testing.assert_allclose(huber_loss(e, 1.3), want, **TOL)
    np.testing.assert_allclose(huber_loss(t(e), 1.3).numpy(), want, **TOL)


@pytest.mark.parametrize("embodied", [False, True])
def test_critic_loss_matches_loop_reference(embodied):
    g = np.random.default_rng(10)
    v = g.normal(size=(7, 3)).astype(np.float32)
    prev = (v + 0.5 * g.normal(size=v.shape)).astype(np.float32)
    ret = g.normal(size=v.shape).astype(np.float32) * 3
    mask = g.random(v.shape) < 0.7
    extra = {"max_episode_steps": 20, "loss_mask_sum": np.full(v.shape, 4.0, np.float32)} if embodied else {}
    want_loss, want_clip = ref.ppo_critic_ref(v, ret, prev, mask, value_clip=0.2, huber_delta=1.0, **extra)
    vt = t(v).requires_grad_(True)
    for conv, args in ((np.asarray, (v, ret, prev, mask)), (t, (vt, t(ret), t(prev), t(mask)))):
        kws = {k: conv(x) if isinstance(x, np.ndarray) else x for k, x in extra.items()}
        loss, metrics = compute_ppo_critic_loss(*args, value_clip=0.2, huber_delta=1.0, **kws)
        np.testing.assert_allclose(float(stop_gradient(loss)), want_loss, **TOL)
        np.testing.assert_allclose(float(metrics["critic/value_clip_ratio"]), want_clip, atol=1e-6)
        assert set(metrics) == {
            "critic/value_loss",
            "critic/value_clip_ratio",
            *CRITIC_EXPLAINED_VARIANCE_STAT_KEYS,
        }
        ev = compute_critic_explained_variance_from_stats(metrics)
        np.testing.assert_allclose(float(ev), ref.explained_variance_ref(ret, v, mask), rtol=1e-4, atol=1e-5)
    loss.backward()
    assert vt.grad is not None and torch.isfinite(vt.grad).all() and vt.grad.abs().sum() > 0


def test_critic_requires_clip_and_delta():
    x = np.zeros((2, 2), np.float32)
    with pytest.raises(TypeError, match="value_clip"):
        compute_ppo_critic_loss(x, x, x, value_clip=None, huber_delta=1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="returns"):
        compute_ppo_critic_loss(x, x[:1], x, value_clip=0.2, huber_delta=1.0)


def test_explained_variance_from_summed_shards_equals_whole():
    g = np.random.default_rng(11)
    ret, val = g.normal(size=(10, 4)), g.normal(size=(10, 4))
    mask = g.random((10, 4)) < 0.8
    shards = []
    for sl in (slice(0, 3), slice(3, 10)):
        _, m = compute_ppo_critic_loss(
            t(val[sl]).float(),
            t(ret[sl]).float(),
            t(val[sl]).float(),
            t(mask[sl]),
            value_clip=0.2,
            huber_delta=10.0,
        )
        shards.append(m)
    summed = {k: sum(float(s[k]) for s in shards) for k in CRITIC_EXPLAINED_VARIANCE_STAT_KEYS}
    ev = compute_critic_explained_variance_from_stats(summed)
    assert isinstance(ev, float)
    np.testing.assert_allclose(ev, ref.explained_variance_ref(ret, val, mask), rtol=1e-5)


def test_explained_variance_degenerate_cases_are_nan():
    one = dict.fromkeys(CRITIC_EXPLAINED_VARIANCE_STAT_KEYS, 1.0)
    assert math.isnan(compute_critic_explained_variance_from_stats(one))  # count < 2
    _, m = compute_ppo_critic_loss(
        t(np.ones((3, 1), np.float32)), t(np.ones((3, 1), np.float32)), t(np.ones((3, 1), np.float32)),
        value_clip=0.2, huber_delta=1.0,
    )  # fmt: skip
    assert math.isnan(float(compute_critic_explained_variance_from_stats(m)))  # zero return variance
    with pytest.raises(KeyError, match="count"):
        compute_critic_explained_variance_from_stats({})


def test_actor_critic_sum_and_metrics():
    lp, old, adv, mask = make(12, (6, 2))
    g = np.random.default_rng(12)
    v, ret = g.normal(size=(6, 2)).astype(np.float32), g.normal(size=(6, 2)).astype(np.float32)
    loss, metrics = compute_ppo_actor_critic_loss(
        t(lp), t(old), t(adv), t(v), t(ret), t(v), t(mask),
        clip_ratio_low=0.2, clip_ratio_high=0.2, value_clip=0.2, huber_delta=1.0,
    )  # fmt: skip
    a, _ = ref.ppo_actor_ref(lp, old, adv, mask, low=0.2, high=0.2)
    c, _ = ref.ppo_critic_ref(v, ret, v, mask, value_clip=0.2, huber_delta=1.0)
    np.testing.assert_allclose(float(loss), a + c, **TOL)
    assert set(metrics) >= ACTOR_KEYS and "critic/value_loss" in metrics


# -------------------------------------------------------------------------------------- decoupled PPO
@pytest.mark.parametrize("mode", ["old", "proximal", "versions"])
@pytest.mark.parametrize(("c", "threshold"), [(None, None), (3.0, 1.3)])
def test_decoupled_matches_loop_reference(mode, c, threshold):
    lp, old, adv, mask = make(13, (6, 5))
    g = np.random.default_rng(13)
    kw: dict = {}
    if mode == "proximal":
        kw["proximal_logprobs"] = (lp + 0.1 * g.normal(size=lp.shape)).astype(np.float32)
    if mode == "versions":
        kw["versions"] = g.integers(-1, 5, size=lp.shape)
        kw["current_version"] = 5
    rkw = {
        "prox": kw.get("proximal_logprobs"),
        "versions": kw.get("versions"),
        "current_version": kw.get("current_version"),
    }
    want_loss, want = ref.decoupled_ref(
        lp, old, adv, mask, low=0.2, high=0.28, c=c, threshold=threshold, **rkw
    )
    for conv in (np.asarray, t):
        args = [conv(x) for x in (lp, old, adv, mask)]
        kws = {k: (conv(v) if isinstance(v, np.ndarray) else v) for k, v in kw.items()}
        loss, metrics = compute_decoupled_ppo_actor_loss(
            *args,
            clip_ratio_low=0.2,
            clip_ratio_high=0.28,
            clip_ratio_c=c,
            behave_weight_threshold=threshold,
            **kws,
        )
        np.testing.assert_allclose(float(loss), want_loss, **TOL)
        assert_metrics(metrics, want)


def test_decoupled_gradient_flows_and_versions_prox_is_detached():
    lp, old, adv, mask = make(14, (4, 3))
    lpt = t(lp).requires_grad_(True)
    versions = torch.full((4, 3), 2)
    loss, _ = compute_decoupled_ppo_actor_loss(
        lpt,
        t(old),
        t(adv),
        t(mask),
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        versions=versions,
        current_version=3,
    )
    loss.backward()
    # version gap 1 → α = 0 → prox = old; the gradient is the plain PPO gradient w.r.t. logprobs.
    want = ref.ppo_actor_grad_ref(lp, old, adv, mask, low=0.2, high=0.2) / mask.sum()
    np.testing.assert_allclose(lpt.grad.numpy(), want, rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------------------------ OPD
@pytest.mark.parametrize("max_episode_steps", [None, 25])
def test_opd_matches_loop_reference(max_episode_steps):
    g = np.random.default_rng(15)
    lp = g.normal(size=(5, 4, 3)).astype(np.float32)
    adv = g.normal(size=(5, 4, 3)).astype(np.float32)
    mask = g.random((5, 4)) < 0.7
    lms = np.full((5, 4), 6.0, np.float32)
    m3 = np.broadcast_to(mask[..., None], lp.shape)
    if max_episode_steps:
        want = ref.masked_mean_ratio_ref(
            -lp.astype(np.float64) * adv, m3, np.broadcast_to(lms[..., None], lp.shape) / 25
        )
    else:
        want = ref.masked_mean_ref(-lp.astype(np.float64) * adv, m3)
    lpt = t(lp).requires_grad_(True)
    for args in ((lp, adv, mask, lms), (lpt, t(adv), t(mask), t(lms))):
        loss, metrics = compute_opd_actor_loss(*args, max_episode_steps=max_episode_steps)
        np.testing.assert_allclose(float(stop_gradient(loss)), want, **TOL)
        np.testing.assert_allclose(float(metrics["actor/opd_reward"]), ref.masked_mean_ref(adv, m3), **TOL)
        assert float(metrics["actor/opd_reverse_kl"]) == pytest.approx(
            -float(metrics["actor/opd_reward"]), abs=1e-6
        )
    loss.backward()
    assert lpt.grad is not None and (lpt.grad[~t(mask)] == 0).all()


def test_opd_rejects_bad_shapes():
    x = np.zeros((2, 3, 4), np.float32)
    with pytest.raises(ValueError, match="advantages"):
        compute_opd_actor_loss(x, x[..., :2], np.ones((2, 3), bool), np.ones((2, 3)))
    with pytest.raises(ValueError, match=r"loss_mask with shape \[2, 3, 2\]"):
        compute_opd_actor_loss(x, x, np.ones((2, 3, 2), bool), np.ones((2, 3)))


def test_default_aggregator_is_masked_mean():
    lp, old, adv, mask = make(16, (3, 5))
    a, _ = compute_ppo_actor_loss(lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
    b, _ = compute_ppo_actor_loss(
        lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, loss_agg_func=masked_mean
    )
    assert float(a) == float(b)


def test_float_mask_equals_bool_mask():
    lp, old, adv, mask = make(17, (5, 6))
    a, ma = compute_ppo_actor_loss(t(lp), t(old), t(adv), t(mask), clip_ratio_low=0.2, clip_ratio_high=0.2)
    b, mb = compute_ppo_actor_loss(
        t(lp), t(old), t(adv), t(mask.astype(np.float32)), clip_ratio_low=0.2, clip_ratio_high=0.2
    )
    assert a.item() == b.item()
    assert {k: v.item() for k, v in ma.items()} == {k: v.item() for k, v in mb.items()}


@FAST
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 4), cols=st.integers(1, 7))
def test_property_wide_clip_range_is_plain_surrogate(seed, rows, cols):
    """With clip bounds that never bind the loss is the importance-weighted surrogate -mean(A·r)."""
    lp, old, adv, mask = make(seed, (rows, cols))
    loss, metrics = compute_ppo_actor_loss(lp, old, adv, mask, clip_ratio_low=1.0, clip_ratio_high=1e9)
    ratio = np.exp(lp.astype(np.float64) - old)
    np.testing.assert_allclose(float(loss), ref.masked_mean_ref(-adv * ratio, mask), rtol=1e-5, atol=1e-6)
    assert float(metrics["actor/clip_fraction"]) == 0.0


@FAST
@given(seed=st.integers(0, 2**16), n=st.integers(2, 30))
def test_property_perfect_critic_explains_all_variance(seed, n):
    g = np.random.default_rng(seed)
    ret = g.normal(size=(n, 1)).astype(np.float32)
    ret[0, 0] += 1.0  # non-constant returns
    _, m = compute_ppo_critic_loss(ret, ret, ret, value_clip=0.2, huber_delta=1.0)
    assert float(compute_critic_explained_variance_from_stats(m)) == pytest.approx(1.0, abs=1e-4)


def test_critic_ignores_loss_agg_func_like_rlinf():
    """RLinf's Megatron critic passes loss_agg_func; the critic loss always uses the token mean."""
    g = np.random.default_rng(18)
    v, ret = g.normal(size=(4, 6)).astype(np.float32), g.normal(size=(4, 6)).astype(np.float32)
    mask = g.random((4, 6)) < 0.6
    a, _ = compute_ppo_critic_loss(v, ret, v, mask, value_clip=0.2, huber_delta=10000.0)
    b, _ = compute_ppo_critic_loss(
        v,
        ret,
        v,
        mask,
        value_clip=0.2,
        huber_delta=10000.0,
        loss_agg_func=get_loss_agg_func("seq-mean-token-sum"),
    )
    assert float(a) == float(b)


def test_rollout_importance_weights_truncate_and_ignore_padding() -> None:
    trainer = torch.log(torch.tensor([[0.5, 0.2, 0.9], [0.3, 0.3, 0.1]], requires_grad=True))
    rollout = torch.log(torch.tensor([[0.25, 0.4, 0.3], [0.3, 0.6, 1e-12]]))
    mask = torch.tensor([[True, True, True], [True, True, False]])
    w, m = rollout_importance_weights(trainer, rollout, mask, clip=2.0)
    # raw ratios 2, 0.5, 3 | 1, 0.5, (1e11: padding, huge but masked)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 2.0], [1.0, 0.5, 1.0]]))
    assert not w.requires_grad  # a weight on the advantages, never differentiated
    assert float(m["actor/is_clip_fraction"]) == pytest.approx(
        1 / 5
    )  # only the 3 is truncated (2 is not > 2)
    assert float(m["actor/is_weight_mean"]) == pytest.approx((2 + 0.5 + 3 + 1 + 0.5) / 5, rel=1e-5)
    assert float(m["actor/is_weight_max"]) == pytest.approx(3.0, rel=1e-5)
    with pytest.raises(ValueError, match="importance_sampling_clip must be > 0"):
        rollout_importance_weights(trainer, rollout, mask, clip=0.0)
    with pytest.raises(ValueError):
        rollout_importance_weights(trainer, rollout[:, :2], mask, clip=2.0)
