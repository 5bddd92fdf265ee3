"""The three public tiers: pure functions at the top, `rlinf_algos.compat` and `rlinf_algos.offpolicy`.

The flat namespace keeps every name it exported before the split (the same objects), the two namespaces
partition the non-pure names, and every ``**kwargs`` entry lives in `compat`.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import rlinf_algos as ra
from rlinf_algos import compat, offpolicy

# The flat ``rlinf_algos.__all__`` as it stood before the tiers existed: existing imports must keep working.
FLAT_NAMES_BEFORE_TIERS = frozenset(
    [
        "ADVANTAGE_FNS",
        "ADV_ENTRY_KEYWORDS",
        "AdvantageFn",
        "CRITIC_EXPLAINED_VARIANCE_KEY",
        "CRITIC_EXPLAINED_VARIANCE_STAT_KEYS",
        "EmbodiedAdvantageInputs",
        "KL_PENALTY_TYPES",
        "LOSS_AGG_FNS",
        "LOSS_ENTRY_KEYWORDS",
        "LOSS_SCALE_FNS",
        "LossAggFn",
        "LossScaleFn",
        "MaskedStats",
        "POLICY_LOSS_FNS",
        "PolicyLossFn",
        "REASONING_ADV_TYPES",
        "ReasoningAdvantageInputs",
        "Registry",
        "__version__",
        "advantage_registry",
        "agent_scale",
        "aggregate_q",
        "calculate_adv_and_returns",
        "calculate_scores",
        "check_broadcast_to",
        "compute_critic_explained_variance_from_stats",
        "compute_critic_explained_variance_stats",
        "compute_decoupled_ppo_actor_critic_loss",
        "compute_decoupled_ppo_actor_loss",
        "compute_entropy_from_logits",
        "compute_gae_advantages_and_returns",
        "compute_grpo_actor_loss_fn",
        "compute_grpo_advantages",
        "compute_grpo_dynamic_advantages",
        "compute_grpo_video_advantages",
        "compute_loss_mask",
        "compute_opd_actor_loss",
        "compute_opd_advantages",
        "compute_ppo_actor_critic_loss",
        "compute_ppo_actor_loss",
        "compute_ppo_critic_loss",
        "compute_raw_advantages",
        "compute_reinpp_advantages",
        "crossq_critic_target",
        "dynamic_sampling_filter",
        "expectile_loss",
        "filter_rewards",
        "gae",
        "get_adv_and_returns",
        "get_loss_agg_func",
        "get_loss_scales",
        "get_policy_loss",
        "group_scale",
        "grpo",
        "grpo_dynamic",
        "grpo_video",
        "huber_loss",
        "iql_actor_loss",
        "iql_critic_loss",
        "iql_critic_target",
        "iql_value_loss",
        "kl_penalty",
        "loss_scale_registry",
        "masked_mean",
        "masked_mean_ratio",
        "masked_normalization",
        "masked_stats",
        "masked_sum",
        "normalize_from_stats",
        "opd",
        "overlong_filter",
        "overlong_reward_penalty",
        "policy_loss",
        "policy_loss_registry",
        "postprocess_embodied_advantages_outputs",
        "postprocess_loss_metric",
        "postprocess_reasoning_advantages_outputs",
        "preprocess_embodied_advantages_inputs",
        "preprocess_loss_inputs",
        "preprocess_reasoning_advantages_inputs",
        "raw",
        "register_advantage",
        "register_loss_scale",
        "register_policy_loss",
        "reinpp",
        "reshape_entropy",
        "sac_actor_loss",
        "sac_alpha",
        "sac_alpha_param_init",
        "sac_critic_loss",
        "sac_critic_target",
        "sac_temperature_loss",
        "safe_normalize",
        "seq_mean_token_mean",
        "seq_mean_token_sum",
        "soft_target_update",
        "split_crossq_q",
        "stop_gradient",
        "subsample_q_heads",
        "td3_critic_target",
        "td3_target_actions",
        "turn_scale",
    ]
)

OFFPOLICY = frozenset(
    [
        "aggregate_q",
        "crossq_critic_target",
        "expectile_loss",
        "iql_actor_loss",
        "iql_critic_loss",
        "iql_critic_target",
        "iql_value_loss",
        "sac_actor_loss",
        "sac_alpha",
        "sac_alpha_param_init",
        "sac_critic_loss",
        "sac_critic_target",
        "sac_temperature_loss",
        "soft_target_update",
        "split_crossq_q",
        "subsample_q_heads",
        "td3_critic_target",
        "td3_target_actions",
    ]
)


# Pure functions added to the flat namespace since (the public API grows only on purpose).
ADDED_SINCE = frozenset(["rollout_importance_weights"])


def test_flat_namespace_keeps_every_name() -> None:
    assert len(FLAT_NAMES_BEFORE_TIERS) == 102
    assert set(ra.__all__) == FLAT_NAMES_BEFORE_TIERS | ADDED_SINCE
    missing = [name for name in FLAT_NAMES_BEFORE_TIERS if not hasattr(ra, name)]
    assert not missing


def test_star_import_gives_the_old_names() -> None:
    scope: dict[str, object] = {}
    exec("from rlinf_algos import *", scope)
    assert scope.keys() >= FLAT_NAMES_BEFORE_TIERS


def test_namespaces_export_the_same_objects_as_the_flat_namespace() -> None:
    for namespace in (compat, offpolicy):
        assert namespace.__all__ == sorted(namespace.__all__, key=lambda n: (not n.isupper(), n))
        for name in namespace.__all__:
            assert getattr(namespace, name) is getattr(ra, name), f"{namespace.__name__}.{name}"
    assert ra.compat is compat and ra.offpolicy is offpolicy


def test_tiers_partition_the_names() -> None:
    assert set(offpolicy.__all__) == OFFPOLICY
    assert not set(compat.__all__) & set(offpolicy.__all__)
    assert set(compat.__all__) | set(offpolicy.__all__) <= set(ra.__all__)
    for name in offpolicy.__all__:
        assert getattr(offpolicy, name).__module__.startswith("rlinf_algos.offpolicy.")
    for name in compat.__all__:
        obj = getattr(compat, name)
        if inspect.isfunction(obj):
            assert obj.__module__.startswith("rlinf_algos.compat."), name


def test_every_kwargs_entry_lives_in_compat() -> None:
    pure = set(ra.__all__) - set(compat.__all__)
    for name in sorted(pure):
        obj = getattr(ra, name)
        if inspect.isfunction(obj):
            kinds = {p.kind for p in inspect.signature(obj).parameters.values()}
            assert inspect.Parameter.VAR_KEYWORD not in kinds, f"{name} takes **kwargs but is not in compat"
    takes_kwargs = [
        name
        for name in compat.__all__
        if inspect.isfunction(getattr(compat, name))
        and any(p.kind is p.VAR_KEYWORD for p in inspect.signature(getattr(compat, name)).parameters.values())
    ]
    assert {"calculate_adv_and_returns", "policy_loss", "preprocess_loss_inputs"} <= set(takes_kwargs)


def test_namespaces_import_without_torch() -> None:
    code = "import sys, rlinf_algos.compat, rlinf_algos.offpolicy; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
