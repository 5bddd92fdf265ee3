"""The agent app: ``AgentConfig`` (multi-turn tool use: calculator and search over a local corpus).

``AgentConfig`` composes the configs each package owns: ``cluster`` (rlinf_scheduler), ``runner``, ``sft`` and
``turn_reward`` (rlinf_runners), ``algorithm``, ``data`` and ``reward`` (rlinf_core), ``actor``
(rlinf_models.llm), ``rollout`` (rlinf_rollout.llm), ``agent`` and ``tools`` (rlinf_rollout.agent). Placement,
data paths and launch are shared with the reasoning app (:class:`LLMApp`); the corpus path is resolved the
same way as the data paths. With ``tools.search_backend: service`` the app also places and launches the
``retriever`` group (:class:`~rlinf_rollout.agent.RetrieverWorker`), which the rollout's ``search`` tool calls.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from rlinf_algos.rewards import get_reward_class
from rlinf_core.config import AlgorithmConfig
from rlinf_core.data import DataConfig
from rlinf_core.rewards import RewardConfig
from rlinf_models.llm import SMOLLM2_ALIAS, LLMActorConfig, LLMModelConfig
from rlinf_rollout.agent import AgentLoopConfig, ToolsConfig, build_system_prompt, build_toolbox
from rlinf_rollout.llm import LLMRolloutConfig
from rlinf_scheduler import Cluster, ClusterConfig, ModelParallelComponentPlacement, Worker

from .._agent import AGENT_ADV_TYPES, AgentRunner, TurnRewardConfig
from .._config import RunnerConfig
from .._llm import SFTConfig
from ._app import OnStep, WorkerClasses
from ._llm import LLMApp

__all__ = ["AgentApp", "AgentConfig"]

RETRIEVER_GROUP = "retriever"
"""Component and group name of the retrieval service (``tools.search_backend: service``)."""


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

    def extra_components(self, cfg: AgentConfig) -> tuple[str, ...]:
        """``retriever`` when ``search`` runs as a service."""
        return (RETRIEVER_GROUP,) if cfg.tools.search_backend == "service" else ()

    def placed_components(self, cfg: AgentConfig) -> set[str]:
        """The placed components; ``retriever`` exactly when ``tools.search_backend`` is ``service``.

        Raises:
            ValueError: naming ``tools.search_backend`` when the placement and the backend disagree, or as
                :meth:`App.placed_components`.
        """
        placed = {c.strip() for key in cfg.cluster.component_placement for c in key.split(",")}
        service = cfg.tools.search_backend == "service"
        if service and RETRIEVER_GROUP not in placed:
            raise ValueError(
                "tools.search_backend is 'service' but cluster.component_placement places no 'retriever' "
                f"(it places {sorted(placed)}); add one, e.g. 'actor,rollout,reward,retriever: 0' (collocated) "
                "or 'retriever: 1' (its own slot), or set tools.search_backend: local (allowed: local, service)"
            )
        if not service and RETRIEVER_GROUP in placed:
            raise ValueError(
                "cluster.component_placement places 'retriever' but tools.search_backend is 'local' (each rollout "
                "worker searches in process); set tools.search_backend: service, or remove 'retriever'"
            )
        return super().placed_components(cfg)

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
                f"reward.reward_type must be 'searchr1' (EM or F1 of <answer>), got {cfg.reward.reward_type!r}"
            )
        else:
            try:  # the reward worker builds the same object: refuse bad kwargs before Ray starts
                get_reward_class(cfg.reward.reward_type)(**dict(cfg.reward.kwargs))
            except (TypeError, ValueError) as e:
                problems.append(f"reward.kwargs: {e}")
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
        kwargs: dict[str, Any] = {"base_dir": str(self.app_dir)}
        if cfg.tools.search_backend == "service":
            kwargs["retriever_group"] = RETRIEVER_GROUP
        return (cls, (cfg.rollout, cfg.actor.model, cfg.agent, self.tools(cfg)), kwargs)

    def launch(
        self, cfg: AgentConfig, cluster: Cluster, *, worker_classes: WorkerClasses | None = None
    ) -> dict[str, Any]:
        """The actor, rollout and reward groups, and with ``tools.search_backend: service`` the retriever group.

        The retriever starts first (building its index while the models load); the rollout workers look its
        ranks up on their first search.

        Returns:
            ``{"actor", "rollout", "reward"}`` groups, plus ``"retriever"`` in service mode.
        """
        if cfg.tools.search_backend != "service":
            return super().launch(cfg, cluster, worker_classes=worker_classes)
        from rlinf_rollout.agent import RetrieverWorker  # Ray is loaded by now

        tools = self.tools(cfg)
        placement = ModelParallelComponentPlacement(cfg.cluster, cluster)
        cls: type[Worker] = dict(worker_classes or {}).get(RETRIEVER_GROUP, RetrieverWorker)
        retriever = cls.create_group(tools.retriever, tools.corpus_path).launch(
            cluster, placement.get_strategy(RETRIEVER_GROUP), name=RETRIEVER_GROUP
        )
        try:
            groups = super().launch(cfg, cluster, worker_classes=worker_classes)
            retriever.wait_ready(timeout=self.launch_timeout_s)
        except BaseException:
            retriever.shutdown()
            raise
        return {**groups, RETRIEVER_GROUP: retriever}

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
