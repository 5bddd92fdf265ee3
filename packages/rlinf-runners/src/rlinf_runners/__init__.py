"""rlinf_runners: the training loops over worker groups (embodied, reasoning, agent), the apps and their CLI.

``rlinf_runners.apps`` composes each app's config, checks and launch; ``rlinf_runners.cli.main`` is the
command line of ``apps/*/train.py`` and ``eval.py``. The runners (and with them Ray) load on first use, so that
the command line can prepare the process before Ray is imported.
"""

from importlib.metadata import version as _version
from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._config import LoggerConfig, RunnerConfig

if TYPE_CHECKING:
    from ._agent import AGENT_ADV_TYPES, AgentRunner, TurnRewardConfig, turn_advantages
    from ._embodied import EmbodiedRunner, GroupLike, RunResult
    from ._reasoning import REASONING_ADV_TYPES, ReasoningRunner, SFTConfig

__version__ = _version("rlinf-runners")

# The runners pull in Ray (through rlinf_scheduler): loaded on first use (see the module docstring).
__getattr__ = lazy_exports(
    __name__,
    {
        "AGENT_ADV_TYPES": "._agent",
        "AgentRunner": "._agent",
        "TurnRewardConfig": "._agent",
        "turn_advantages": "._agent",
        "EmbodiedRunner": "._embodied",
        "GroupLike": "._embodied",
        "RunResult": "._embodied",
        "REASONING_ADV_TYPES": "._reasoning",
        "ReasoningRunner": "._reasoning",
        "SFTConfig": "._reasoning",
    },
)


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
