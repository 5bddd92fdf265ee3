"""Supervised fine-tuning of an embodied policy on LeRobot datasets: the command behind ``apps/embodied/sft.py``.

``uv run apps/embodied/sft.py [--config-name NAME | --config PATH] [--print-config] key=value ...``

The config is an embodied config (``actor.model`` is the policy, ``actor.optim`` its optimizer,
``actor.global_batch_size`` the batch size, ``runner.max_steps`` / ``max_epochs`` the optimizer steps,
``runner.logger.log_path`` the run directory, ``env.train`` the env whose observation and action layout the
policy gets) plus a ``data`` section: ``data.train_data_paths`` (LeRobot dataset directories), the held-out
share of their episodes and an optional evaluation in ``env.eval`` after training (the embodied app's own
evaluation, with the final weights as ``actor.model.model_path``).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np
from attrs import validators as v
from rlinf_core.config import (
    AlgorithmConfig,
    ConfigError,
    load_config,
    parse_command_line,
    unstructure_config,
)
from rlinf_core.data import DatasetError
from rlinf_core.data.lerobot import LeRobotReader
from rlinf_core.protocols import EnvSpec
from rlinf_envs import EnvConfig, describe_tasks, env_spec_without_worker, make_vec_env, prepare_process_env
from rlinf_models import EmbodiedActorConfig
from rlinf_rollout import EmbodiedRolloutConfig
from rlinf_scheduler import ClusterConfig

from .._base import RunResult
from .._config import EmbodiedRunnerConfig
from ._embodied import EmbodiedApp, EmbodiedConfig
from ._lerobot import ACTION, action_feature, observation_features

if TYPE_CHECKING:
    from .._sft import SFTSamples

__all__ = ["EmbodiedSFTConfig", "SFTDataConfig", "load_sft_samples", "main", "run_sft"]


@attrs.frozen(kw_only=True)
class SFTDataConfig:
    """The demonstrations (config ``data``)."""

    train_data_paths: tuple[str, ...] = ()
    """LeRobot dataset directories (v3.0; relative paths are also looked up under the app directory)."""
    val_ratio: float = attrs.field(default=0.1, validator=[v.ge(0.0), v.lt(1.0)])
    """Share of each dataset's episodes held out for ``eval/val_loss`` (at least one when > 0 and the dataset
    has two or more episodes)."""
    seed: int = 0
    """Seed of the held-out episode choice and of the batch order."""
    eval_env: bool = False
    """After training, evaluate the final weights in ``env.eval`` (launches the embodied app's worker groups)."""


@attrs.frozen(kw_only=True)
class EmbodiedSFTConfig:
    """The whole SFT run: the embodied sections plus ``data``."""

    cluster: ClusterConfig = attrs.field(factory=lambda: EmbodiedConfig().cluster)
    runner: EmbodiedRunnerConfig = attrs.field(factory=EmbodiedRunnerConfig)
    algorithm: AlgorithmConfig = attrs.field(factory=AlgorithmConfig)
    actor: EmbodiedActorConfig = attrs.field(factory=EmbodiedActorConfig)
    rollout: EmbodiedRolloutConfig = attrs.field(factory=EmbodiedRolloutConfig)
    env: EnvConfig = attrs.field(factory=EnvConfig)
    data: SFTDataConfig = attrs.field(factory=SFTDataConfig)


def evaluation_config(cfg: EmbodiedSFTConfig, checkpoint: Path, actor_world_size: int = 1) -> EmbodiedConfig:
    """The embodied config that evaluates ``checkpoint`` in ``env.eval`` (batch sizes neutral: nothing trains)."""
    model = attrs.evolve(cfg.actor.model, model_path=str(checkpoint))
    actor = attrs.evolve(cfg.actor, model=model, global_batch_size=actor_world_size, micro_batch_size=1)
    return EmbodiedConfig(
        cluster=cfg.cluster,
        runner=attrs.evolve(cfg.runner, resume_dir=None),
        algorithm=cfg.algorithm,
        actor=actor,
        rollout=cfg.rollout,
        env=cfg.env,
    )


def _check(app: EmbodiedApp, cfg: EmbodiedSFTConfig) -> None:
    problems = []
    if not cfg.data.train_data_paths:
        problems.append("data.train_data_paths: give at least one LeRobot dataset directory")
    for path in cfg.data.train_data_paths:
        if not (app.resolve_data_path(path) / "meta" / "info.json").is_file():
            problems.append(
                f"data.train_data_paths: {path} is not a LeRobot dataset (no meta/info.json); record one with "
                "apps/embodied/collect.py"
            )
    if cfg.actor.model.is_vla and cfg.actor.model.model_path is not None:
        # The checkpoint directory (or an SFT global_step_<N> with its pretrained/ export), tokenizer, statistics.
        problems += app._vla_path_problems(cfg.actor.model)
    if cfg.actor.model.add_q_head:
        problems.append(
            "actor.model.add_q_head: SFT trains the actor-critic policies (imitation_loss); set false"
        )
    if problems:
        raise ConfigError(problems, "the SFT config")
    if cfg.data.eval_env:
        probe = evaluation_config(cfg, Path("unused"))
        app.check(attrs.evolve(probe, actor=attrs.evolve(probe.actor, model=cfg.actor.model)))


def env_spec(env: EnvConfig) -> EnvSpec:
    """The spec of ``env.train`` (computed, or read from one env made in this process), with its task descriptions."""
    spec = env_spec_without_worker(env.train)
    if spec is not None:
        return describe_tasks(spec, env.train)
    prepare_process_env(env)
    vec = make_vec_env(attrs.evolve(env.train, vector_mode="sync"), 1)
    try:
        return describe_tasks(vec.spec, env.train)
    finally:
        vec.close()


def _split_episodes(
    episodes: np.ndarray, ratio: float, rng: np.random.Generator
) -> tuple[list[int], list[int]]:
    ids = [int(e) for e in np.unique(episodes)]
    held = 0 if ratio == 0 or len(ids) < 2 else max(1, round(ratio * len(ids)))
    chosen = set(rng.permutation(ids)[:held].tolist())
    return [e for e in ids if e not in chosen], sorted(chosen)


def load_sft_samples(
    paths: Sequence[Path],
    spec: EnvSpec,
    model_obs_keys: Sequence[str] | None,
    chunks: int,
    val_ratio: float,
    seed: int,
) -> tuple[SFTSamples | None, SFTSamples | None]:
    """The training and held-out :class:`~rlinf_runners.SFTSamples` of the datasets at ``paths``.

    Raises:
        DatasetError: naming the dataset and feature when a dataset does not fit the env's observation and
            action layout.
    """
    import torch

    from .._sft import SFTSamples

    obs_features = observation_features(spec, model_obs_keys)
    want = dict(obs_features.values()) | {ACTION: action_feature(spec)}
    rng = np.random.default_rng(seed)
    parts: dict[str, list[SFTSamples]] = {"train": [], "val": []}
    for path in paths:
        try:
            reader = LeRobotReader(path)
        except (OSError, ValueError) as e:
            raise DatasetError(f"data.train_data_paths: {e}") from e
        for name, feature in want.items():
            have = reader.features.get(name)
            if have is None or (have.dtype, have.shape) != (feature.dtype, feature.shape):
                got = "missing" if have is None else f"{have.dtype} {list(have.shape)}"
                raise DatasetError(
                    f"{path}: feature {name!r} is {got}; the env ({spec.action_type} actions) needs "
                    f"{feature.dtype} {list(feature.shape)}"
                )
        train_eps, val_eps = _split_episodes(reader.episode_index, val_ratio, rng)
        for split, episodes in (("train", train_eps), ("val", val_eps)):
            if not episodes:
                continue
            chunked = reader.action_chunks([n for n, _ in obs_features.values()], chunks, episodes=episodes)
            obs = {key: torch.from_numpy(chunked.obs[name]) for key, (name, _) in obs_features.items()}
            actions = torch.from_numpy(chunked.actions).reshape(len(chunked), chunks, -1).float()
            mask = torch.from_numpy(chunked.mask)
            parts[split].append(SFTSamples(obs.get(None, obs), actions, mask))
    return _concat(parts["train"]), _concat(parts["val"])


def _concat(parts: Sequence[SFTSamples]) -> SFTSamples | None:
    import torch

    from .._sft import SFTSamples

    if not parts:
        return None
    obs = [p.obs for p in parts]
    cat = (
        {k: torch.cat([o[k] for o in obs]) for k in obs[0]} if isinstance(obs[0], Mapping) else torch.cat(obs)
    )
    return SFTSamples(cat, torch.cat([p.actions for p in parts]), torch.cat([p.mask for p in parts]))


def run_sft(
    app: EmbodiedApp, cfg: EmbodiedSFTConfig, *, on_step: Any = None
) -> tuple[RunResult, dict[str, float]]:
    """Train, checkpoint, and (``data.eval_env``) evaluate the final weights in ``env.eval``.

    Returns:
        The run's result and the ``eval/*`` metrics of the env evaluation (empty without one).
    """
    import torch
    from rlinf_models.policies import build_policy, checkpoint_weights_file, load_policy_weights

    from .._sft import EmbodiedSFTRunner, SFTSamples
    from ._app import run_app

    spec = env_spec(cfg.env)
    chunks = cfg.actor.model.num_action_chunks
    paths = [app.resolve_data_path(p) for p in cfg.data.train_data_paths]
    train, val = load_sft_samples(
        paths, spec, cfg.actor.model.obs_keys, chunks, cfg.data.val_ratio, cfg.data.seed
    )
    if train is None:
        raise DatasetError(f"data.train_data_paths: no training episode in {[str(p) for p in paths]}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if cfg.actor.torch_num_threads is not None:
        torch.set_num_threads(cfg.actor.torch_num_threads)
    torch.manual_seed(cfg.actor.seed)
    policy = build_policy(spec, cfg.actor.model)
    # A VLA reads its model_path (a checkpoint directory, or an SFT checkpoint's pretrained/ export) itself.
    if cfg.actor.model.model_path is not None and not cfg.actor.model.is_vla:
        weights = checkpoint_weights_file(app.resolve_data_path(cfg.actor.model.model_path))
        loaded = load_policy_weights(policy, weights, field="actor.model.model_path", strict=False)
        print(f"actor.model.model_path: initialised the policy with {loaded.summary()}")
    policy.to(device)

    def to_device(s: SFTSamples | None) -> SFTSamples | None:
        if s is None:
            return None
        obs = {k: x.to(device) for k, x in s.obs.items()} if isinstance(s.obs, Mapping) else s.obs.to(device)
        return SFTSamples(obs, s.actions.to(device), s.mask.to(device))

    train_d = to_device(train)
    assert train_d is not None
    print(
        f"SFT on {len(train)} samples ({0 if val is None else len(val)} held out) from {len(paths)} dataset(s)"
    )
    runner = EmbodiedSFTRunner(
        cfg.runner,
        policy=policy,
        optim=cfg.actor.optim,
        train=train_d,
        val=to_device(val),
        batch_size=cfg.actor.global_batch_size,
        seed=cfg.data.seed,
        run_config=unstructure_config(cfg),
        on_step=on_step,
    )
    result = runner.run()
    metrics: dict[str, float] = {}
    if cfg.data.eval_env and result.last_checkpoint is not None:
        sizes = app.world_sizes(evaluation_config(cfg, result.last_checkpoint)) or {"actor": 1}
        eval_cfg = evaluation_config(cfg, result.last_checkpoint, sizes["actor"])
        metrics = run_app(app, eval_cfg, evaluate_only="none")
    return result, metrics


def main(argv: list[str], *, app_dir: Path) -> int:
    """Run SFT from the command line; 0 done, 2 bad config or data.

    Args:
        argv: the command line after the program name.
        app_dir: the embodied app directory (its ``config/`` and the base of relative data paths).
    """
    import json

    import yaml

    app = EmbodiedApp(app_dir)
    try:
        cli = parse_command_line(
            argv, config_dir=app.config_dir / "sft", default_name="cartpole_sft", prog="sft.py"
        )
        if isinstance(cli, str):
            print(cli)
            return 0
        cfg = load_config(EmbodiedSFTConfig, cli.config_path, cli.overrides)
        _check(app, cfg)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cli.print_config:
        print(yaml.safe_dump(unstructure_config(cfg), sort_keys=False))
        return 0
    try:
        result, metrics = run_sft(app, cfg)
    except (DatasetError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"\nfinished {result.global_step} SFT steps; last held-out evaluation: {result.last_eval}")
    print(f"metrics:     {result.metrics_file}")
    print(
        f"checkpoint:  {result.last_checkpoint}  (start RL from it: actor.model.model_path=<this directory>)"
    )
    if metrics:
        print(f"env evaluation: {json.dumps(metrics, indent=2)}")
    return 0
