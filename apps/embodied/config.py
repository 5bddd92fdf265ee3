"""The embodied app's configuration (``EmbodiedConfig``) and the launch of its worker groups.

``EmbodiedConfig`` composes the configs each package owns: ``cluster`` (rlinf_scheduler), ``runner``
(rlinf_core), ``algorithm`` (rlinf_core), ``actor`` (rlinf_models), ``rollout`` (rlinf_rollout) and ``env``
(rlinf_envs). :func:`check_config` adds the checks that span several sections; it runs before Ray starts.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
from rlinf_core.config import AlgorithmConfig, ConfigError, load_config, unstructure_config
from rlinf_envs import EnvConfig, EnvWorker, VecEnvConfig
from rlinf_models import EmbodiedActorConfig
from rlinf_rollout import EmbodiedRolloutConfig, EmbodiedRolloutWorker
from rlinf_runners import EmbodiedRunner, RunnerConfig, RunResult
from rlinf_scheduler import Cluster, ClusterConfig, HybridComponentPlacement, Worker, resolve_placement

__all__ = [
    "COMPONENTS",
    "CONFIG_DIR",
    "EmbodiedConfig",
    "check_config",
    "launch_groups",
    "load_embodied_config",
    "placement_world_sizes",
    "run_embodied",
]

CONFIG_DIR = Path(__file__).resolve().parent / "config"
COMPONENTS = ("actor", "rollout", "env")


@attrs.frozen(kw_only=True)
class EmbodiedConfig:
    """The whole embodied run."""

    cluster: ClusterConfig = attrs.field(
        factory=lambda: ClusterConfig(
            component_placement={"actor,env,rollout": "0"}, simulated_accelerators_per_node=1
        )
    )
    runner: RunnerConfig = attrs.field(factory=RunnerConfig)
    algorithm: AlgorithmConfig = attrs.field(factory=AlgorithmConfig)
    actor: EmbodiedActorConfig = attrs.field(factory=EmbodiedActorConfig)
    rollout: EmbodiedRolloutConfig = attrs.field(factory=EmbodiedRolloutConfig)
    env: EnvConfig = attrs.field(factory=EnvConfig)


def placement_world_sizes(cfg: EmbodiedConfig, cluster: Cluster | None = None) -> dict[str, int] | None:
    """Processes per component: from the cluster, or on paper when the slots are simulated (else ``None``).

    Raises:
        ValueError: for an invalid placement, or one that leaves out actor, rollout or env.
    """
    placed = {c.strip() for key in cfg.cluster.component_placement for c in key.split(",")}
    missing = [c for c in COMPONENTS if c not in placed]
    if missing:
        raise ValueError(
            f"cluster.component_placement: no placement for {missing}; it places {sorted(placed)} "
            f"(e.g. 'actor,env,rollout: 0' for collocated)"
        )
    if cluster is not None:
        placement = HybridComponentPlacement(cfg.cluster, cluster)
        return {c: placement.get_world_size(c) for c in COMPONENTS}
    if cfg.cluster.simulated_accelerators_per_node > 0:
        out = resolve_placement(
            cfg.cluster,
            num_nodes=cfg.cluster.num_nodes,
            accelerators_per_node=cfg.cluster.simulated_accelerators_per_node,
        )
        return {c: len(out[c]) for c in COMPONENTS}
    return None


def _check_split(name: str, split: VecEnvConfig, env_ws: int, stages: int, rollout_ws: int) -> list[str]:
    problems = []
    unit = env_ws * stages * split.group_size
    if split.total_num_envs % unit:
        problems.append(
            f"{name}.total_num_envs ({split.total_num_envs}) must be a multiple of env ranks ({env_ws}) x "
            f"rollout.pipeline_stage_num ({stages}) x {name}.group_size ({split.group_size}) = {unit}"
        )
    per_stage = split.total_num_envs // stages
    if split.total_num_envs % stages == 0 and per_stage % rollout_ws:
        problems.append(
            f"{name}.total_num_envs / rollout.pipeline_stage_num ({per_stage}) must be a multiple of the "
            f"rollout ranks ({rollout_ws})"
        )
    return problems


def check_config(cfg: EmbodiedConfig, world_sizes: dict[str, int] | None = None) -> None:
    """Checks that span sections (batch sizes vs collected samples, env splits, groups, chunks).

    Raises:
        ConfigError: listing every problem with its dotted path.
    """
    problems: list[str] = []
    try:
        ws = world_sizes or placement_world_sizes(cfg)
    except ValueError as e:
        raise ConfigError([str(e)], "cluster.component_placement") from None
    chunks = cfg.actor.model.num_action_chunks
    stages = cfg.rollout.pipeline_stage_num
    for name, split in (("env.train", cfg.env.train), ("env.eval", cfg.env.eval)):
        if split.max_steps_per_rollout_epoch % chunks:
            problems.append(
                f"{name}.max_steps_per_rollout_epoch ({split.max_steps_per_rollout_epoch}) must be a multiple "
                f"of actor.model.num_action_chunks ({chunks})"
            )
    if cfg.algorithm.group_size != cfg.env.train.group_size:
        problems.append(
            f"algorithm.group_size ({cfg.algorithm.group_size}) must equal env.train.group_size "
            f"({cfg.env.train.group_size}): advantages are normalised over the env groups"
        )
    if cfg.algorithm.adv_type == "gae" and not cfg.actor.model.add_value_head:
        problems.append("actor.model.add_value_head must be true for algorithm.adv_type 'gae'")
    train = cfg.env.train
    samples = (
        train.total_num_envs * (train.max_steps_per_rollout_epoch // chunks) * cfg.algorithm.rollout_epoch
    )
    if samples < cfg.actor.global_batch_size:
        problems.append(
            f"actor.global_batch_size ({cfg.actor.global_batch_size}) exceeds the samples one step collects: "
            f"env.train.total_num_envs x max_steps_per_rollout_epoch / num_action_chunks x rollout_epoch = {samples}"
        )
    if ws is not None:
        problems += _check_split("env.train", cfg.env.train, ws["env"], stages, ws["rollout"])
        problems += _check_split("env.eval", cfg.env.eval, ws["env"], stages, ws["rollout"])
        envs = train.total_num_envs * cfg.algorithm.rollout_epoch
        unit = ws["actor"] * train.group_size
        if train.total_num_envs % (ws["actor"] * train.group_size):
            problems.append(
                f"env.train.total_num_envs ({train.total_num_envs}) must be a multiple of actor ranks "
                f"({ws['actor']}) x group_size ({train.group_size}) = {unit}, so each actor rank gets whole groups"
            )
        elif samples // ws["actor"] < cfg.actor.global_batch_size // ws["actor"] or envs % ws["actor"]:
            problems.append(
                f"actor.global_batch_size / actor ranks exceeds each rank's share of the {samples} samples"
            )
        if cfg.actor.global_batch_size % (cfg.actor.micro_batch_size * ws["actor"]):
            problems.append(
                f"actor.global_batch_size ({cfg.actor.global_batch_size}) must be a multiple of "
                f"actor.micro_batch_size ({cfg.actor.micro_batch_size}) x actor ranks ({ws['actor']})"
            )
    if problems:
        raise ConfigError(problems, "the embodied config")


def load_embodied_config(path: str | Path | None, overrides: Sequence[str] = ()) -> EmbodiedConfig:
    """Load a YAML file plus overrides into a checked :class:`EmbodiedConfig` (no Ray started)."""
    cfg = load_config(EmbodiedConfig, path, overrides)
    check_config(cfg)
    return cfg


def _actor_worker_class() -> type[Worker]:
    from rlinf_models import EmbodiedActorWorker  # type: ignore[attr-defined]

    cls: type[Worker] = EmbodiedActorWorker
    return cls


def launch_groups(
    cfg: EmbodiedConfig,
    cluster: Cluster,
    *,
    actor_cls: type[Worker] | None = None,
    rollout_cls: type[Worker] = EmbodiedRolloutWorker,
    env_cls: type[Worker] = EnvWorker,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """Launch the env group (to learn the env spec), then the actor and rollout groups.

    Returns:
        ``{"actor": group, "rollout": group, "env": group}``.
    """
    placement = HybridComponentPlacement(cfg.cluster, cluster)
    ws = {c: placement.get_world_size(c) for c in COMPONENTS}
    check_config(cfg, ws)
    stages = cfg.rollout.pipeline_stage_num
    env = env_cls.create_group(
        cfg.env,
        cfg.algorithm,
        stages,
        num_action_chunks=cfg.actor.model.num_action_chunks,
        rollout_world_size=ws["rollout"],
    ).launch(cluster, placement.get_strategy("env"), name="env")
    spec = env.get_spec().wait(timeout=timeout_s)[0]
    actor = (
        (actor_cls or _actor_worker_class())
        .create_group(cfg.actor, cfg.algorithm, spec, total_steps=cfg.runner.total_steps)
        .launch(cluster, placement.get_strategy("actor"), name="actor")
    )
    rollout = rollout_cls.create_group(
        cfg.rollout,
        cfg.actor.model,
        spec,
        env_world_size=ws["env"],
        train_num_envs=cfg.env.train.total_num_envs,
        eval_num_envs=cfg.env.eval.total_num_envs,
    ).launch(cluster, placement.get_strategy("rollout"), name="rollout")
    actor.wait_ready(timeout=timeout_s)
    rollout.wait_ready(timeout=timeout_s)
    return {"actor": actor, "rollout": rollout, "env": env}


def run_embodied(
    cfg: EmbodiedConfig,
    *,
    cluster: Cluster | None = None,
    actor_cls: type[Worker] | None = None,
    rollout_cls: type[Worker] = EmbodiedRolloutWorker,
    env_cls: type[Worker] = EnvWorker,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    evaluate_only: str | None = None,
) -> RunResult | dict[str, float]:
    """Start (or use) a cluster, launch the groups and train; or evaluate the checkpoint ``evaluate_only``.

    ``actor_cls``/``rollout_cls``/``env_cls`` replace the worker classes (tests and benchmarks use subclasses).

    The cluster is shut down at the end when this function created it.
    """
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    if (
        "maniskill" in (cfg.env.train.env_type, cfg.env.eval.env_type)
        and "VK_ICD_FILENAMES" not in os.environ
    ):
        # ManiSkill needs a Vulkan driver; use the one scripts/install_vulkan_cpu.sh unpacked, if any (the env
        # workers inherit the driver's environment, so this must happen before the cluster starts).
        from rlinf_envs.maniskill import find_installed_icd

        icd = find_installed_icd()
        if icd is not None:
            os.environ["VK_ICD_FILENAMES"] = str(icd)
    own = cluster is None
    cluster = cluster or Cluster(cfg.cluster)
    groups: dict[str, Any] = {}
    try:
        groups = launch_groups(cfg, cluster, actor_cls=actor_cls, rollout_cls=rollout_cls, env_cls=env_cls)
        runner = EmbodiedRunner(
            cfg.runner,
            rollout_epoch=cfg.algorithm.rollout_epoch,
            run_config=unstructure_config(cfg),
            on_step=on_step,
            **groups,
        )
        if evaluate_only is not None:
            return runner.evaluate_checkpoint(evaluate_only)
        return runner.run()
    finally:
        if own:
            cluster.shutdown()
        elif cluster.failure is None:
            for group in groups.values():
                group.shutdown()
