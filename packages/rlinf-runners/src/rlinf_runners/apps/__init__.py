"""The applications: root config classes, cross-section checks, group launch, runner construction.

One class per app (:class:`EmbodiedApp`, :class:`ReasoningApp`, :class:`AgentApp`), each with its root config
class (:class:`EmbodiedConfig`, :class:`ReasoningConfig`, :class:`AgentConfig`: the YAML files of
``apps/<name>/config``), and :func:`run_app`, which starts the cluster, launches the groups and trains or
evaluates. ``rlinf_runners.cli.main`` is the command line over them::

    app = EmbodiedApp("apps/embodied")
    cfg = app.load_config(app.config_dir / "cartpole_ppo.yaml", ["runner.max_epochs=10"])
    result = run_app(app, cfg)
"""

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlinf_core import lazy_exports

from ._agent import AgentApp, AgentConfig
from ._app import App, AppRunner, OnStep, WorkerClasses, resolve_checkpoint, run_app
from ._collect import SCRIPTED_EXPERTS
from ._collect import main as collect
from ._demos import main as make_demos
from ._embodied import EmbodiedApp, EmbodiedConfig
from ._llm import LLMApp
from ._reasoning import ReasoningApp, ReasoningConfig

if TYPE_CHECKING:
    from ._sft import EmbodiedSFTConfig, SFTDataConfig, run_sft

# The SFT app reads LeRobot datasets (pyarrow): imported on first use, not by every training command.
__getattr__ = lazy_exports(
    __name__,
    {
        "EmbodiedSFTConfig": "._sft",
        "SFTDataConfig": "._sft",
        "run_sft": "._sft",
    },
)


def sft(argv: list[str], *, app_dir: Path) -> int:
    """The command behind ``apps/embodied/sft.py`` (see ``rlinf_runners.apps._sft``)."""
    from ._sft import main

    return main(argv, app_dir=app_dir)


APPS: dict[str, type[App[Any]]] = {
    "embodied": EmbodiedApp,
    "reasoning": ReasoningApp,
    "agent": AgentApp,
}
"""The apps by name."""

__all__ = [
    "APPS",
    "SCRIPTED_EXPERTS",
    "AgentApp",
    "AgentConfig",
    "App",
    "AppRunner",
    "EmbodiedApp",
    "EmbodiedConfig",
    "EmbodiedSFTConfig",
    "LLMApp",
    "OnStep",
    "ReasoningApp",
    "ReasoningConfig",
    "SFTDataConfig",
    "WorkerClasses",
    "collect",
    "make_demos",
    "resolve_checkpoint",
    "run_app",
    "run_sft",
    "sft",
]
