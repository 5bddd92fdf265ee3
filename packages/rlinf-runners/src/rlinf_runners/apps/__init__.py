"""The applications: root config classes, cross-section checks, group launch, runner construction.

One class per app (:class:`EmbodiedApp`, :class:`ReasoningApp`, :class:`AgentApp`), each with its root config
class (:class:`EmbodiedConfig`, :class:`ReasoningConfig`, :class:`AgentConfig`: the YAML files of
``apps/<name>/config``), and :func:`run_app`, which starts the cluster, launches the groups and trains or
evaluates. ``rlinf_runners.cli.main`` is the command line over them::

    app = EmbodiedApp("apps/embodied")
    cfg = app.load_config(app.config_dir / "cartpole_ppo.yaml", ["runner.max_epochs=10"])
    result = run_app(app, cfg)
"""

from typing import Any

from ._agent import AgentApp, AgentConfig
from ._app import App, AppRunner, OnStep, WorkerClasses, resolve_checkpoint, run_app
from ._collect import SCRIPTED_EXPERTS
from ._collect import main as collect
from ._demos import main as make_demos
from ._embodied import EmbodiedApp, EmbodiedConfig
from ._llm import LLMApp
from ._reasoning import ReasoningApp, ReasoningConfig
from ._sft import EmbodiedSFTConfig, SFTDataConfig, run_sft
from ._sft import main as sft

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
