"""Runners: the training loops that drive worker groups (embodied now; reasoning and agent later)."""

from ._config import LoggerConfig, RunnerConfig
from ._embodied import EmbodiedRunner, GroupLike, RunResult
from ._pipeline import peer_slices

__all__ = ["EmbodiedRunner", "GroupLike", "LoggerConfig", "RunResult", "RunnerConfig", "peer_slices"]
