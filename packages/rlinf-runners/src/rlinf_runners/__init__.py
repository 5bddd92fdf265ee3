"""rlinf_runners: the training loops (a ``Runner`` base; embodied, reasoning, agent), the apps and their CLI.

``rlinf_runners.apps`` composes each app's config, checks and launch; ``rlinf_runners.cli.main`` is the
command line of ``apps/*/train.py`` and ``eval.py``. The runners (and with them Ray) load on first use, so that
the command line can prepare the process before Ray is imported.
"""

from importlib.metadata import version as _version
from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._config import RUNNER_MODES, EmbodiedRunnerConfig, LoggerConfig, RunnerConfig

if TYPE_CHECKING:
    from ._agent import AGENT_ADV_TYPES, AgentRunner, TurnRewardConfig, turn_advantages
    from ._async import AsyncEnvRunner
    from ._async_embodied import AsyncEmbodiedRunner
    from ._async_offpolicy import AsyncOffPolicyRunner
    from ._base import Runner, RunResult, StepCallback
    from ._embodied import EmbodiedRunner, EnvRunner
    from ._llm import LLMRunner, SFTConfig
    from ._offpolicy import OffPolicyRunner
    from ._reasoning import REASONING_ADV_TYPES, ReasoningRunner
    from ._sft import EmbodiedSFTRunner, SFTSamples

__version__ = _version("rlinf-runners")

# The runners pull in Ray (through rlinf_scheduler): loaded on first use (see the module docstring).
__getattr__ = lazy_exports(
    __name__,
    {
        "AGENT_ADV_TYPES": "._agent",
        "AgentRunner": "._agent",
        "TurnRewardConfig": "._agent",
        "turn_advantages": "._agent",
        "AsyncEnvRunner": "._async",
        "AsyncEmbodiedRunner": "._async_embodied",
        "AsyncOffPolicyRunner": "._async_offpolicy",
        "Runner": "._base",
        "RunResult": "._base",
        "StepCallback": "._base",
        "EmbodiedRunner": "._embodied",
        "EnvRunner": "._embodied",
        "OffPolicyRunner": "._offpolicy",
        "LLMRunner": "._llm",
        "SFTConfig": "._llm",
        "REASONING_ADV_TYPES": "._reasoning",
        "ReasoningRunner": "._reasoning",
        "EmbodiedSFTRunner": "._sft",
        "SFTSamples": "._sft",
    },
)


__all__ = [
    "AGENT_ADV_TYPES",
    "REASONING_ADV_TYPES",
    "RUNNER_MODES",
    "AgentRunner",
    "AsyncEmbodiedRunner",
    "AsyncEnvRunner",
    "AsyncOffPolicyRunner",
    "EmbodiedRunner",
    "EmbodiedRunnerConfig",
    "EmbodiedSFTRunner",
    "EnvRunner",
    "LLMRunner",
    "LoggerConfig",
    "OffPolicyRunner",
    "ReasoningRunner",
    "RunResult",
    "Runner",
    "RunnerConfig",
    "SFTConfig",
    "SFTSamples",
    "StepCallback",
    "TurnRewardConfig",
    "__version__",
    "turn_advantages",
]
