"""rlinf_algos: RL advantages, losses and estimators as pure array functions.

Works on numpy arrays, torch tensors (autograd preserved) and any array-API namespace. See the README.
"""

from importlib.metadata import version as _version

from ._advantages import gae, grpo, grpo_dynamic, grpo_video, opd, raw, reinpp
from ._compat_adv import (
    ADV_ENTRY_KEYWORDS,
    ADVANTAGE_FNS,
    AdvantageFn,
    advantage_registry,
    calculate_adv_and_returns,
    compute_gae_advantages_and_returns,
    compute_grpo_advantages,
    compute_grpo_dynamic_advantages,
    compute_grpo_video_advantages,
    compute_opd_advantages,
    compute_raw_advantages,
    compute_reinpp_advantages,
    get_adv_and_returns,
    register_advantage,
)
from ._embodied import (
    EmbodiedAdvantageInputs,
    calculate_scores,
    compute_loss_mask,
    filter_rewards,
    postprocess_embodied_advantages_outputs,
    preprocess_embodied_advantages_inputs,
)
from ._masked import masked_mean, masked_sum, safe_normalize
from ._offpolicy import (
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
from ._reasoning import (
    REASONING_ADV_TYPES,
    ReasoningAdvantageInputs,
    postprocess_reasoning_advantages_outputs,
    preprocess_reasoning_advantages_inputs,
)
from ._registry import Registry

__version__ = _version("rlinf-algos")

__all__ = [
    "ADVANTAGE_FNS",
    "ADV_ENTRY_KEYWORDS",
    "REASONING_ADV_TYPES",
    "AdvantageFn",
    "EmbodiedAdvantageInputs",
    "ReasoningAdvantageInputs",
    "Registry",
    "__version__",
    "advantage_registry",
    "aggregate_q",
    "calculate_adv_and_returns",
    "calculate_scores",
    "compute_gae_advantages_and_returns",
    "compute_grpo_advantages",
    "compute_grpo_dynamic_advantages",
    "compute_grpo_video_advantages",
    "compute_loss_mask",
    "compute_opd_advantages",
    "compute_raw_advantages",
    "compute_reinpp_advantages",
    "crossq_critic_target",
    "expectile_loss",
    "filter_rewards",
    "gae",
    "get_adv_and_returns",
    "grpo",
    "grpo_dynamic",
    "grpo_video",
    "iql_actor_loss",
    "iql_critic_loss",
    "iql_critic_target",
    "iql_value_loss",
    "masked_mean",
    "masked_sum",
    "opd",
    "postprocess_embodied_advantages_outputs",
    "postprocess_reasoning_advantages_outputs",
    "preprocess_embodied_advantages_inputs",
    "preprocess_reasoning_advantages_inputs",
    "raw",
    "register_advantage",
    "reinpp",
    "sac_actor_loss",
    "sac_alpha",
    "sac_alpha_param_init",
    "sac_critic_loss",
    "sac_critic_target",
    "sac_temperature_loss",
    "safe_normalize",
    "soft_target_update",
    "split_crossq_q",
    "subsample_q_heads",
    "td3_critic_target",
    "td3_target_actions",
]
