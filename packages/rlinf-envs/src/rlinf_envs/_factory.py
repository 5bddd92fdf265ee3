"""``make_vec_env``: the one place that picks a simulator backend (each imported only when chosen)."""

from __future__ import annotations

from rlinf_core.protocols import VecEnv

from ._config import ENV_TYPES, VecEnvConfig

__all__ = ["make_vec_env"]


def make_vec_env(cfg: VecEnvConfig, num_envs: int | None = None) -> VecEnv:
    """Build the vectorised env ``cfg`` describes.

    Args:
        cfg: the ``env.train`` / ``env.eval`` settings.
        num_envs: environments in this instance (default: ``cfg.total_num_envs``; env workers pass their
            share per pipeline stage).

    Raises:
        ValueError: for an unknown ``env_type`` (listing the known ones) or invalid backend arguments.
        ImportError: when the backend's extra is not installed (naming it).
    """
    n = cfg.total_num_envs if num_envs is None else num_envs
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
            control_mode=cfg.control_mode,
            reward_mode=cfg.reward_mode,
            ignore_terminations=cfg.ignore_terminations,
            vector_mode=cfg.vector_mode,
            env_kwargs=cfg.env_kwargs,
        )
    raise ValueError(f"env_type {cfg.env_type!r} is not supported; choose one of {', '.join(ENV_TYPES)}")
