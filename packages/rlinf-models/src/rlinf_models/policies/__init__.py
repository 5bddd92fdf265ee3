"""Policies: MLP and CNN actor-critics (discrete and continuous actions, action chunks, value head)."""

from ._actor_critic import ActorCritic, PolicyConfig, PolicyOutput, build_policy

__all__ = ["ActorCritic", "PolicyConfig", "PolicyOutput", "build_policy"]
