"""The reasoning app's configuration (``ReasoningConfig``) and the launch of its worker groups.

``ReasoningConfig`` composes the configs each package owns: ``cluster`` (rlinf_scheduler), ``runner``,
``algorithm``, ``reward``, ``data`` and ``sft`` (rlinf_core), ``actor`` (rlinf_models.llm) and ``rollout``
(rlinf_rollout.llm). :func:`check_config` adds the checks that span several sections; it runs before Ray starts.
Placement goes through ``ModelParallelComponentPlacement``: actor and rollout on the same slots (collocated) or
on disjoint ones (disaggregated); the reward component may go anywhere.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
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
from rlinf_rollout.llm import LLMRolloutConfig
from rlinf_runners import (
    REASONING_ADV_TYPES,
    LoggerConfig,
    ReasoningRunner,
    RunnerConfig,
    RunResult,
    SFTConfig,
)
from rlinf_scheduler import Cluster, ClusterConfig, ModelParallelComponentPlacement, StaticClusterView, Worker

__all__ = [
    "APP_DIR",
    "COMPONENTS",
    "CONFIG_DIR",
    "ReasoningConfig",
    "build_runner",
    "check_config",
    "launch_groups",
    "load_datasets",
    "load_reasoning_config",
    "placement_mode",
    "placement_world_sizes",
    "run_reasoning",
]

APP_DIR = Path(__file__).resolve().parent
CONFIG_DIR = APP_DIR / "config"
COMPONENTS = ("actor", "rollout", "reward")


@attrs.frozen(kw_only=True)
class ReasoningConfig:
    """The whole reasoning run."""

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


def resolve_data_path(path: str) -> Path:
    """A data path as given, or relative to the app directory when it does not exist as given."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    in_app = APP_DIR / p
    return in_app if in_app.exists() else p


def placement_world_sizes(cfg: ReasoningConfig, cluster: Cluster | None = None) -> dict[str, int] | None:
    """Processes per component: from the cluster, or on paper when the slots are simulated (else ``None``).

    Raises:
        ValueError: for an invalid placement, one that leaves out actor, rollout or reward, or actor and rollout
            that neither share their slots nor use disjoint ones.
    """
    placed = {c.strip() for key in cfg.cluster.component_placement for c in key.split(",")}
    missing = [c for c in COMPONENTS if c not in placed]
    if missing:
        raise ValueError(
            f"cluster.component_placement: no placement for {missing}; it places {sorted(placed)} "
            f"(e.g. 'actor,rollout,reward: 0' for collocated, or 'actor: 0', 'rollout: 1', 'reward: 0')"
        )
    if cluster is not None:
        placement = ModelParallelComponentPlacement(cfg.cluster, cluster)
        return {c: placement.get_world_size(c) for c in COMPONENTS}
    if cfg.cluster.simulated_accelerators_per_node > 0:
        view = StaticClusterView(
            num_nodes=cfg.cluster.num_nodes, accelerators=cfg.cluster.simulated_accelerators_per_node
        )
        placement = ModelParallelComponentPlacement(cfg.cluster, view)
        return {c: placement.get_world_size(c) for c in COMPONENTS}
    return None


def placement_mode(cfg: ReasoningConfig) -> str | None:
    """``"collocated"`` or ``"disaggregated"`` on paper (simulated slots), else ``None``."""
    if cfg.cluster.simulated_accelerators_per_node <= 0:
        return None
    view = StaticClusterView(
        num_nodes=cfg.cluster.num_nodes, accelerators=cfg.cluster.simulated_accelerators_per_node
    )
    return ModelParallelComponentPlacement(cfg.cluster, view).placement_mode.name.lower()


def _check_paths(cfg: ReasoningConfig) -> list[str]:
    problems = []
    data = cfg.data
    if not data.train_path:
        problems.append(
            "data.train_path is required (a JSONL / Parquet file; see apps/reasoning/prepare_data.py)"
        )
    for key in ("train_path", "eval_path", "sft_path"):
        value = getattr(data, key)
        if value and not resolve_data_path(value).is_file():
            problems.append(
                f"data.{key}: {value!r} does not exist (generate it with `uv run apps/reasoning/prepare_data.py`)"
            )
    if cfg.sft.steps > 0 and not data.sft_path:
        problems.append(
            f"sft.steps is {cfg.sft.steps} but data.sft_path is not set (the warm-up needs demonstrations)"
        )
    if cfg.runner.val_check_interval > 0 and not data.eval_path:
        problems.append("runner.val_check_interval > 0 needs data.eval_path (or set it to -1)")
    return problems


def _check_algorithm(cfg: ReasoningConfig) -> list[str]:
    problems = []
    alg = cfg.algorithm
    if alg.adv_type.lower() not in REASONING_ADV_TYPES:
        problems.append(f"algorithm.adv_type {alg.adv_type!r} is not one of {', '.join(REASONING_ADV_TYPES)}")
    if alg.adv_type.lower() == "gae" and not cfg.actor.model.add_value_head:
        problems.append(
            "actor.model.add_value_head must be true for algorithm.adv_type 'gae' (the PPO critic)"
        )
    if alg.adv_type.lower() in ("grpo",) and alg.group_size < 2:
        problems.append(
            f"algorithm.group_size must be >= 2 for GRPO (got {alg.group_size}): advantages are group-relative"
        )
    if alg.use_reinpp_baseline and alg.group_size < 2:
        problems.append("algorithm.use_reinpp_baseline needs algorithm.group_size >= 2")
    if not math.isclose(cfg.actor.temperature, cfg.rollout.sampling.temperature):
        problems.append(
            f"actor.temperature ({cfg.actor.temperature}) must equal rollout.sampling.temperature "
            f"({cfg.rollout.sampling.temperature}): the PPO ratio compares the sampling distribution"
        )
    max_new = cfg.rollout.sampling.max_new_tokens
    if alg.overlong_buffer_len > max_new:
        problems.append(
            f"algorithm.overlong_buffer_len ({alg.overlong_buffer_len}) exceeds rollout.sampling.max_new_tokens ({max_new})"
        )
    if cfg.rollout.sampling.temperature <= 0:
        problems.append(
            "rollout.sampling.temperature must be > 0 for RL (greedy samples make every group equal)"
        )
    return problems


def _data_parallel_ranks(cfg: ReasoningConfig, ws: dict[str, int] | None) -> int | None:
    """Actor ranks that split the batch rows (``None``: unknown, or a Megatron layout that does not fit)."""
    if ws is None:
        return None
    try:
        return actor_data_parallel_size(cfg.actor, ws["actor"])
    except ValueError:  # reported by training_backend_problems
        return None


def check_config(cfg: ReasoningConfig, world_sizes: dict[str, int] | None = None) -> None:
    """Checks that span sections (paths, algorithm vs model, batch sizes vs ranks, placement, training backend).

    Raises:
        ConfigError: listing every problem with its dotted path.
        ImportError: ``actor.training_backend: megatron`` without megatron-core (names the extra).
    """
    problems = _check_paths(cfg) + _check_algorithm(cfg)
    try:
        ws = world_sizes or placement_world_sizes(cfg)
    except ValueError as e:
        raise ConfigError([str(e), *problems], "cluster.component_placement") from None
    samples = cfg.data.rollout_batch_size * cfg.algorithm.group_size
    gbs, mbs = cfg.actor.global_batch_size, cfg.actor.micro_batch_size
    if samples % gbs:
        problems.append(
            f"data.rollout_batch_size x algorithm.group_size ({cfg.data.rollout_batch_size} x "
            f"{cfg.algorithm.group_size} = {samples}) must be a multiple of actor.global_batch_size ({gbs})"
        )
    problems += training_backend_problems(
        cfg.actor, loss_type=cfg.algorithm.loss_type, world_size=None if ws is None else ws["actor"]
    )
    dp = _data_parallel_ranks(cfg, ws)
    what = "actor ranks" if cfg.actor.training_backend == "fsdp" else "data-parallel actor ranks"
    if dp is not None and gbs % (mbs * dp):
        problems.append(
            f"actor.global_batch_size ({gbs}) must be a multiple of actor.micro_batch_size ({mbs}) x {what} ({dp})"
        )
    if cfg.sft.steps > 0 and dp is not None:
        # FSDP splits an SFT batch over its ranks; Megatron over its data-parallel replicas, in micro-batches.
        fsdp = cfg.actor.training_backend == "fsdp"
        unit = dp if fsdp else mbs * dp
        if cfg.sft.batch_size % unit:
            of = f"the actor ranks ({dp})" if fsdp else f"actor.micro_batch_size ({mbs}) x {what} ({dp})"
            problems.append(f"sft.batch_size ({cfg.sft.batch_size}) must be a multiple of {of}")
    if problems:
        raise ConfigError(problems, "the reasoning config")
    check_training_backend(cfg.actor)


def load_reasoning_config(path: str | Path | None, overrides: Sequence[str] = ()) -> ReasoningConfig:
    """Load a YAML file plus overrides into a checked :class:`ReasoningConfig` (no Ray started)."""
    cfg = load_config(ReasoningConfig, path, overrides)
    check_config(cfg)
    return cfg


def load_datasets(cfg: ReasoningConfig) -> dict[str, PromptDataset | None]:
    """Read the train / eval / SFT files of ``cfg.data`` (``None`` for the unset ones)."""
    d = cfg.data
    keys = {
        "prompt_key": d.prompt_key,
        "messages_key": d.messages_key,
        "answer_key": d.answer_key,
        "solution_key": d.solution_key,
    }
    return {
        "train": load_prompt_dataset(resolve_data_path(d.train_path), **keys),
        "eval": load_prompt_dataset(resolve_data_path(d.eval_path), **keys) if d.eval_path else None,
        "sft": load_prompt_dataset(resolve_data_path(d.sft_path), require_solution=True, **keys)
        if d.sft_path
        else None,
    }


def _rollout_worker_class() -> type[Worker]:
    from rlinf_rollout.llm import LLMRolloutWorker

    cls: type[Worker] = LLMRolloutWorker
    return cls


def launch_groups(
    cfg: ReasoningConfig,
    cluster: Cluster,
    *,
    actor_cls: type[Worker] | None = None,
    rollout_cls: type[Worker] | None = None,
    reward_cls: type[Worker] = RewardWorker,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """Place and launch the actor, rollout and reward groups; wait until they are ready.

    Returns:
        ``{"actor": group, "rollout": group, "reward": group}``.
    """
    placement = ModelParallelComponentPlacement(cfg.cluster, cluster)
    ws = {c: placement.get_world_size(c) for c in COMPONENTS}
    check_config(cfg, ws)
    actor = (
        (actor_cls or actor_worker_class(cfg.actor))
        .create_group(
            cfg.actor, cfg.algorithm, total_steps=cfg.runner.total_steps, **actor_worker_kwargs(cfg.actor)
        )
        .launch(cluster, placement.get_strategy("actor"), name="actor")
    )
    rollout = (
        (rollout_cls or _rollout_worker_class())
        .create_group(cfg.rollout, cfg.actor.model)
        .launch(cluster, placement.get_strategy("rollout"), name="rollout")
    )
    reward = reward_cls.create_group(cfg.reward).launch(
        cluster, placement.get_strategy("reward"), name="reward"
    )
    for group in (actor, rollout, reward):
        group.wait_ready(timeout=timeout_s)
    return {"actor": actor, "rollout": rollout, "reward": reward}


def _to_torch(batch: Mapping[str, Any]) -> dict[str, Any]:
    import torch

    return {k: torch.from_numpy(v) for k, v in batch.items()}


def build_runner(
    cfg: ReasoningConfig,
    groups: Mapping[str, Any],
    *,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> ReasoningRunner:
    """The runner of ``cfg`` over launched groups (loads the tokenizer and the datasets on the driver)."""
    from rlinf_models.llm import load_tokenizer

    datasets = load_datasets(cfg)
    actor_world_size = int(groups["actor"].world_size)
    encoder = ChatPromptEncoder(
        load_tokenizer(cfg.actor.model),
        system_prompt=cfg.data.system_prompt,
        use_chat_template=cfg.data.use_chat_template,
    )
    sampling = unstructure_config(cfg.rollout.sampling)
    assert datasets["train"] is not None
    return ReasoningRunner(
        cfg.runner,
        actor=groups["actor"],
        rollout=groups["rollout"],
        reward=groups["reward"],
        algorithm=cfg.algorithm,
        data=cfg.data,
        encoder=encoder,
        train_data=datasets["train"],
        eval_data=datasets["eval"],
        sampling=sampling,
        eval_sampling={**sampling, "temperature": 0.0},
        sft=cfg.sft,
        sft_data=datasets["sft"],
        to_batch=_to_torch,
        offload=cfg.actor.enable_offload or cfg.rollout.enable_offload,
        batch_multiple=cfg.actor.micro_batch_size * actor_data_parallel_size(cfg.actor, actor_world_size),
        refresh_reference=cfg.algorithm.kl_beta > 0 or cfg.algorithm.reinpp_kl_beta > 0,
        run_config=unstructure_config(cfg),
        on_step=on_step,
    )


def run_reasoning(
    cfg: ReasoningConfig,
    *,
    cluster: Cluster | None = None,
    actor_cls: type[Worker] | None = None,
    rollout_cls: type[Worker] | None = None,
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
        groups = launch_groups(cfg, cluster, actor_cls=actor_cls, rollout_cls=rollout_cls)
        runner = build_runner(cfg, groups, on_step=on_step)
        if evaluate_only is not None:
            return runner.evaluate_checkpoint(evaluate_only)
        return runner.run()
    finally:
        if own:
            cluster.shutdown()
        elif cluster.failure is None:
            for group in groups.values():
                group.shutdown()
