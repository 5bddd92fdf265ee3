"""RLinf-compatible loss entry layer: policy_loss(**kw), pre/post-processing, registry, errors."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch
from rlinf_algos import (
    LOSS_ENTRY_KEYWORDS,
    POLICY_LOSS_FNS,
    compute_ppo_actor_loss,
    get_policy_loss,
    policy_loss,
    policy_loss_registry,
    postprocess_loss_metric,
    preprocess_loss_inputs,
    register_policy_loss,
    seq_mean_token_sum,
)

_spec = importlib.util.spec_from_file_location("_loss_refs", Path(__file__).with_name("_loss_refs.py"))
assert _spec is not None and _spec.loader is not None
ref = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(ref)

TOL = {"rtol": 1e-5, "atol": 1e-6}
N, C, D = 6, 4, 3


def t(x: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(x))


def embodied_batch(seed: int = 0, reward_type: str = "action_level") -> dict:
    g = np.random.default_rng(seed)
    rc = C if reward_type == "action_level" else 1
    lp = (g.normal(size=(N, C * D)) * 0.3 - 1).astype(np.float32)
    return {
        "logprobs": t(lp).requires_grad_(True),
        "old_logprobs": t((lp + 0.2 * g.normal(size=lp.shape)).astype(np.float32)),
        "advantages": t(g.normal(size=(N, rc)).astype(np.float32)),
        "loss_mask": t(g.random((N, rc)) < 0.8),
        "loss_mask_sum": t(np.full((N, rc), 7.0, np.float32)),
        "values": t(g.normal(size=(N, 1)).astype(np.float32)),
        "prev_values": t(g.normal(size=(N, 1)).astype(np.float32)),
        "returns": t(g.normal(size=(N, 1)).astype(np.float32)),
    }


def common(**kw):
    base = {
        "task_type": "embodied",
        "single_action_dim": D,
        "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.28,
        "value_clip": 0.2,
        "huber_delta": 10.0,
        "max_episode_steps": 20,
        "critic_warmup": False,
    }
    return base | kw


# ------------------------------------------------------------------------------------- preprocessing
def test_preprocess_layouts():
    b = embodied_batch()
    tok = preprocess_loss_inputs(
        **b, logprob_type="token_level", reward_type="action_level", single_action_dim=D
    )
    assert tuple(tok["logprobs"].shape) == (N, C, D)
    assert tuple(tok["advantages"].shape) == (N, C, 1)
    assert tuple(tok["loss_mask"].shape) == (N, C, 1)
    assert tuple(tok["values"].shape) == (N, 1, 1)  # expand_to_target_dim only appends axes
    act = preprocess_loss_inputs(
        **b, logprob_type="action_level", reward_type="action_level", single_action_dim=D
    )
    torch.testing.assert_close(act["logprobs"], b["logprobs"].reshape(N, C, D).sum(-1))
    assert tuple(act["advantages"].shape) == (N, C)
    cb = embodied_batch(reward_type="chunk_level")
    ch = preprocess_loss_inputs(
        **cb, logprob_type="chunk_level", reward_type="chunk_level", single_action_dim=D
    )
    torch.testing.assert_close(ch["logprobs"], cb["logprobs"].sum(-1))
    assert tuple(ch["advantages"].shape) == (N,) and tuple(ch["returns"].shape) == (N,)
    # the caller's dict and tensors are untouched
    assert tuple(b["advantages"].shape) == (N, C)


def test_preprocess_versions_and_proximal():
    b = embodied_batch()
    versions = torch.arange(N * C * D).reshape(N, C * D)
    act = preprocess_loss_inputs(
        **b,
        versions=versions,
        proximal_logprobs=b["old_logprobs"],
        logprob_type="action_level",
        single_action_dim=D,
    )
    torch.testing.assert_close(act["versions"], versions.reshape(N, C, D)[..., 0])
    assert tuple(act["proximal_logprobs"].shape) == (N, C)
    ch = preprocess_loss_inputs(**b, versions=versions, logprob_type="chunk_level", single_action_dim=D)
    torch.testing.assert_close(ch["versions"], versions.reshape(N, C, D)[:, 0, 0])


def test_preprocess_errors():
    b = embodied_batch()
    with pytest.raises(TypeError, match="single_action_dim"):
        preprocess_loss_inputs(**b, logprob_type="token_level")
    with pytest.raises(ValueError, match="unknown logprob_type 'step_level'"):
        preprocess_loss_inputs(**b, logprob_type="step_level", single_action_dim=D)
    with pytest.raises(TypeError, match="'singel_action_dim'"):
        preprocess_loss_inputs(**b, singel_action_dim=D)
    with pytest.raises(ValueError, match="OPD advantages shape"):
        preprocess_loss_inputs(**b, logprob_type="token_level", single_action_dim=D, loss_type="opd")


# ------------------------------------------------------------------------------------------ entry
@pytest.mark.parametrize("logprob_type", ["token_level", "action_level"])
def test_policy_loss_actor_embodied_matches_reference(logprob_type):
    b = embodied_batch(1)
    loss, metrics = policy_loss(
        loss_type="actor", logprob_type=logprob_type, reward_type="action_level", **b, **common()
    )
    lp = b["logprobs"].detach().numpy().reshape(N, C, D)
    old = b["old_logprobs"].numpy().reshape(N, C, D)
    adv, mask, lms = b["advantages"].numpy(), b["loss_mask"].numpy(), b["loss_mask_sum"].numpy()
    if logprob_type == "token_level":
        adv, mask, lms = adv[..., None], mask[..., None], lms[..., None]
    else:
        lp, old = lp.sum(-1), old.sum(-1)
    want_loss, want = ref.ppo_actor_ref(
        lp, old, adv, mask, low=0.2, high=0.28, max_episode_steps=20, loss_mask_sum=lms
    )
    np.testing.assert_allclose(loss.item(), want_loss, **TOL)
    assert all(isinstance(v, float) for v in metrics.values())  # embodied metrics are Python floats
    for k, v in want.items():
        np.testing.assert_allclose(metrics[k], v, err_msg=k, **TOL)
    loss.backward()
    assert b["logprobs"].grad is not None and torch.isfinite(b["logprobs"].grad).all()


def test_token_level_logprobs_under_chunk_level_rewards_match_reference():
    # One advantage and mask entry per sample ([N, 1, 1] after preprocessing) against [N, C, D] ratios: the
    # ratio metrics average over every action entry (RLinf expands the mask to the ratio's shape).
    b = embodied_batch(3, reward_type="chunk_level")
    loss, metrics = policy_loss(
        loss_type="actor", logprob_type="token_level", reward_type="chunk_level", **b, **common()
    )
    lp = b["logprobs"].detach().numpy().reshape(N, C, D)
    old = b["old_logprobs"].numpy().reshape(N, C, D)
    adv, mask, lms = (b[k].numpy().reshape(N, 1, 1) for k in ("advantages", "loss_mask", "loss_mask_sum"))
    want_loss, want = ref.ppo_actor_ref(
        lp, old, adv, mask, low=0.2, high=0.28, max_episode_steps=20, loss_mask_sum=lms
    )
    np.testing.assert_allclose(loss.item(), want_loss, **TOL)
    for k, v in want.items():
        np.testing.assert_allclose(metrics[k], v, err_msg=k, **TOL)
    assert abs(metrics["actor/ratio"] - 1.0) < 0.5  # a mean ratio, not C times one


def test_policy_loss_actor_critic_chunk_level():
    b = embodied_batch(2, reward_type="chunk_level")
    loss, metrics = policy_loss(
        loss_type="Actor_Critic", logprob_type="chunk_level", reward_type="chunk_level", **b, **common()
    )
    assert {"actor/policy_loss", "critic/value_loss", "critic/value_clip_ratio"} <= set(metrics)
    lp, old = b["logprobs"].detach().numpy().sum(-1), b["old_logprobs"].numpy().sum(-1)
    flat = {
        k: b[k].numpy().reshape(-1)
        for k in ("advantages", "loss_mask", "loss_mask_sum", "values", "returns", "prev_values")
    }
    a, _ = ref.ppo_actor_ref(
        lp,
        old,
        flat["advantages"],
        flat["loss_mask"],
        low=0.2,
        high=0.28,
        max_episode_steps=20,
        loss_mask_sum=flat["loss_mask_sum"],
    )
    c, _ = ref.ppo_critic_ref(
        flat["values"],
        flat["returns"],
        flat["prev_values"],
        flat["loss_mask"],
        value_clip=0.2,
        huber_delta=10.0,
        max_episode_steps=20,
        loss_mask_sum=flat["loss_mask_sum"],
    )
    np.testing.assert_allclose(loss.item(), a + c, **TOL)


def test_policy_loss_rejects_chunk_logprobs_with_action_rewards():
    """RLinf silently broadcasts logprobs [N] against advantages [N, 1] into an [N, N] loss."""
    b = embodied_batch(3, reward_type="chunk_level")
    with pytest.raises(ValueError, match=r"advantages with shape \[6, 1\].*logprobs with shape \[6\]"):
        policy_loss(
            loss_type="actor", logprob_type="chunk_level", reward_type="action_level", **b, **common()
        )


def test_policy_loss_reasoning_keeps_array_metrics_and_string_aggregator():
    g = np.random.default_rng(4)
    lp = t(g.normal(size=(4, 10)).astype(np.float32))
    old = t(g.normal(size=(4, 10)).astype(np.float32))
    adv = t(g.normal(size=(4, 10)).astype(np.float32))
    mask = t(g.random((4, 10)) < 0.7)
    kw = {"logprobs": lp, "old_logprobs": old, "advantages": adv, "loss_mask": mask}
    loss, metrics = policy_loss(
        task_type="reasoning", loss_type="actor", loss_agg_func="seq-mean-token-sum", clip_ratio_c=3.0,
        clip_ratio_low=0.2, clip_ratio_high=0.2, fast_path_zero_loss_mask=True, **kw,
    )  # fmt: skip
    direct, _ = compute_ppo_actor_loss(
        lp,
        old,
        adv,
        mask,
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        clip_ratio_c=3.0,
        loss_agg_func=seq_mean_token_sum,
    )
    assert loss.item() == direct.item()
    assert all(isinstance(v, torch.Tensor) and v.ndim == 0 for v in metrics.values())


def test_policy_loss_decoupled_and_opd():
    b = embodied_batch(5, reward_type="chunk_level")  # RLinf's async PPO combo: gae + chunk/chunk
    loss, metrics = policy_loss(
        loss_type="decoupled_actor_critic", logprob_type="chunk_level", reward_type="chunk_level",
        versions=torch.full((N, C * D), 3), current_version=4, clip_ratio_c=3.0, behave_weight_threshold=2.0,
        proximal_logprobs=None, **b, **common(),
    )  # fmt: skip
    assert {
        "actor/proximal_ratio",
        "actor/behav_clip_fraction",
        "actor/average_version",
        "critic/value_loss",
    } <= set(metrics)
    assert metrics["actor/current_version"] == 4.0
    assert metrics["actor/average_version"] == 3.0
    # values [N, 1] with an action-level mask [N, C] cannot be scored (RLinf crashes in the EV stats).
    bad = embodied_batch(5)
    with pytest.raises(
        ValueError, match=r"loss_mask with shape \[6, 4\] does not fit values with shape \[6, 1\]"
    ):
        policy_loss(
            loss_type="actor_critic",
            logprob_type="action_level",
            reward_type="action_level",
            **bad,
            **common(),
        )
    g = np.random.default_rng(5)
    ob = embodied_batch(6)
    ob["advantages"] = t(g.normal(size=(N, C, D)).astype(np.float32))
    loss, metrics = policy_loss(
        loss_type="OPD", logprob_type="token_level", reward_type="action_level", **ob, **common()
    )
    lp = ob["logprobs"].detach().numpy().reshape(N, C, D)
    m3 = np.broadcast_to(ob["loss_mask"].numpy()[..., None], lp.shape)
    r3 = np.broadcast_to(ob["loss_mask_sum"].numpy()[..., None], lp.shape) / 20
    np.testing.assert_allclose(
        loss.item(),
        ref.masked_mean_ratio_ref(-lp.astype(np.float64) * ob["advantages"].numpy(), m3, r3),
        **TOL,
    )
    assert set(metrics) == {"actor/policy_loss", "actor/opd_reward", "actor/opd_reverse_kl"}


def test_policy_loss_unknown_keyword_and_missing_inputs():
    b = embodied_batch(7)
    with pytest.raises(TypeError, match="'clip_ration_high'"):
        policy_loss(loss_type="actor", clip_ration_high=0.3, **b, **common(logprob_type="action_level"))
    with pytest.raises(TypeError, match="loss_type"):
        policy_loss(**b)
    with pytest.raises(TypeError, match="clip_ratio_low"):
        policy_loss(
            loss_type="actor",
            task_type="reasoning",
            logprobs=b["logprobs"],
            old_logprobs=b["old_logprobs"],
            advantages=b["logprobs"],
        )
    with pytest.raises(ValueError, match=r"unknown policy loss 'ppo'.*actor, actor_critic"):
        policy_loss(loss_type="ppo", **b)


def test_postprocess_loss_metric_in_place():
    m = {"a": torch.tensor(1.5, requires_grad=True) * 2, "b": np.float32(2.0), "c": 3, "d": "x"}
    out = postprocess_loss_metric(m)
    assert out is m and m == {"a": 3.0, "b": 2.0, "c": 3, "d": "x"}
    assert type(m["a"]) is float and type(m["b"]) is float


# --------------------------------------------------------------------------------------- registry
def test_registry_case_insensitive_duplicates_and_misses():
    assert set(POLICY_LOSS_FNS) == {"actor", "actor_critic", "decoupled_actor_critic", "opd"}
    assert get_policy_loss("ACTOR") is POLICY_LOSS_FNS["actor"]
    with pytest.raises(TypeError):
        POLICY_LOSS_FNS["x"] = POLICY_LOSS_FNS["actor"]  # type: ignore[index]
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("Actor")(lambda **kw: (0, {}))
    with pytest.raises(ValueError, match="valid names: actor, actor_critic, decoupled_actor_critic, opd"):
        get_policy_loss("nope")


def test_register_custom_loss_receives_preprocessed_inputs_and_own_keywords():
    seen = {}

    def my_loss(*, logprobs, advantages, entropy_bonus=0.0, **kwargs):
        seen.update(shape=tuple(logprobs.shape), adv=tuple(advantages.shape), bonus=entropy_bonus)
        return logprobs.sum() * 0, {"my/metric": logprobs.sum().detach()}

    register_policy_loss("My_Loss")(my_loss)
    try:
        b = embodied_batch(8)
        _, metrics = policy_loss(
            loss_type="my_loss", logprob_type="token_level", entropy_bonus=0.5, **b, **common()
        )
        assert seen == {"shape": (N, C, D), "adv": (N, C, 1), "bonus": 0.5}
        assert isinstance(metrics["my/metric"], float)
        with pytest.raises(TypeError, match="'entropy_bonus'"):
            policy_loss(loss_type="actor", entropy_bonus=0.5, **b, **common(logprob_type="action_level"))
    finally:
        policy_loss_registry.unregister("my_loss")
    assert "my_loss" not in policy_loss_registry


def test_entry_keywords_cover_rlinf_worker_calls():
    fsdp_reasoning = {"task_type", "loss_type", "loss_agg_func", "logprobs", "old_logprobs", "advantages", "clip_ratio_c",
                      "clip_ratio_low", "clip_ratio_high", "loss_mask", "clip_log_ratio_min", "clip_log_ratio_max",
                      "fast_path_zero_loss_mask"}  # fmt: skip
    embodied = {"loss_type", "logprob_type", "reward_type", "single_action_dim", "logprobs", "values", "old_logprobs",
                "advantages", "returns", "prev_values", "clip_ratio_high", "clip_ratio_low", "value_clip", "huber_delta",
                "loss_mask", "loss_mask_sum", "max_episode_steps", "task_type", "critic_warmup"}  # fmt: skip
    async_ppo = {
        "clip_ratio_c",
        "proximal_logprobs",
        "versions",
        "current_version",
        "behave_weight_threshold",
    }
    assert fsdp_reasoning | embodied | async_ppo <= LOSS_ENTRY_KEYWORDS
