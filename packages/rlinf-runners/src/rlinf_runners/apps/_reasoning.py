"""The reasoning app: ``ReasoningConfig`` (SFT warm-up, then GRPO / PPO / Reinforce++ with a verifier).

``ReasoningConfig`` composes the configs each package owns: ``cluster`` (rlinf_scheduler), ``runner`` and
``sft`` (rlinf_runners), ``algorithm``, ``reward`` and ``data`` (rlinf_core), ``actor`` (rlinf_models.llm) and
``rollout`` (rlinf_rollout.llm). Placement, data paths and launch are shared with the agent app (:class:`LLMApp`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
from collections.abc import Mapping
from typing import Any

import attrs
from rlinf_core.config import AlgorithmConfig, ConfigError
from rlinf_core.data import DataConfig
from rlinf_core.rewards import RewardConfig
from rlinf_models.llm import SMOLLM2_ALIAS, LLMActorConfig, LLMModelConfig
from rlinf_rollout.llm import LLMRolloutConfig
from rlinf_scheduler import (
    Cluster,
    ClusterConfig,
    ModelParallelComponentPlacement,
    StaticClusterView,
    Worker,
)

from .._config import LoggerConfig, RunnerConfig
from .._reasoning import REASONING_ADV_TYPES, ReasoningRunner, SFTConfig, pipeline_problems
from ._app import OnStep, WorkerClasses
from ._llm import LLMApp

__all__ = ["ReasoningApp", "ReasoningConfig"]


@attrs.frozen(kw_only=True)
class ReasoningConfig:
    """The whole reasoning run (``apps/reasoning/config/*.yaml``)."""

    cluster: ClusterConfig = attrs.field(
        factory=lambda: ClusterConfig(
            component_placement={"actor,rollout,reward": "0"}, simulated_accelerators_per_node=1
        )
    )
    runner: RunnerConfig = attrs.field(
        factory=lambda: RunnerConfig(
            logger=LoggerConfig(log_path="runs/reasoning", experiment_name="reasoning")
        )
    )
    algorithm: AlgorithmConfig = attrs.field(
        factory=lambda: AlgorithmConfig(adv_type="grpo", loss_type="actor", group_size=4, update_epoch=1)
    )
    actor: LLMActorConfig = attrs.field(
        factory=lambda: LLMActorConfig(model=LLMModelConfig(model_path=SMOLLM2_ALIAS))
    )
    rollout: LLMRolloutConfig = attrs.field(factory=LLMRolloutConfig)
    reward: RewardConfig = attrs.field(factory=RewardConfig)
    data: DataConfig = attrs.field(factory=DataConfig)
    sft: SFTConfig = attrs.field(factory=SFTConfig)


class ReasoningApp(LLMApp[ReasoningConfig]):
    """Reasoning RL with verifiable rewards: actor, rollout and reward groups over prompt datasets."""

    name = "reasoning"
    config_cls = ReasoningConfig
    default_config = "grpo_smollm2_cpu"
    pipelines = True
    curve_keys = (
        "eval/accuracy",
        "rollout/accuracy",
        "rollout/reward_mean",
        "rollout/response_len_mean",
        "sft/loss",
    )

    def section_problems(self, cfg: ReasoningConfig) -> list[str]:
        """Estimator vs model and group size, sampling temperatures, overlong buffer, batch vs samples."""
        problems = []
        if cfg.reward.reward_type.lower() == "math" and importlib.util.find_spec("math_verify") is None:
            # Otherwise the reward workers fail on start, after Ray and the model workers are up.
            problems.append(
                "reward.reward_type 'math' needs math-verify, which is not installed: "
                'pip install "rlinf-algos[math]"'
            )
        alg = cfg.algorithm
        adv = alg.adv_type.lower()
        if adv not in REASONING_ADV_TYPES:
            problems.append(
                f"algorithm.adv_type {alg.adv_type!r} is not one of {', '.join(REASONING_ADV_TYPES)}"
            )
        if adv == "gae" and not cfg.actor.model.add_value_head:
            problems.append(
                "actor.model.add_value_head must be true for algorithm.adv_type 'gae' (the PPO critic)"
            )
        if adv == "grpo" and alg.group_size < 2:
            problems.append(
                f"algorithm.group_size must be >= 2 for GRPO (got {alg.group_size}): advantages are group-relative"
            )
        if alg.use_reinpp_baseline and alg.group_size < 2:
            problems.append("algorithm.use_reinpp_baseline needs algorithm.group_size >= 2")
        sampling = cfg.rollout.sampling
        if not math.isclose(cfg.actor.temperature, sampling.temperature):
            problems.append(
                f"actor.temperature ({cfg.actor.temperature}) must equal rollout.sampling.temperature "
                f"({sampling.temperature}): the PPO ratio compares the sampling distribution"
            )
        if alg.overlong_buffer_len > sampling.max_new_tokens:
            problems.append(
                f"algorithm.overlong_buffer_len ({alg.overlong_buffer_len}) exceeds "
                f"rollout.sampling.max_new_tokens ({sampling.max_new_tokens})"
            )
        if sampling.temperature <= 0:
            problems.append(
                "rollout.sampling.temperature must be > 0 for RL (greedy samples make every group equal)"
            )
        samples, gbs = cfg.data.rollout_batch_size * alg.group_size, cfg.actor.global_batch_size
        if samples % gbs:
            problems.append(
                f"data.rollout_batch_size x algorithm.group_size ({cfg.data.rollout_batch_size} x "
                f"{alg.group_size} = {samples}) must be a multiple of actor.global_batch_size ({gbs})"
            )
        if cfg.runner.pipeline and cfg.cluster.simulated_accelerators_per_node > 0:
            view = StaticClusterView(
                num_nodes=cfg.cluster.num_nodes, accelerators=cfg.cluster.simulated_accelerators_per_node
            )
            with contextlib.suppress(ValueError):  # an invalid placement is reported by the placement check
                problems += _pipeline_problems(cfg, ModelParallelComponentPlacement(cfg.cluster, view))
        return problems

    def launch(
        self, cfg: ReasoningConfig, cluster: Cluster, *, worker_classes: WorkerClasses | None = None
    ) -> dict[str, Any]:
        """Check ``runner.pipeline`` against the cluster's placement, then launch (:meth:`LLMApp.launch`)."""
        is_pipelined(cfg, ModelParallelComponentPlacement(cfg.cluster, cluster))
        return super().launch(cfg, cluster, worker_classes=worker_classes)

    def rollout_group(self, cfg: ReasoningConfig) -> tuple[type[Worker], tuple[Any, ...], dict[str, Any]]:
        """The LLM rollout worker (generation engine of ``rollout.engine``) and its arguments."""
        from rlinf_rollout.llm import LLMRolloutWorker  # loads the engines' dependencies on first use

        cls: type[Worker] = LLMRolloutWorker
        return cls, (cfg.rollout, cfg.actor.model), {}

    def build_runner(
        self,
        cfg: ReasoningConfig,
        cluster: Cluster,
        groups: Mapping[str, Any],
        *,
        on_step: OnStep | None = None,
    ) -> ReasoningRunner:
        """The :class:`ReasoningRunner` of ``cfg`` (loads the tokenizer and the datasets on the driver)."""
        return ReasoningRunner(
            cfg.runner,
            pipeline=is_pipelined(cfg, ModelParallelComponentPlacement(cfg.cluster, cluster)),
            pipeline_chunk_prompts=cfg.runner.pipeline_chunk_prompts,
            **self.runner_inputs(cfg, cluster, groups),
            refresh_reference=cfg.algorithm.kl_beta > 0 or cfg.algorithm.reinpp_kl_beta > 0,
            on_step=on_step,
        )


def _pipeline_problems(cfg: ReasoningConfig, placement: ModelParallelComponentPlacement) -> list[str]:
    """Why ``cfg`` cannot run pipelined on ``placement`` (empty: it can)."""
    problems = []
    if not placement.is_disaggregated:
        problems.append(
            "runner.pipeline overlaps generation and training, which needs actor and rollout on disjoint "
            f"devices (a disaggregated placement); this placement is {placement.placement_mode.value}"
        )
    if cfg.runner.dynamic_scaling:
        problems.append(
            "runner.pipeline and runner.dynamic_scaling exclude each other (dynamic scaling hands the rollout's "
            "devices to the actor between the phases the pipeline overlaps)"
        )
    if cfg.actor.training_backend != "fsdp":
        problems.append(
            f"runner.pipeline streams micro-batches into the fsdp backend; actor.training_backend is "
            f"{cfg.actor.training_backend!r}"
        )
    if cfg.actor.max_tokens_per_mbs is not None:
        problems.append(
            "runner.pipeline cuts micro-batches by actor.micro_batch_size; unset actor.max_tokens_per_mbs"
        )
    return problems + pipeline_problems(
        cfg.algorithm,
        rollout_batch_size=cfg.data.rollout_batch_size,
        global_batch_size=cfg.actor.global_batch_size,
        offload=False,
    )


def is_pipelined(cfg: ReasoningConfig, placement: ModelParallelComponentPlacement) -> bool:
    """Whether the run is pipelined: ``runner.pipeline`` true, or null with a placement and config that allow it.

    Raises:
        ConfigError: ``runner.pipeline: true`` with something that prevents it (every reason listed).
    """
    if cfg.runner.pipeline is False:
        return False
    problems = _pipeline_problems(cfg, placement)
    if cfg.runner.pipeline and problems:
        raise ConfigError(problems, "the reasoning config")
    return not problems
