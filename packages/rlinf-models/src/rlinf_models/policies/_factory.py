"""``build_inference_policy``: the policy class a rollout runs, chosen by ``actor.model``."""

from __future__ import annotations

from rlinf_core.protocols import EnvSpec

from ._actor_critic import ActorCritic
from ._config import PolicyConfig
from ._sac import SquashedGaussianPolicy

__all__ = ["build_inference_policy"]


def build_inference_policy(spec: EnvSpec, config: PolicyConfig) -> ActorCritic | SquashedGaussianPolicy:
    """The policy the rollout runs for ``config``: the off-policy tanh-Gaussian one when ``add_q_head``.

    Both classes have ``act(obs, deterministic=...) -> PolicyOutput`` and ``value(obs)``, and their state dicts
    are what the matching actor worker sends.
    """
    if config.add_q_head:
        return SquashedGaussianPolicy(spec, config)
    return ActorCritic(spec, config)
