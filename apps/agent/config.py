"""The agent app's configuration (``AgentAppConfig``) and the launch of its worker groups.

``AgentAppConfig`` composes the configs each package owns: ``cluster`` (rlinf_scheduler), ``runner``,
``algorithm``, ``data``, ``sft``, ``reward``, ``turn_reward`` (rlinf_core), ``actor`` (rlinf_models.llm),
``rollout`` (rlinf_rollout.llm), ``agent`` and ``tools`` (rlinf_rollout.agent). Relative data and corpus paths
are resolved against this directory (``apps/agent``). :func:`check_config` runs before Ray starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
from rlinf_core.config import AlgorithmConfig, ConfigError, load_config, unstructure_config
from rlinf_core.data import ChatPromptEncoder, DataConfig, PromptDataset, load_prompt_dataset
from rlinf_core.rewards import RewardConfig, RewardWorker
from rlinf_models.llm import (
    SMOLLM2_ALIAS,
    LLMActorConfig,
    LLMModelConfig,
    actor_data_parallel_size,
    actor_worker_class,
    actor_worker_kwargs,
    check_training_backend,
    training_backend_problems,
)
from rlinf_rollout.agent import AgentLoopConfig, ToolsConfig, build_system_prompt, build_toolbox
from rlinf_rollout.llm import LLMRolloutConfig
from rlinf_runners import AgentRunner, RunnerConfig, RunResult, SFTConfig, TurnRewardConfig
from rlinf_scheduler import Cluster, ClusterConfig, ModelParallelComponentPlacement, Worker

__all__ = [
    "APP_DIR",
    "CONFIG_DIR",
    "AgentAppConfig",
    "check_config",
    "launch_groups",
    "load_agent_config",
    "resolve_path",
    "run_agent",
]

APP_DIR = Path(__file__).resolve().parent
CONFIG_DIR = APP_DIR / "config"


def _default_actor() -> LLMActorConfig:
    return LLMActorConfig(model=LLMModelConfig(model_path=SMOLLM2_ALIAS))


@attrs.frozen(kw_only=True)
class AgentAppConfig:
    """The whole agent run."""

    cluster: ClusterConfig = attrs.field(
        factory=lambda: ClusterConfig(
            component_placement={"actor,rollout,reward": "0"}, simulated_accelerators_per_node=1
        )
    )
    runner: RunnerConfig = attrs.field(factory=RunnerConfig)
    algorithm: AlgorithmConfig = attrs.field(
        factory=lambda: AlgorithmConfig(adv_type="grpo_dynamic", loss_type="actor", group_size=4)
    )
    actor: LLMActorConfig = attrs.field(factory=_default_actor)
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


def resolve_path(path: str) -> Path:
    """``path`` itself when absolute, else relative to ``apps/agent``."""
    p = Path(path).expanduser()
    return p if p.is_absolute() else APP_DIR / p


def check_config(cfg: AgentAppConfig) -> None:
    """Checks that span sections (files exist, batch sizes, estimator, training backend), before any expensive work.

    Raises:
        ConfigError: listing every problem with its dotted path.
        ImportError: ``actor.training_backend: megatron`` without megatron-core (names the extra).
    """
    problems: list[str] = []
    for key in ("train_path", "eval_path", "sft_path"):
        value = getattr(cfg.data, key)
        if value and not resolve_path(value).is_file():
            problems.append(
                f"data.{key}: {str(resolve_path(value))!r} does not exist (run apps/agent/prepare_data.py)"
            )
    if not cfg.data.train_path:
        problems.append("data.train_path is required")
    if cfg.tools.corpus_path and not resolve_path(cfg.tools.corpus_path).is_file():
        problems.append(f"tools.corpus_path: {str(resolve_path(cfg.tools.corpus_path))!r} does not exist")
    if cfg.algorithm.adv_type not in ("grpo_dynamic", "grpo"):
        problems.append(
            f"algorithm.adv_type must be 'grpo_dynamic' or 'grpo' for the agent, got {cfg.algorithm.adv_type!r}"
        )
    if cfg.algorithm.group_size < 2:
        problems.append(
            f"algorithm.group_size must be >= 2 for group advantages, got {cfg.algorithm.group_size}"
        )
    if cfg.sft.steps > 0 and not cfg.data.sft_path:
        problems.append("sft.steps > 0 needs data.sft_path (demonstrations)")
    if cfg.reward.reward_type.lower() != "searchr1":
        problems.append(
            f"reward.reward_type must be 'searchr1' (exact match of <answer>), got {cfg.reward.reward_type!r}"
        )
    episodes = cfg.data.rollout_batch_size * cfg.algorithm.group_size
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
    problems += training_backend_problems(cfg.actor, loss_type=cfg.algorithm.loss_type)
    if problems:
        raise ConfigError(problems, "the agent config")
    check_training_backend(cfg.actor)


def load_agent_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> AgentAppConfig:
    """Load a YAML file plus overrides into a checked :class:`AgentAppConfig` (no Ray started)."""
    cfg = load_config(AgentAppConfig, path, overrides)
    check_config(cfg)
    return cfg


def _load(path: str | None, cfg: AgentAppConfig) -> PromptDataset | None:
    if not path:
        return None
    d = cfg.data
    return load_prompt_dataset(
        resolve_path(path),
        prompt_key=d.prompt_key,
        messages_key=d.messages_key,
        answer_key=d.answer_key,
        solution_key=d.solution_key,
    )


def system_prompt(cfg: AgentAppConfig) -> str:
    """The system message of every episode: the instructions and the tools of ``cfg.tools``."""
    if cfg.data.system_prompt:
        return cfg.data.system_prompt
    toolbox = build_toolbox(cfg.tools, base_dir=APP_DIR)
    try:
        return build_system_prompt(toolbox)
    finally:
        toolbox.close()


def _rollout_worker_class() -> type[Worker]:
    from rlinf_rollout.agent import AgentRolloutWorker

    cls: type[Worker] = AgentRolloutWorker
    return cls


def launch_groups(
    cfg: AgentAppConfig, cluster: Cluster, *, timeout_s: float = 900.0
) -> tuple[dict[str, Any], bool]:
    """Launch the actor, agent-rollout and reward groups.

    Returns:
        ``({"actor": group, "rollout": group, "reward": group}, collocated)``.
    """
    placement = ModelParallelComponentPlacement(cfg.cluster, cluster)
    actor = (
        actor_worker_class(cfg.actor)
        .create_group(
            cfg.actor, cfg.algorithm, total_steps=cfg.runner.total_steps, **actor_worker_kwargs(cfg.actor)
        )
        .launch(cluster, placement.get_strategy("actor"), name="actor")
    )
    rollout = (
        _rollout_worker_class()
        .create_group(cfg.rollout, cfg.actor.model, cfg.agent, cfg.tools, base_dir=str(APP_DIR))
        .launch(cluster, placement.get_strategy("rollout"), name="rollout")
    )
    reward_strategy = (
        placement.get_strategy("reward")
        if placement.has_component("reward")
        else placement.get_strategy("actor")
    )
    reward = RewardWorker.create_group(cfg.reward).launch(cluster, reward_strategy, name="reward")
    for group in (actor, rollout, reward):
        group.wait_ready(timeout=timeout_s)
    return {"actor": actor, "rollout": rollout, "reward": reward}, placement.is_collocated


def build_runner(
    cfg: AgentAppConfig,
    groups: dict[str, Any],
    *,
    collocated: bool = False,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> AgentRunner:
    """The :class:`AgentRunner` of ``cfg`` over launched groups (tokenizer loaded on the driver)."""
    import torch
    from rlinf_models.llm import load_tokenizer

    tokenizer = load_tokenizer(cfg.actor.model)
    encoder = ChatPromptEncoder(
        tokenizer, system_prompt=system_prompt(cfg), use_chat_template=cfg.data.use_chat_template
    )
    train = _load(cfg.data.train_path, cfg)
    assert train is not None
    sampling = attrs.asdict(cfg.rollout.sampling)
    return AgentRunner(
        cfg.runner,
        actor=groups["actor"],
        rollout=groups["rollout"],
        reward=groups["reward"],
        algorithm=cfg.algorithm,
        data=cfg.data,
        encoder=encoder,
        train_data=train,
        sampling=sampling,
        eval_data=_load(cfg.data.eval_path, cfg),
        eval_sampling={**sampling, "temperature": 0.0},
        sft=cfg.sft,
        sft_data=_load(cfg.data.sft_path, cfg),
        turn_reward=cfg.turn_reward,
        batch_multiple=cfg.actor.micro_batch_size
        * actor_data_parallel_size(cfg.actor, groups["actor"].world_size),
        to_batch=lambda b: {k: torch.from_numpy(v) for k, v in b.items()},
        offload=collocated and (cfg.actor.enable_offload or cfg.rollout.enable_offload),
        run_config=unstructure_config(cfg),
        on_step=on_step,
    )


def run_agent(
    cfg: AgentAppConfig,
    *,
    cluster: Cluster | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    evaluate_only: str | None = None,
) -> RunResult | dict[str, float]:
    """Start (or use) a cluster, launch the groups and train; or evaluate the checkpoint ``evaluate_only``.

    The cluster is shut down at the end when this function created it.
    """
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    own = cluster is None
    cluster = cluster or Cluster(cfg.cluster)
    groups: dict[str, Any] = {}
    try:
        groups, collocated = launch_groups(cfg, cluster)
        runner = build_runner(cfg, groups, collocated=collocated, on_step=on_step)
        if evaluate_only is not None:
            return runner.evaluate_checkpoint(evaluate_only)
        return runner.run()
    finally:
        if own:
            cluster.shutdown()
        elif cluster.failure is None:
            for group in groups.values():
                group.shutdown()
