"""Protocols shared between packages (envs ↔ models ↔ runners)."""

from ._env import ChunkStepResult, EnvSpec, EpisodeStats, VecEnv

__all__ = ["ChunkStepResult", "EnvSpec", "EpisodeStats", "VecEnv"]
