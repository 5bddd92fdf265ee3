"""rlinf_algos.offpolicy: off-policy and offline RL losses as pure array functions.

SAC (critic target and loss, actor loss, temperature), CrossQ, REDQ/RLPD head subsets, IQL (expectile value
loss, advantage-weighted actor loss, critic target and loss), TD3 target smoothing and Polyak target
updates. Every function takes the Q-values, log-probabilities and targets that the caller's own networks
produced; nothing here owns a model, an optimiser or a random generator. Layouts: ``B`` batch, ``H`` Q
heads, ``C`` chunk steps, ``K`` a trailing log-prob axis that is summed.

Example:
    >>> import numpy as np
    >>> from rlinf_algos.offpolicy import sac_critic_loss, sac_critic_target
    >>> y = sac_critic_target(
    ...     np.ones((2, 1)), np.zeros((2, 2)), np.zeros((2, 1)), np.zeros((2, 1), bool), gamma=0.99, alpha=0.1
    ... )
    >>> float(sac_critic_loss(np.ones((2, 2)), y))
    0.0
"""

from ._losses import (
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
    split_crossq_q,
    subsample_q_heads,
    td3_critic_target,
    td3_target_actions,
)
from ._target import soft_target_update

__all__ = [
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
