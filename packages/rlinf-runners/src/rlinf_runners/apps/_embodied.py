"""The embodied app: ``EmbodiedConfig`` and the launch of its actor, rollout and env groups.

``EmbodiedConfig`` composes the configs each package owns: ``cluster`` (rlinf_scheduler), ``runner``
(rlinf_runners), ``algorithm`` (rlinf_core), ``actor`` (rlinf_models), ``rollout`` (rlinf_rollout) and ``env``
(rlinf_envs). :meth:`EmbodiedApp.check` adds the checks that span sections; it runs before Ray starts.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from typing import Any

import attrs
from rlinf_core.checkpoint import resolve_resume_dir
from rlinf_core.config import AlgorithmConfig, ConfigError, unstructure_config
from rlinf_envs import (
    EnvConfig,
    VecEnvConfig,
    describe_tasks,
    env_config_problems,
    env_spec_without_worker,
    prepare_process_env,
)
from rlinf_models import EmbodiedActorConfig
from rlinf_models.embodied import EMBODIED_ADV_TYPES, MASKED_ADV_TYPES
from rlinf_models.policies import (
    VLA_MODEL_TYPES,
    PolicyConfig,
    checkpoint_weights_file,
    vla_checkpoint_directory,
)
from rlinf_rollout import EmbodiedRolloutConfig
from rlinf_scheduler import Cluster, ClusterConfig, HybridComponentPlacement, Worker, resolve_placement

from .._async_embodied import AsyncEmbodiedRunner
from .._config import EmbodiedRunnerConfig
from .._embodied import EmbodiedRunner
from ._app import App, AppRunner, OnStep, WorkerClasses
from ._offpolicy import build_offpolicy_runner, offpolicy_problems

__all__ = ["EmbodiedApp", "EmbodiedConfig"]


@attrs.frozen(kw_only=True)
class EmbodiedConfig:
    """The whole embodied run (``apps/embodied/config/*.yaml``)."""

    cluster: ClusterConfig = attrs.field(
        factory=lambda: ClusterConfig(
            component_placement={"actor,env,rollout": "0"}, simulated_accelerators_per_node=1
        )
    )
    runner: EmbodiedRunnerConfig = attrs.field(factory=EmbodiedRunnerConfig)
    algorithm: AlgorithmConfig = attrs.field(factory=AlgorithmConfig)
    actor: EmbodiedActorConfig = attrs.field(factory=EmbodiedActorConfig)
    rollout: EmbodiedRolloutConfig = attrs.field(factory=EmbodiedRolloutConfig)
    env: EnvConfig = attrs.field(factory=EnvConfig)


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


def _flow_problems(cfg: EmbodiedConfig) -> list[str]:
    """``model_type: flow`` needs continuous actions; checked when the driver knows the spec cheaply."""
    spec = env_spec_without_worker(cfg.env.train)
    if spec is None or spec.action_type == "continuous":
        return []
    return [
        f"actor.model.model_type 'flow' needs continuous actions; env.train.env_id {cfg.env.train.env_id!r} has "
        f"{spec.action_type} ones: choose model_type 'mlp'"
    ]


def _env_split_problems(cfg: EmbodiedConfig, ws: Mapping[str, int] | None) -> list[str]:
    if ws is None:
        return []
    stages = cfg.rollout.pipeline_stage_num
    problems = _check_split("env.train", cfg.env.train, ws["env"], stages, ws["rollout"])
    return problems + _check_split("env.eval", cfg.env.eval, ws["env"], stages, ws["rollout"])


def _check_ranks(cfg: EmbodiedConfig, ws: Mapping[str, int], samples: int) -> list[str]:
    train = cfg.env.train
    problems = _env_split_problems(cfg, ws)
    envs = train.total_num_envs * cfg.algorithm.rollout_epoch
    unit = ws["actor"] * train.group_size
    if train.total_num_envs % unit:
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
    return problems


def _runner_problems(cfg: EmbodiedConfig) -> list[str]:
    """Runner switches the embodied runners do not implement."""
    problems = []
    if cfg.runner.dynamic_scaling:
        problems.append(
            "runner.dynamic_scaling: only the reasoning and agent apps grow the actor onto the rollout's "
            "devices; set it to false"
        )
    if cfg.runner.pipeline or cfg.runner.pipeline_chunk_prompts is not None:
        problems.append(
            "runner.pipeline / runner.pipeline_chunk_prompts belong to the reasoning app; the embodied app "
            "pipelines env and rollout with rollout.pipeline_stage_num and overlaps training with "
            "runner.mode: async"
        )
    return problems


def _realworld_problems(cfg: EmbodiedConfig) -> list[str]:
    """A ``realworld`` env drives one robot per env: the env workers sit on the robots' node group.

    The env processes must each hold ``total_num_envs / env ranks`` hardware units of a node group with
    ``hardware`` (RLinf's real-world placement: ``env: {node_group: franka, placement: 0}``), unless every env
    gets a dummy robot (``env_kwargs.is_dummy: true`` and no robot node group).
    """
    splits = [
        (n, s)
        for n, s in (("env.train", cfg.env.train), ("env.eval", cfg.env.eval))
        if s.env_type == "realworld"
    ]
    if not splits:
        return []
    try:
        env = resolve_placement(
            cfg.cluster,
            num_nodes=cfg.cluster.num_nodes,
            accelerators_per_node=cfg.cluster.simulated_accelerators_per_node,
        )["env"]
    except (KeyError, ValueError):
        return []  # the placement check reports it
    robots = sum(len(p.hardware_configs) for p in env)
    problems: list[str] = []
    if robots == 0:
        for name, split in splits:
            if not split.env_kwargs.get("is_dummy"):
                problems.append(
                    f"{name}.env_type 'realworld' drives robots, but cluster.component_placement puts env on no "
                    "node group with hardware: place it on the robots' node group (env: {node_group: <label>, "
                    f"placement: ...}} with cluster.node_groups[].hardware), or set {name}.env_kwargs.is_dummy: true"
                )
        return problems
    for name, split in splits:
        share = split.total_num_envs // len(env)
        held = [len(p.hardware_configs) for p in env]
        if split.total_num_envs != robots or any(h != share for h in held):
            problems.append(
                f"{name}.total_num_envs ({split.total_num_envs}) must give each env rank one env per robot it "
                f"drives: the env ranks hold {held} robot(s) ({'; '.join(p.hardware for p in env)})"
            )
    return problems


class EmbodiedApp(App[EmbodiedConfig]):
    """Embodied RL: a policy in simulators through actor, rollout and env worker groups."""

    name = "embodied"
    config_cls = EmbodiedConfig
    default_config = "cartpole_ppo"
    components = ("actor", "rollout", "env")
    curve_keys = ("eval/return_mean", "env/return_mean")
    checkpoint_keys = (
        "actor.model",
        "algorithm.loss_type",
        "env.train.env_type",
        "env.train.env_id",
        "env.train.control_mode",
    )
    checkpoint_ignored_keys = ("actor.model.model_path",)

    def world_sizes(self, cfg: EmbodiedConfig, cluster: Cluster | None = None) -> dict[str, int] | None:
        """Processes per component: from ``cluster``, or on paper for simulated slots (else ``None``).

        Raises:
            ValueError: for an invalid placement, or one that leaves out actor, rollout or env.
        """
        self.placed_components(cfg)
        if cluster is not None:
            placement = HybridComponentPlacement(cfg.cluster, cluster)
            return {c: placement.get_world_size(c) for c in self.components}
        if cfg.cluster.simulated_accelerators_per_node > 0:
            out = resolve_placement(
                cfg.cluster,
                num_nodes=cfg.cluster.num_nodes,
                accelerators_per_node=cfg.cluster.simulated_accelerators_per_node,
            )
            return {c: len(out[c]) for c in self.components}
        return None

    def check(self, cfg: EmbodiedConfig, world_sizes: Mapping[str, int] | None = None) -> None:
        """Checks that span sections (batch sizes vs collected samples, env splits, groups, chunks).

        The env types and ids are checked by their owner, ``rlinf_envs.env_config_problems``, in the same pass.

        Raises:
            ConfigError: listing every problem with its dotted path.
        """
        problems = env_config_problems(cfg.env) + self._model_path_problems(cfg) + _realworld_problems(cfg)
        problems += _runner_problems(cfg)
        if not problems and cfg.actor.model.model_type == "flow":
            problems += _flow_problems(cfg)
        try:
            ws = world_sizes or self.world_sizes(cfg)
        except ValueError as e:
            raise ConfigError([str(e)], "cluster.component_placement") from None
        chunks = cfg.actor.model.num_action_chunks
        for name, split in (("env.train", cfg.env.train), ("env.eval", cfg.env.eval)):
            if split.max_steps_per_rollout_epoch % chunks:
                problems.append(
                    f"{name}.max_steps_per_rollout_epoch ({split.max_steps_per_rollout_epoch}) must be a "
                    f"multiple of actor.model.num_action_chunks ({chunks})"
                )
        if cfg.algorithm.group_size != cfg.env.train.group_size:
            problems.append(
                f"algorithm.group_size ({cfg.algorithm.group_size}) must equal env.train.group_size "
                f"({cfg.env.train.group_size}): advantages are normalised over the env groups"
            )
        if cfg.algorithm.is_offpolicy or cfg.actor.model.add_q_head:
            problems += offpolicy_problems(cfg, ws, resolve_path=self.resolve_data_path)
            problems += _env_split_problems(cfg, ws)
            if problems:
                raise ConfigError(problems, "the embodied config")
            return
        adv_type = cfg.algorithm.adv_type.lower()
        if adv_type not in EMBODIED_ADV_TYPES:
            problems.append(
                f"algorithm.adv_type {cfg.algorithm.adv_type!r} is not computed by the embodied trainer; "
                f"allowed: {', '.join(EMBODIED_ADV_TYPES)}"
            )
        elif adv_type in MASKED_ADV_TYPES and cfg.env.train.auto_reset:
            problems.append(
                f"algorithm.adv_type {cfg.algorithm.adv_type!r} scores whole episodes and needs their masks: "
                "set env.train.auto_reset: false (one episode per env per rollout)"
            )
        if cfg.runner.mode == "async" and cfg.algorithm.loss_type != "decoupled_actor_critic":
            problems.append(
                f"runner.mode 'async' trains with the decoupled PPO loss: set algorithm.loss_type to "
                f"'decoupled_actor_critic' (got {cfg.algorithm.loss_type!r})"
            )
        if cfg.algorithm.adv_type == "gae" and not cfg.actor.model.add_value_head:
            problems.append("actor.model.add_value_head must be true for algorithm.adv_type 'gae'")
        train = cfg.env.train
        samples = (
            train.total_num_envs * (train.max_steps_per_rollout_epoch // chunks) * cfg.algorithm.rollout_epoch
        )
        if samples < cfg.actor.global_batch_size:
            problems.append(
                f"actor.global_batch_size ({cfg.actor.global_batch_size}) exceeds the samples one step "
                "collects: env.train.total_num_envs x max_steps_per_rollout_epoch / num_action_chunks x "
                f"rollout_epoch = {samples}"
            )
        if ws is not None:
            problems += _check_ranks(cfg, ws, samples)
        if problems:
            raise ConfigError(problems, "the embodied config")

    def _model_path_problems(self, cfg: EmbodiedConfig) -> list[str]:
        model_path = cfg.actor.model.model_path
        if model_path is None:
            return []
        if cfg.actor.model.is_vla:
            return self._vla_path_problems(cfg.actor.model)
        weights = checkpoint_weights_file(self.resolve_data_path(model_path))
        if weights.is_file():
            return []
        return [
            f"actor.model.model_path: no policy weights at {weights} (give a global_step_<N> checkpoint "
            "directory, as train.py and sft.py write them, or its actor/model.pt)"
        ]

    def _vla_path_problems(self, model: PolicyConfig) -> list[str]:
        """A VLA (``pi0`` / ``pi05`` / ``smolvla``): its checkpoint directory, tokenizer and statistics exist.

        ``model_path`` may be an SFT ``global_step_<N>`` checkpoint: its ``pretrained/`` export is checked.
        """
        assert model.model_path is not None
        given = self.resolve_data_path(model.model_path)
        try:
            directory = vla_checkpoint_directory(given)
        except FileNotFoundError as e:
            if checkpoint_weights_file(given).is_file():
                return [str(e)]  # a runner's checkpoint without the export
            directory = given  # the adapter's check below names what the directory lacks
        model = attrs.evolve(model, model_path=str(directory))
        if model.model_type in ("openvla", "openvla_oft"):
            return self._openvla_path_problems(model)
        if model.model_type == "gr00t":
            return self._gr00t_path_problems(model)
        problems: list[str] = []
        assert model.model_path is not None and model.tokenizer_path is not None
        directory = self.resolve_data_path(model.model_path)
        config_file = directory / "config.json"
        missing = [f for f in ("config.json", "model.safetensors") if not (directory / f).is_file()]
        if missing:
            problems.append(
                f"actor.model.model_path: {directory} is not a LeRobot {model.model_type} checkpoint directory (missing {', '.join(missing)}; "
                "LeRobot's layout: scripts/make_tiny_pi0.py or make_tiny_smolvla.py writes a tiny one)"
            )
        else:
            kind = json.loads(config_file.read_text()).get("type")
            if kind != model.model_type:
                problems.append(
                    f"actor.model.model_type {model.model_type!r} does not match {config_file}'s type {kind!r}; "
                    f"allowed: {', '.join(VLA_MODEL_TYPES)}"
                )
        tokenizer = self.resolve_data_path(model.tokenizer_path)
        if not tokenizer.is_dir():
            problems.append(f"actor.model.tokenizer_path: no tokenizer directory at {tokenizer}")
        if model.norm_stats_path is not None and not self.resolve_data_path(model.norm_stats_path).is_file():
            problems.append(f"actor.model.norm_stats_path: no statistics file at {model.norm_stats_path}")
        return problems

    def _gr00t_path_problems(self, model: PolicyConfig) -> list[str]:
        """GR00T N1.5: the checkpoint directory (the published layout), Eagle's tokenizer, the statistics file."""
        assert model.model_path is not None and model.tokenizer_path is not None
        directory = self.resolve_data_path(model.model_path)
        config_file = directory / "config.json"
        weights = [
            f for f in ("model.safetensors.index.json", "model.safetensors") if (directory / f).is_file()
        ]
        problems: list[str] = []
        if not config_file.is_file() or not weights:
            problems.append(
                f"actor.model.model_path: {directory} is not a GR00T N1.5 checkpoint directory (config.json and "
                "model.safetensors or its shards' index; scripts/make_tiny_gr00t.py writes a tiny one)"
            )
        elif (kind := json.loads(config_file.read_text()).get("model_type")) != "gr00t_n1_5":
            problems.append(
                f"actor.model.model_type 'gr00t' does not match {config_file}'s model_type {kind!r} "
                "(a GR00T N1.5 checkpoint has 'gr00t_n1_5')"
            )
        if not self.resolve_data_path(model.tokenizer_path).is_dir():
            problems.append(f"actor.model.tokenizer_path: no tokenizer directory at {model.tokenizer_path}")
        stats = model.norm_stats_path or str(directory / "experiment_cfg" / "metadata.json")
        if not self.resolve_data_path(stats).is_file():
            problems.append(
                f"actor.model.norm_stats_path: no statistics file at {stats} (null: the checkpoint's "
                "experiment_cfg/metadata.json)"
            )
        return problems

    def _openvla_path_problems(self, model: PolicyConfig) -> list[str]:
        """OpenVLA: the checkpoint directory (the published layout), its tokenizer and the ``unnorm_key``."""
        assert model.model_path is not None
        directory = self.resolve_data_path(model.model_path)
        config_file = directory / "config.json"
        weights = [
            f for f in ("model.safetensors.index.json", "model.safetensors") if (directory / f).is_file()
        ]
        problems: list[str] = []
        if not config_file.is_file() or not weights:
            problems.append(
                f"actor.model.model_path: {directory} is not an OpenVLA checkpoint directory (needs config.json and "
                "model.safetensors.index.json or model.safetensors; scripts/make_tiny_openvla.py writes a tiny one)"
            )
        else:
            config = json.loads(config_file.read_text())
            if config.get("model_type") != "openvla":  # OpenVLA-OFT checkpoints keep OpenVLA's config.json
                problems.append(
                    f"actor.model.model_type {model.model_type!r} does not match {config_file}'s model_type "
                    f"{config.get('model_type')!r}; allowed: {', '.join(VLA_MODEL_TYPES)}"
                )
            stats = dict(config.get("norm_stats") or {})
            if (directory / "dataset_statistics.json").is_file():  # fine-tunes keep theirs beside config.json
                stats |= json.loads((directory / "dataset_statistics.json").read_text())
            if model.unnorm_key is None and len(stats) != 1:
                problems.append(
                    f"actor.model.unnorm_key: the checkpoint has statistics of {sorted(stats)}: set one of them"
                )
            elif model.unnorm_key is not None and model.unnorm_key not in stats:
                problems.append(
                    f"actor.model.unnorm_key {model.unnorm_key!r} is not in the checkpoint's norm_stats; "
                    f"allowed: {', '.join(sorted(stats))}"
                )
        tokenizer = self.resolve_data_path(model.tokenizer_path or model.model_path)
        if not (tokenizer / "tokenizer_config.json").is_file():
            problems.append(
                f"actor.model.tokenizer_path: no tokenizer (tokenizer_config.json) in {tokenizer} (null: model_path)"
            )
        return problems

    def prepare_process_env(self, cfg: EmbodiedConfig) -> None:
        """The simulators' process environment (e.g. ManiSkill's Vulkan driver), before the cluster starts."""
        prepare_process_env(cfg.env)

    def preload(self, cfg: EmbodiedConfig) -> None:
        """Import the env, actor and rollout worker classes (torch, the simulator's package)."""
        actor = "offpolicy_actor" if cfg.algorithm.is_offpolicy else "actor"
        for component in ("env", actor, "rollout"):
            _worker_class(component)

    def launch(
        self, cfg: EmbodiedConfig, cluster: Cluster, *, worker_classes: WorkerClasses | None = None
    ) -> dict[str, Any]:
        """Launch the env, actor and rollout groups; all three at once when the env spec is cheap to know.

        The actor and rollout constructors need the env spec. For gymnasium envs the driver computes it
        (:func:`rlinf_envs.env_spec_without_worker`) and the three groups start together, so their processes
        import and build concurrently; the env workers' own spec is checked against it once they are up. For
        other simulators the env group starts first and reports the spec.

        Returns:
            ``{"actor": group, "rollout": group, "env": group}``.

        Raises:
            RuntimeError: if the env workers report another spec than the one the driver computed.
        """
        classes = dict(worker_classes or {})
        timeout_s = 300.0
        placement = HybridComponentPlacement(cfg.cluster, cluster)
        ws = {c: placement.get_world_size(c) for c in self.components}
        self.check(cfg, ws)
        cfg = attrs.evolve(cfg, actor=self._actor_config(cfg))
        stages = cfg.rollout.pipeline_stage_num
        driver_spec = env_spec_without_worker(cfg.env.train)
        if driver_spec is not None:
            driver_spec = describe_tasks(driver_spec, cfg.env.train)
        env = (
            (classes.get("env") or _worker_class("env"))
            .create_group(
                cfg.env,
                cfg.algorithm,
                stages,
                num_action_chunks=cfg.actor.model.num_action_chunks,
                rollout_world_size=ws["rollout"],
                collect_transitions=cfg.algorithm.is_offpolicy,
            )
            .launch(cluster, placement.get_strategy("env"), name="env")
        )
        spec = driver_spec or env.get_spec().wait(timeout=timeout_s)[0]
        offpolicy = cfg.algorithm.is_offpolicy  # OffPolicyActorWorker has no learning-rate schedule
        actor = (
            (classes.get("actor") or _worker_class("offpolicy_actor" if offpolicy else "actor"))
            .create_group(
                cfg.actor,
                self._actor_algorithm(cfg),
                spec,
                **({} if offpolicy else {"total_steps": cfg.runner.total_steps}),
            )
            .launch(cluster, placement.get_strategy("actor"), name="actor")
        )
        rollout = (
            (classes.get("rollout") or _worker_class("rollout"))
            .create_group(
                cfg.rollout,
                cfg.actor.model,
                spec,
                env_world_size=ws["env"],
                train_num_envs=cfg.env.train.total_num_envs,
                eval_num_envs=cfg.env.eval.total_num_envs,
                **({"expert": cfg.actor.expert} if cfg.algorithm.loss_type == "embodied_dagger" else {}),
            )
            .launch(cluster, placement.get_strategy("rollout"), name="rollout")
        )
        if driver_spec is not None:
            reported = env.get_spec().wait(timeout=timeout_s)[0]
            if reported != driver_spec:
                raise RuntimeError(
                    f"env.train: the env workers report {reported}, the driver computed {driver_spec} "
                    f"({cfg.env.train.env_type} {cfg.env.train.env_id!r})"
                )
        actor.wait_ready(timeout=timeout_s)
        rollout.wait_ready(timeout=timeout_s)
        return {"actor": actor, "rollout": rollout, "env": env}

    def _actor_config(self, cfg: EmbodiedConfig) -> EmbodiedActorConfig:
        """``cfg.actor`` with its paths resolved like the data paths (absolute, for the workers).

        ``actor.model.model_path`` is dropped when the run resumes: the checkpoint's weights take precedence.
        """
        actor = cfg.actor
        model_path = actor.model.model_path
        if actor.model.is_vla:  # the checkpoint directory defines the architecture: kept on resume too
            actor = attrs.evolve(actor, model=self._vla_paths(actor.model))
        elif model_path is not None:
            if resolve_resume_dir(cfg.runner.resume_dir, cfg.runner.logger.log_path) is not None:
                warnings.warn(
                    f"actor.model.model_path {model_path} is not loaded: the run resumes from its checkpoint "
                    "(runner.resume_dir), whose weights take precedence",
                    UserWarning,
                    stacklevel=2,
                )
                model_path = None
            else:
                model_path = str(self.resolve_data_path(model_path).resolve())
            actor = attrs.evolve(actor, model=attrs.evolve(actor.model, model_path=model_path))
        expert = actor.expert
        if expert is None or not expert.checkpoint:  # HG-DAgger's real human runs no expert policy
            return actor
        path = str(self.resolve_data_path(expert.checkpoint).resolve())
        return attrs.evolve(actor, expert=attrs.evolve(expert, checkpoint=path))

    def _vla_paths(self, model: PolicyConfig) -> PolicyConfig:
        """``model`` with its π0 files resolved like the data paths (absolute, for the workers)."""

        def absolute(path: str | None) -> str | None:
            return None if path is None else str(self.resolve_data_path(path).resolve())

        return attrs.evolve(
            model,
            model_path=absolute(model.model_path),
            tokenizer_path=absolute(model.tokenizer_path),
            norm_stats_path=absolute(model.norm_stats_path),
        )

    def _actor_algorithm(self, cfg: EmbodiedConfig) -> AlgorithmConfig:
        """``cfg.algorithm`` with the demo buffer's path resolved like the data paths (absolute, for the actor)."""
        demo = cfg.algorithm.demo_buffer
        if demo is None:
            return cfg.algorithm
        path = str(self.resolve_data_path(demo.load_path).resolve())
        return attrs.evolve(cfg.algorithm, demo_buffer=attrs.evolve(demo, load_path=path))

    def build_runner(
        self,
        cfg: EmbodiedConfig,
        cluster: Cluster,
        groups: Mapping[str, Any],
        *,
        on_step: OnStep | None = None,
    ) -> AppRunner:
        """The runner of ``cfg`` over launched groups.

        ``EmbodiedRunner``; ``AsyncEmbodiedRunner`` for ``runner.mode: async``; off-policy: ``OffPolicyRunner``, or
        ``AsyncOffPolicyRunner`` for ``runner.mode: async``.
        """
        common: dict[str, Any] = {
            "actor": groups["actor"],
            "rollout": groups["rollout"],
            "env": groups["env"],
            "rollout_epoch": cfg.algorithm.rollout_epoch,
            "run_config": unstructure_config(cfg),
            "on_step": on_step,
            "eval_task_name": cfg.env.eval.env_id,
            "video_dir": cfg.env.eval.video_cfg.video_base_dir,
        }
        if cfg.algorithm.is_offpolicy:
            return build_offpolicy_runner(cfg, common)
        if cfg.runner.mode == "async":
            return AsyncEmbodiedRunner(
                cfg.runner, staleness_threshold=cfg.algorithm.staleness_threshold, **common
            )
        return EmbodiedRunner(cfg.runner, **common)


def _worker_class(component: str) -> type[Worker]:
    # The worker modules import torch (and the simulators); the driver loads them only when it launches, so
    # that reading and checking a config stays cheap.
    cls: type[Worker]
    if component == "actor":
        from rlinf_models import EmbodiedActorWorker

        cls = EmbodiedActorWorker
    elif component == "offpolicy_actor":
        from rlinf_models.offpolicy import OffPolicyActorWorker

        cls = OffPolicyActorWorker
    elif component == "rollout":
        from rlinf_rollout import EmbodiedRolloutWorker

        cls = EmbodiedRolloutWorker
    else:
        from rlinf_envs import EnvWorker

        cls = EnvWorker
    return cls
