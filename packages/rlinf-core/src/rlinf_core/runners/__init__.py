"""Runners: the training loops that drive worker groups (embodied now; reasoning and agent later)."""

from ._agent import AGENT_ADV_TYPES, AgentRunner, TurnRewardConfig, turn_advantages
from ._config import LoggerConfig, RunnerConfig
from ._embodied import EmbodiedRunner, GroupLike, RunResult
from ._reasoning import REASONING_ADV_TYPES, ReasoningRunner, SFTConfig

__all__ = [
    "AGENT_ADV_TYPES",
    "REASONING_ADV_TYPES",
    "AgentRunner",
    "EmbodiedRunner",
    "GroupLike",
    "LoggerConfig",
    "ReasoningRunner",
    "RunResult",
    "RunnerConfig",
    "SFTConfig",
    "TurnRewardConfig",
    "turn_advantages",
]
