"""Runners: the training loops that drive worker groups (embodied now; reasoning and agent later)."""

from ._config import LoggerConfig, RunnerConfig
from ._embodied import EmbodiedRunner, GroupLike, RunResult
from ._pipeline import peer_slices
from ._reasoning import REASONING_ADV_TYPES, ReasoningRunner, SFTConfig, ShardedGroupLike

__all__ = [
    "REASONING_ADV_TYPES",
    "EmbodiedRunner",
    "GroupLike",
    "LoggerConfig",
    "ReasoningRunner",
    "RunResult",
    "RunnerConfig",
    "SFTConfig",
    "ShardedGroupLike",
    "peer_slices",
]
