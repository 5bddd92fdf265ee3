"""The agent app: ``AgentConfig`` (multi-turn tool use: calculator and search over a local corpus).

``AgentConfig`` composes the configs each package owns: ``cluster`` (rlinf_scheduler), ``runner``, ``sft`` and
``turn_reward`` (rlinf_runners), ``algorithm``, ``data`` and ``reward`` (rlinf_core), ``actor``
(rlinf_models.llm), ``rollout`` (rlinf_rollout.llm), ``agent`` and ``tools`` (rlinf_rollout.agent). Placement,
data paths and launch are shared with the reasoning app (:class:`LLMApp`); the corpus path is resolved the
same way as the data paths.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from rlinf_core.config import AlgorithmConfig
from rlinf_core.data import DataConfig
from rlinf_core.rewards import RewardConfig
from rlinf_models.llm import SMOLLM2_ALIAS, LLMActorConfig, LLMModelConfig
from rlinf_rollout.agent import AgentLoopConfig, ToolsConfig, build_system_prompt, build_toolbox
from rlinf_rollout.llm import LLMRolloutConfig
from rlinf_scheduler import Cluster, ClusterConfig, Worker

from .._agent import AGENT_ADV_TYPES, AgentRunner, TurnRewardConfig
from .._config import RunnerConfig
from .._llm import SFTConfig
from ._app import OnStep
from ._llm import LLMApp

__all__ = ["AgentApp", "AgentConfig"]


@attrs.frozen(kw_only=True)
class AgentConfig:
    """The whole agent run (``apps/agent/config/*.yaml``)."""

    cluster: ClusterConfig = attrs.field(
        factory=lambda: ClusterConfig(
            component_placement={"actor,rollout,reward": "0"}, simulated_accelerators_per_node=1
        )
    )
    runner: RunnerConfig = attrs.field(factory=RunnerConfig)
    algorithm: AlgorithmConfig = attrs.field(
        factory=lambda: AlgorithmConfig(adv_type="grpo_dynamic", loss_type="actor", group_size=4)
    )
    actor: LLMActorConfig = attrs.field(
        factory=lambda: LLMActorConfig(model=LLMModelConfig(model_path=SMOLLM2_ALIAS))
    )
    rollout: LLMRolloutConfig = attrs.field(factory=LLMRolloutConfig)
    reward: RewardConfig = attrs.field(factory=lambda: RewardConfig(reward_type="searchr1"))
    data: DataConfig = attrs.field(
        factory=lambda: DataConfig(
            train_path="data/train.jsonl", eval_path="data/eval.jsonl", sft_path="data/sft.jsonl"
        )
    )
    sft: SFTConfig = attrs.field(factory=SFTConfig)
    agent: AgentLoopConfig = attrs.field(factory=AgentLoopConfig)
    tools: ToolsConfig = attrs.field(factory=lambda: ToolsConfig(corpus_path="data/corpus.jsonl"))
    turn_reward: TurnRewardConfig = attrs.field(factory=TurnRewardConfig)


class AgentApp(LLMApp[AgentConfig]):
    """Multi-turn agent RL: actor, agent-loop rollout (with tools) and reward groups."""

    name = "agent"
    config_cls = AgentConfig
    default_config = "smollm2_tools"
    curve_keys = ("eval/success_rate", "rollout/success_rate")
    launch_timeout_s = 900.0
    sft_requires_solution = False  # demonstrations are lists of assistant turns ('demo'), not solutions

    def tools(self, cfg: AgentConfig) -> ToolsConfig:
        """``cfg.tools`` with its corpus path resolved like the data paths (absolute, for the workers)."""
        if not cfg.tools.corpus_path:
            return cfg.tools
        return attrs.evolve(
            cfg.tools, corpus_path=str(self.resolve_data_path(cfg.tools.corpus_path).resolve())
        )

    def section_problems(self, cfg: AgentConfig) -> list[str]:
        """Corpus, estimator and group size, reward, batch vs micro-batch, prompt vs episode length."""
        problems = []
        corpus = cfg.tools.corpus_path
        if corpus and not self.resolve_data_path(corpus).is_file():
            problems.append(f"tools.corpus_path: {corpus!r} does not exist, as given or under {self.app_dir}")
        alg = cfg.algorithm
        if alg.adv_type.lower() not in AGENT_ADV_TYPES:
            problems.append(f"algorithm.adv_type {alg.adv_type!r} is not one of {', '.join(AGENT_ADV_TYPES)}")
        if alg.group_size < 2:
            problems.append(f"algorithm.group_size must be >= 2 for group advantages, got {alg.group_size}")
        if cfg.reward.reward_type.lower() != "searchr1":
            problems.append(
                f"reward.reward_type must be 'searchr1' (exact match of <answer>), got {cfg.reward.reward_type!r}"
            )
        episodes = cfg.data.rollout_batch_size * alg.group_size
        if episodes % cfg.actor.micro_batch_size:
            problems.append(
                f"data.rollout_batch_size x algorithm.group_size ({episodes}) must be a multiple of "
                f"actor.micro_batch_size ({cfg.actor.micro_batch_size})"
            )
        if cfg.data.max_prompt_length >= cfg.agent.max_total_tokens:
            problems.append(
                f"data.max_prompt_length ({cfg.data.max_prompt_length}) must be below agent.max_total_tokens "
                f"({cfg.agent.max_total_tokens})"
            )
        return problems

    def rollout_group(self, cfg: AgentConfig) -> tuple[type[Worker], tuple[Any, ...], dict[str, Any]]:
        """The agent-loop rollout worker (tools built in each worker) and its arguments."""
        from rlinf_rollout.agent import AgentRolloutWorker  # loads the engines' dependencies on first use

        cls: type[Worker] = AgentRolloutWorker
        return (
            cls,
            (cfg.rollout, cfg.actor.model, cfg.agent, self.tools(cfg)),
            {"base_dir": str(self.app_dir)},
        )

    def system_prompt(self, cfg: AgentConfig) -> str:
        """``data.system_prompt``, or the instructions and the tools of ``cfg.tools``."""
        if cfg.data.system_prompt:
            return cfg.data.system_prompt
        toolbox = build_toolbox(self.tools(cfg), base_dir=self.app_dir)
        try:
            return build_system_prompt(toolbox)
        finally:
            toolbox.close()

    def build_runner(
        self,
        cfg: AgentConfig,
        cluster: Cluster,
        groups: Mapping[str, Any],
        *,
        on_step: OnStep | None = None,
    ) -> AgentRunner:
        """The :class:`AgentRunner` of ``cfg`` (loads the tokenizer and the datasets on the driver)."""
        return AgentRunner(
            cfg.runner,
            **self.runner_inputs(cfg, cluster, groups),
            turn_reward=cfg.turn_reward,
            on_step=on_step,
        )
