"""What the reasoning and agent apps share: data paths, placement, checks, group launch and runner inputs.

Both run an LLM actor, an LLM rollout (plain or multi-turn) and a reward group, placed through
``ModelParallelComponentPlacement``: actor and rollout on the same slots (collocated, taking turns and
offloading between phases when ``enable_offload`` asks for it) or on disjoint ones (disaggregated).
"""

from __future__ import annotations

import abc
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from rlinf_core.config import AlgorithmConfig, ConfigError, unstructure_config
from rlinf_core.data import ChatPromptEncoder, DataConfig, PromptDataset, load_prompt_dataset
from rlinf_core.rewards import RewardConfig, RewardWorker
from rlinf_models.llm import (
    LLMActorConfig,
    actor_data_parallel_size,
    actor_worker_class,
    actor_worker_kwargs,
    check_training_backend,
    model_path_problems,
    training_backend_problems,
)
from rlinf_rollout.llm import LLMRolloutConfig
from rlinf_scheduler import (
    Cluster,
    ClusterConfig,
    ClusterView,
    FlexiblePlacementStrategy,
    ModelParallelComponentPlacement,
    PlacementStrategy,
    StaticClusterView,
    Worker,
)

from .._config import RunnerConfig
from .._llm import SFTConfig
from ._app import App, WorkerClasses

__all__ = ["LLMApp"]


class _LLMRootConfig(Protocol):
    @property
    def cluster(self) -> ClusterConfig: ...
    @property
    def runner(self) -> RunnerConfig: ...
    @property
    def algorithm(self) -> AlgorithmConfig: ...
    @property
    def actor(self) -> LLMActorConfig: ...
    @property
    def rollout(self) -> LLMRolloutConfig: ...
    @property
    def reward(self) -> RewardConfig: ...
    @property
    def data(self) -> DataConfig: ...
    @property
    def sft(self) -> SFTConfig: ...


L = TypeVar("L", bound=_LLMRootConfig)

_DATA_KEYS = ("train_path", "eval_path", "sft_path")


class LLMApp(App[L], abc.ABC):
    """The shared part of the reasoning and agent apps (actor, rollout and reward groups)."""

    components = ("actor", "rollout", "reward")
    launch_timeout_s: ClassVar[float] = 600.0
    """How long the launch waits for the groups to load their models."""
    sft_requires_solution: ClassVar[bool] = True
    """Whether the rows of ``data.sft_path`` must carry a worked solution."""
    pipelines: ClassVar[bool] = False
    """Whether the app's runner has a pipelined mode (``runner.pipeline``)."""

    # ----------------------------------------------------------------------------------- paths and data
    def load_datasets(self, cfg: L) -> dict[str, PromptDataset | None]:
        """Read the train / eval / SFT files of ``cfg.data`` (``None`` for the unset ones)."""
        d = cfg.data

        def load(path: str | None, *, require_solution: bool = False) -> PromptDataset | None:
            if not path:
                return None
            return load_prompt_dataset(
                self.resolve_data_path(path),
                prompt_key=d.prompt_key,
                messages_key=d.messages_key,
                answer_key=d.answer_key,
                solution_key=d.solution_key,
                image_key=d.image_key,
                require_solution=require_solution,
            )

        return {
            "train": load(d.train_path),
            "eval": load(d.eval_path),
            "sft": load(d.sft_path, require_solution=self.sft_requires_solution),
        }

    # ------------------------------------------------------------------------------------------- checks
    def world_sizes(self, cfg: L, cluster: Cluster | None = None) -> dict[str, int] | None:
        """Processes per component: from ``cluster``, or on paper for simulated slots (else ``None``).

        Raises:
            ValueError: for an invalid placement, one that leaves out actor, rollout or reward, or actor and
                rollout that neither share their slots nor use disjoint ones.
        """
        self.placed_components(cfg)
        view: ClusterView | None = cluster
        if view is None and cfg.cluster.simulated_accelerators_per_node > 0:
            view = StaticClusterView(
                num_nodes=cfg.cluster.num_nodes, accelerators=cfg.cluster.simulated_accelerators_per_node
            )
        if view is None:
            return None
        placement = ModelParallelComponentPlacement(cfg.cluster, view)
        sizes = {c: placement.get_world_size(c) for c in self.components}
        if cfg.runner.dynamic_scaling and not _scaling_problems(cfg, placement):
            sizes["actor"] += len(placement.get_hardware_ranks("rollout"))  # the elastic ranks
        return sizes

    @abc.abstractmethod
    def section_problems(self, cfg: L) -> list[str]:
        """The app's own cross-section problems (those that do not depend on the placement)."""

    def _data_problems(self, cfg: L) -> list[str]:
        data, problems = cfg.data, []
        if not data.train_path:
            problems.append(
                f"data.train_path is required (a JSONL / Parquet file; see {self._prepare_hint()})"
            )
        for key in _DATA_KEYS:
            value = getattr(data, key)
            if value and not self.resolve_data_path(value).is_file():
                problems.append(
                    f"data.{key}: {value!r} does not exist, as given or under {self.app_dir} "
                    f"(generate it with {self._prepare_hint()})"
                )
        if cfg.sft.steps > 0 and not data.sft_path:
            problems.append(
                f"sft.steps is {cfg.sft.steps} but data.sft_path is not set (the warm-up needs demonstrations)"
            )
        if cfg.runner.val_check_interval > 0 and not data.eval_path:
            problems.append("runner.val_check_interval > 0 needs data.eval_path (or set it to -1)")
        return problems

    def _prepare_hint(self) -> str:
        return f"`uv run apps/{self.name}/prepare_data.py`"

    def _batch_problems(self, cfg: L, ws: Mapping[str, int] | None) -> list[str]:
        problems = training_backend_problems(
            cfg.actor, loss_type=cfg.algorithm.loss_type, world_size=None if ws is None else ws["actor"]
        )
        dp = _data_parallel_ranks(cfg.actor, ws)
        if dp is None:
            return problems
        gbs, mbs = cfg.actor.global_batch_size, cfg.actor.micro_batch_size
        fsdp = cfg.actor.training_backend == "fsdp"
        what = "actor ranks" if fsdp else "data-parallel actor ranks"
        if gbs % (mbs * dp):
            problems.append(
                f"actor.global_batch_size ({gbs}) must be a multiple of actor.micro_batch_size ({mbs}) x {what} ({dp})"
            )
        if cfg.sft.steps > 0:
            # FSDP splits an SFT batch over its ranks; Megatron over its data-parallel replicas, in micro-batches.
            unit = dp if fsdp else mbs * dp
            if cfg.sft.batch_size % unit:
                of = f"the actor ranks ({dp})" if fsdp else f"actor.micro_batch_size ({mbs}) x {what} ({dp})"
                problems.append(f"sft.batch_size ({cfg.sft.batch_size}) must be a multiple of {of}")
        return problems

    def check(self, cfg: L, world_sizes: Mapping[str, int] | None = None) -> None:
        """Checks that span sections (data files, the app's own, batch sizes vs ranks, placement, backend).

        Raises:
            ConfigError: listing every problem with its dotted path.
            ImportError: ``actor.training_backend: megatron`` without megatron-core (names the extra).
        """
        problems = (
            model_path_problems(cfg.actor.model)
            + self._data_problems(cfg)
            + self.section_problems(cfg)
            + _vision_language_problems(cfg)
        )
        try:
            ws = world_sizes or self.world_sizes(cfg)
        except ValueError as e:
            raise ConfigError([str(e), *problems], "cluster.component_placement") from None
        if cfg.runner.dynamic_scaling and cfg.cluster.simulated_accelerators_per_node > 0:
            view = StaticClusterView(
                num_nodes=cfg.cluster.num_nodes, accelerators=cfg.cluster.simulated_accelerators_per_node
            )
            problems += _scaling_problems(cfg, ModelParallelComponentPlacement(cfg.cluster, view))
        problems += self._batch_problems(cfg, ws)
        if cfg.runner.pipeline and not self.pipelines:
            problems.append(
                f"runner.pipeline: the {self.name} runner runs generation and training in sequence "
                "(multi-turn episodes); set it to null or false"
            )
        if problems:
            raise ConfigError(problems, f"the {self.name} config")
        check_training_backend(cfg.actor)

    def check_evaluation(self, cfg: L) -> None:
        """An evaluation needs the held-out prompts of ``data.eval_path``.

        Raises:
            ConfigError: when ``data.eval_path`` is not set.
        """
        if not cfg.data.eval_path:
            raise ConfigError(
                ["data.eval_path is not set: nothing to evaluate on"], f"the {self.name} config"
            )

    # ----------------------------------------------------------------------------------- launch and run
    @abc.abstractmethod
    def rollout_group(self, cfg: L) -> tuple[type[Worker], tuple[Any, ...], dict[str, Any]]:
        """The rollout worker class and its ``create_group`` arguments."""

    def preload(self, cfg: L) -> None:
        """Import the actor worker class and the rollout engines' package (torch, transformers)."""
        import rlinf_rollout.llm  # noqa: F401

        actor_worker_class(cfg.actor)

    def launch(
        self, cfg: L, cluster: Cluster, *, worker_classes: WorkerClasses | None = None
    ) -> dict[str, Any]:
        """Place and launch the actor, rollout and reward groups; wait until they are ready.

        Returns:
            ``{"actor": group, "rollout": group, "reward": group}``.
        """
        classes = dict(worker_classes or {})
        placement = ModelParallelComponentPlacement(cfg.cluster, cluster)
        actor_strategy = placement.get_strategy("actor")
        if cfg.runner.dynamic_scaling:
            problems = _scaling_problems(cfg, placement)
            if problems:
                raise ConfigError(problems, f"the {self.name} config")
            actor_strategy = _grown_actor_strategy(placement)
        self.check(cfg, self.world_sizes(cfg, cluster))
        actor = (
            (classes.get("actor") or actor_worker_class(cfg.actor))
            .create_group(
                cfg.actor, cfg.algorithm, total_steps=cfg.runner.total_steps, **actor_worker_kwargs(cfg.actor)
            )
            .launch(cluster, actor_strategy, name="actor")
        )
        rollout_cls, args, kwargs = self.rollout_group(cfg)
        rollout = (
            classes.get("rollout", rollout_cls)
            .create_group(*args, **kwargs)
            .launch(cluster, placement.get_strategy("rollout"), name="rollout")
        )
        reward = (
            classes.get("reward", RewardWorker)
            .create_group(cfg.reward)
            .launch(cluster, placement.get_strategy("reward"), name="reward")
        )
        for group in (actor, rollout, reward):
            group.wait_ready(timeout=self.launch_timeout_s)
        return {"actor": actor, "rollout": rollout, "reward": reward}

    def system_prompt(self, cfg: L) -> str | None:
        """The system message of every prompt (``data.system_prompt``)."""
        return cfg.data.system_prompt

    def runner_inputs(self, cfg: L, cluster: Cluster, groups: Mapping[str, Any]) -> dict[str, Any]:
        """The keyword arguments the reasoning and agent runners share (loads the tokenizer and the data)."""
        import torch

        datasets = self.load_datasets(cfg)
        train = datasets["train"]
        if train is None:  # excluded by check(): data.train_path is required
            raise ConfigError(["data.train_path is required"], f"the {self.name} config")
        encoder = _prompt_encoder(cfg, self.system_prompt(cfg))
        sampling: dict[str, Any] = unstructure_config(cfg.rollout.sampling)
        placement = ModelParallelComponentPlacement(cfg.cluster, cluster)
        collocated = placement.is_collocated
        actor_ranks = int(groups["actor"].world_size)
        # Dynamic scaling: the ranks past the actor's own devices are the elastic ones (on the rollout's devices).
        own = len(placement.get_hardware_ranks("actor"))
        elastic = list(range(own, actor_ranks)) if cfg.runner.dynamic_scaling else []

        def to_batch(batch: Mapping[str, Any]) -> dict[str, Any]:
            return {k: torch.from_numpy(v) for k, v in batch.items()}

        return {
            "actor": groups["actor"],
            "rollout": groups["rollout"],
            "reward": groups["reward"],
            "algorithm": cfg.algorithm,
            "data": cfg.data,
            "encoder": encoder,
            "train_data": train,
            "eval_data": datasets["eval"],
            "sampling": sampling,
            "eval_sampling": {**sampling, "temperature": 0.0},
            "sft": cfg.sft,
            "sft_data": datasets["sft"],
            "to_batch": to_batch,
            # Offloading frees the devices for the other component; with disjoint slots there is none.
            "offload": collocated and (cfg.actor.enable_offload or cfg.rollout.enable_offload),
            "batch_multiple": cfg.actor.micro_batch_size * actor_data_parallel_size(cfg.actor, actor_ranks),
            "elastic_actor_ranks": elastic,
            # Evaluations go one full engine batch per rollout rank at a time (the progress bar's unit).
            "eval_chunk": cfg.rollout.max_batch_size * int(groups["rollout"].world_size),
            "run_config": unstructure_config(cfg),
        }


def _prompt_encoder(cfg: _LLMRootConfig, system_prompt: str | None) -> ChatPromptEncoder:
    """The driver's prompt encoder: with the image processor for a vision-language model (Qwen2.5-VL)."""
    from rlinf_models.llm import load_tokenizer
    from rlinf_models.llm._vlm import VLMPromptEncoder, is_vision_language, load_image_processor

    model, tokenizer = cfg.actor.model, load_tokenizer(cfg.actor.model)
    if is_vision_language(model.model_path):
        return VLMPromptEncoder(
            tokenizer,
            load_image_processor(model),
            system_prompt=system_prompt,
            use_chat_template=cfg.data.use_chat_template,
        )
    return ChatPromptEncoder(
        tokenizer, system_prompt=system_prompt, use_chat_template=cfg.data.use_chat_template
    )


def _vision_language_problems(cfg: _LLMRootConfig) -> list[str]:
    """What a vision-language ``actor.model`` (a checkpoint with a ``vision_config``) cannot run with."""
    path = Path(cfg.actor.model.model_path).expanduser() / "config.json"
    if not path.is_file() or "vision_config" not in json.loads(path.read_text(encoding="utf-8")):
        return []
    where = f"actor.model.model_path {cfg.actor.model.model_path!r} is a vision-language model"
    problems = []
    if cfg.actor.training_backend != "fsdp":
        problems.append(f"{where}: it trains with actor.training_backend: fsdp only")
    if cfg.rollout.engine != "hf":
        problems.append(
            f"{where}: only rollout.engine: hf generates from images here (got {cfg.rollout.engine!r})"
        )
    if cfg.actor.use_remove_padding:
        problems.append(f"{where}: actor.use_remove_padding is not supported for it (set it to false)")
    if not (Path(cfg.actor.model.model_path).expanduser() / "preprocessor_config.json").is_file():
        problems.append(f"{where} without preprocessor_config.json (its image processor)")
    return problems


def _data_parallel_ranks(actor: LLMActorConfig, ws: Mapping[str, int] | None) -> int | None:
    """Actor ranks that split the batch rows (``None``: unknown, or a Megatron layout that does not fit)."""
    if ws is None:
        return None
    try:
        return actor_data_parallel_size(actor, ws["actor"])
    except ValueError:  # reported by training_backend_problems
        return None


def _scaling_problems(cfg: _LLMRootConfig, placement: ModelParallelComponentPlacement) -> list[str]:
    """Why ``runner.dynamic_scaling`` cannot grow the actor onto the rollout's devices (empty: it can)."""
    if not cfg.runner.dynamic_scaling:
        return []
    problems: list[str] = []
    if not placement.is_disaggregated:
        problems.append(
            "runner.dynamic_scaling grows the actor onto the rollout's devices, which needs a disaggregated "
            f"placement (actor and rollout on disjoint devices); this placement is {placement.placement_mode.value}"
        )
    if placement.has_dedicated_inference:
        problems.append(
            "runner.dynamic_scaling: a run with a separate actor_inference component is not supported"
        )
    if placement.get_node_group("actor") != placement.get_node_group("rollout"):
        problems.append(
            "runner.dynamic_scaling: actor and rollout must be placed in the same node group(s), got "
            f"{list(placement.get_node_group('actor'))} and {list(placement.get_node_group('rollout'))}"
        )
    if placement.get_placements("actor")[0].accelerator_type not in ("cpu", ""):
        # On real devices the elastic ranks must park their state in host memory while the rollout generates,
        # and the rollout must be able to release its memory (vLLM / SGLang sleep mode).
        if cfg.actor.training_backend == "fsdp" and not cfg.actor.enable_offload:
            problems.append(
                "runner.dynamic_scaling on accelerators needs actor.enable_offload: true (the elastic FSDP2 ranks "
                "keep their shards and optimizer state in host memory between uses)"
            )
        if not cfg.rollout.enable_offload:
            problems.append(
                "runner.dynamic_scaling on accelerators needs rollout.enable_offload: true (the rollout releases "
                "its devices to the actor after generating)"
            )
    return problems


def _grown_actor_strategy(placement: ModelParallelComponentPlacement) -> PlacementStrategy:
    """The actor's processes on its own devices, then one elastic process per rollout device (rank order)."""
    devices = placement.get_hardware_ranks("actor") + placement.get_hardware_ranks("rollout")
    return FlexiblePlacementStrategy([[d] for d in devices], node_group=placement.get_node_group("actor"))
