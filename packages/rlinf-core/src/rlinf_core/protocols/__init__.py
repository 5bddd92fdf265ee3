"""Protocols shared between packages (envs ↔ models ↔ rollout ↔ runners): env, weight sync, worker roles."""

from ._env import ChunkStepResult, EnvSpec, EpisodeStats, VecEnv
from ._roles import (
    ActorRole,
    AgentRollout,
    CheckpointRole,
    EmbodiedActor,
    EmbodiedRollout,
    EnvRole,
    LLMActor,
    LLMRollout,
    OffloadRole,
    OffPolicyActor,
    RewardRole,
    RolloutRole,
    TimedRole,
    TrajectoryActor,
)
from ._weights import WeightMessage, WeightSyncPeer, receive_weights, send_weights

__all__ = [
    "ActorRole",
    "AgentRollout",
    "CheckpointRole",
    "ChunkStepResult",
    "EmbodiedActor",
    "EmbodiedRollout",
    "EnvRole",
    "EnvSpec",
    "EpisodeStats",
    "LLMActor",
    "LLMRollout",
    "OffPolicyActor",
    "OffloadRole",
    "RewardRole",
    "RolloutRole",
    "TimedRole",
    "TrajectoryActor",
    "VecEnv",
    "WeightMessage",
    "WeightSyncPeer",
    "receive_weights",
    "send_weights",
]
