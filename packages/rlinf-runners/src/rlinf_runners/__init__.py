"""rlinf_runners: the training loops that drive worker groups (embodied, reasoning, agent)."""

from importlib.metadata import version as _version

from ._agent import AGENT_ADV_TYPES, AgentRunner, TurnRewardConfig, turn_advantages
from ._config import LoggerConfig, RunnerConfig
from ._embodied import EmbodiedRunner, GroupLike, RunResult
from ._reasoning import REASONING_ADV_TYPES, ReasoningRunner, SFTConfig

__version__ = _version("rlinf-runners")

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
    "__version__",
    "turn_advantages",
]
