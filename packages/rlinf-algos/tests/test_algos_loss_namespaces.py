"""The loss functions give the same numbers on numpy, torch and a strict array-API namespace."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import array_api_strict as xs
import numpy as np
import pytest
import rlinf_algos as ra
import torch

g = np.random.default_rng(0)
LP = (g.normal(size=(4, 6)) * 0.5 - 1).astype(np.float32)
OLD = (LP + 0.3 * g.normal(size=(4, 6))).astype(np.float32)
ADV = g.normal(size=(4, 6)).astype(np.float32)
MASK = g.random((4, 6)) > 0.3
LMS = np.full((4, 6), 3.0, np.float32)
VERSIONS = (np.arange(24).reshape(4, 6) % 4).astype(np.int64)

Conv = Callable[[np.ndarray], Any]

CASES: dict[str, Callable[[Conv], Any]] = {
    "ppo_dual_clip_higher": lambda c: ra.compute_ppo_actor_loss(
        c(LP), c(OLD), c(ADV), c(MASK), clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0
    ),
    "ppo_log_ratio_seq_sum": lambda c: ra.compute_ppo_actor_loss(
        c(LP),
        c(OLD),
        c(ADV),
        c(MASK),
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        clip_log_ratio_min=-0.1,
        clip_log_ratio_max=0.1,
        loss_agg_func=ra.seq_mean_token_sum,
    ),
    "ppo_embodied_ratio": lambda c: ra.compute_ppo_actor_loss(
        c(LP),
        c(OLD),
        c(ADV),
        c(MASK),
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
        max_episode_steps=10,
        loss_mask_sum=c(LMS),
    ),
    "critic": lambda c: ra.compute_ppo_critic_loss(
        c(LP), c(OLD), c(ADV), c(MASK), value_clip=0.2, huber_delta=1.0
    ),
    "explained_variance": lambda c: ra.compute_critic_explained_variance_from_stats(
        ra.compute_ppo_critic_loss(c(LP), c(OLD), c(ADV), c(MASK), value_clip=0.2, huber_delta=1.0)[1]
    ),
    "decoupled": lambda c: ra.compute_decoupled_ppo_actor_loss(
        c(LP),
        c(OLD),
        c(ADV),
        c(MASK),
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        versions=c(VERSIONS),
        current_version=3,
        clip_ratio_c=3.0,
        behave_weight_threshold=2.0,
    ),
    "opd": lambda c: ra.compute_opd_actor_loss(c(LP), c(ADV), c(MASK), c(LMS), max_episode_steps=5),
    "rollout_is_weights": lambda c: ra.rollout_importance_weights(c(LP), c(OLD), c(MASK), clip=1.2),
    "kl_k3": lambda c: ra.kl_penalty(c(LP), c(OLD), "k3"),
    "kl_k2": lambda c: ra.kl_penalty(c(LP), c(OLD), "k2"),
    "entropy": lambda c: ra.compute_entropy_from_logits(c(LP)),
    "reshape_entropy": lambda c: ra.reshape_entropy(c(LP), "action_level", action_dim=3, batch_size=4),
    "masked_normalization": lambda c: ra.masked_normalization(c(LP), c(MASK)),
    "normalize_from_stats": lambda c: ra.normalize_from_stats(c(LP), ra.masked_stats(c(LP), c(MASK))),
    "seq_mean_token_mean": lambda c: ra.seq_mean_token_mean(c(LP), c(MASK)),
    "masked_mean_ratio": lambda c: ra.masked_mean_ratio(c(LP), c(MASK), c(LMS)),
    "dynamic_sampling_filter": lambda c: ra.dynamic_sampling_filter(
        c(np.repeat(ADV[:, :1], 6)), group_size=3
    ),
    "overlong_filter": lambda c: ra.overlong_filter(c(MASK), max_response_length=5),
    "overlong_penalty": lambda c: ra.overlong_reward_penalty(c(np.arange(10)), max_length=8, cache_length=3),
    "policy_loss_embodied": lambda c: ra.policy_loss(
        loss_type="actor",
        task_type="embodied",
        logprob_type="token_level",
        single_action_dim=3,
        logprobs=c(LP),
        old_logprobs=c(OLD),
        advantages=c(ADV[:, :2]),
        loss_mask=c(MASK[:, :2]),
        clip_ratio_low=0.2,
        clip_ratio_high=0.2,
    ),
}


def _np(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        return x.detach().numpy()
    if isinstance(x, int | float):
        return np.float64(x)
    return np.asarray(x)


def _flatten(out: Any) -> dict[str, np.ndarray]:
    if isinstance(out, tuple):
        loss, metrics = out
        return {"loss": _np(loss), **{k: _np(v) for k, v in metrics.items()}}
    return {"value": _np(out)}


@pytest.mark.parametrize("name", sorted(CASES))
def test_numpy_torch_strict_agree(name):
    ref = _flatten(CASES[name](lambda a: a))
    for conv in (torch.from_numpy, xs.asarray):
        got = _flatten(CASES[name](conv))
        assert set(got) == set(ref)
        for k, v in ref.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-6, err_msg=f"{name}:{k} via {conv}")


def test_strict_results_stay_in_namespace():
    loss, metrics = CASES["ppo_dual_clip_higher"](xs.asarray)
    strict_array = type(xs.asarray(0.0))
    assert isinstance(loss, strict_array)
    assert all(isinstance(v, strict_array) for v in metrics.values())
