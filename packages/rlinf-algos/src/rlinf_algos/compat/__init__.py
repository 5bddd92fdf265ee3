"""rlinf_algos.compat: the RLinf-compatible entry layer, under RLinf 0.4's names.

The only part of rlinf-algos that takes ``**kwargs`` or dict batches. It accepts exactly the keyword names
RLinf's workers pass, runs RLinf's pre-processing, dispatches through a registry and returns what RLinf
returns, so RLinf code moves over unchanged; a misspelled keyword is a TypeError naming it instead of being
ignored. The math underneath is the pure functions of `rlinf_algos`.

- Advantages: `calculate_adv_and_returns` (``task_type`` / ``adv_type`` dispatch), the registry functions
  (``compute_gae_advantages_and_returns``, ``compute_grpo_advantages``, ...), `register_advantage` /
  `get_adv_and_returns` over `advantage_registry`, the read-only built-ins `ADVANTAGE_FNS` and the accepted
  keywords `ADV_ENTRY_KEYWORDS`.
- Policy losses: `policy_loss` (``task_type`` / ``loss_type`` dispatch), `preprocess_loss_inputs`,
  `postprocess_loss_metric`, RLinf's registered losses (``compute_grpo_actor_loss_fn``,
  ``compute_decoupled_ppo_actor_critic_loss``), `register_policy_loss` / `get_policy_loss` over
  `policy_loss_registry`, `POLICY_LOSS_FNS` and `LOSS_ENTRY_KEYWORDS`.
- Multi-agent loss scales (``algorithm.loss_scales``): `group_scale`, `agent_scale`, `turn_scale` on
  ``(context, batch)`` dicts, `register_loss_scale` / `get_loss_scales` over `loss_scale_registry` and
  `LOSS_SCALE_FNS`.

Registries refuse a taken name and list the valid names on a miss; nothing registers itself on import.
"""

from ._advantages import (
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
from ._loss_scales import (
    LOSS_SCALE_FNS,
    LossScaleFn,
    agent_scale,
    get_loss_scales,
    group_scale,
    loss_scale_registry,
    register_loss_scale,
    turn_scale,
)
from ._losses import (
    LOSS_ENTRY_KEYWORDS,
    POLICY_LOSS_FNS,
    PolicyLossFn,
    compute_decoupled_ppo_actor_critic_loss,
    compute_grpo_actor_loss_fn,
    get_policy_loss,
    policy_loss,
    policy_loss_registry,
    postprocess_loss_metric,
    preprocess_loss_inputs,
    register_policy_loss,
)

__all__ = [
    "ADVANTAGE_FNS",
    "ADV_ENTRY_KEYWORDS",
    "LOSS_ENTRY_KEYWORDS",
    "LOSS_SCALE_FNS",
    "POLICY_LOSS_FNS",
    "AdvantageFn",
    "LossScaleFn",
    "PolicyLossFn",
    "advantage_registry",
    "agent_scale",
    "calculate_adv_and_returns",
    "compute_decoupled_ppo_actor_critic_loss",
    "compute_gae_advantages_and_returns",
    "compute_grpo_actor_loss_fn",
    "compute_grpo_advantages",
    "compute_grpo_dynamic_advantages",
    "compute_grpo_video_advantages",
    "compute_opd_advantages",
    "compute_raw_advantages",
    "compute_reinpp_advantages",
    "get_adv_and_returns",
    "get_loss_scales",
    "get_policy_loss",
    "group_scale",
    "loss_scale_registry",
    "policy_loss",
    "policy_loss_registry",
    "postprocess_loss_metric",
    "preprocess_loss_inputs",
    "register_advantage",
    "register_loss_scale",
    "register_policy_loss",
    "turn_scale",
]
