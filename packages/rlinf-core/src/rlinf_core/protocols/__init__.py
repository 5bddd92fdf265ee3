"""Protocols shared between packages (envs ↔ models ↔ rollout ↔ runners)."""

from ._env import ChunkStepResult, EnvSpec, EpisodeStats, VecEnv
from ._weights import WeightMessage, WeightSyncPeer, receive_weights, send_weights

__all__ = [
    "ChunkStepResult",
    "EnvSpec",
    "EpisodeStats",
    "VecEnv",
    "WeightMessage",
    "WeightSyncPeer",
    "receive_weights",
    "send_weights",
]
