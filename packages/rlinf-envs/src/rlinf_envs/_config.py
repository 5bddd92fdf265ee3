"""``env:`` — the training and evaluation environments (key names follow RLinf's ``env.train`` / ``env.eval``)."""

from __future__ import annotations

from typing import Any, Literal

import attrs
from attrs import validators as v

__all__ = ["ENV_TYPES", "EnvConfig", "VecEnvConfig", "VideoConfig"]

ENV_TYPES = ("gymnasium", "maniskill", "libero", "metaworld", "realworld")
"""Backends ``make_vec_env`` knows (simulators, and ``realworld``: robot arms reached over TCP)."""


def _positive_or_none(_inst: object, attr: attrs.Attribute[int | None], value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"'{attr.name}' must be >= 1 or null: {value}")


def _task_ids(
    _inst: object, attr: attrs.Attribute[tuple[int, ...] | None], value: tuple[int, ...] | None
) -> None:
    if value is None:
        return
    if not value:
        raise ValueError(f"'{attr.name}' must list at least one task id, or be null (all tasks)")
    if any(i < 0 for i in value) or len(set(value)) != len(value):
        raise ValueError(f"'{attr.name}' must be distinct task ids >= 0: {list(value)}")


def _init_state_range(
    _inst: object, attr: attrs.Attribute[tuple[int, int] | None], value: tuple[int, int] | None
) -> None:
    if value is not None and not 0 <= value[0] < value[1]:
        raise ValueError(
            f"'{attr.name}' must be [start, stop) with 0 <= start < stop, or null: {list(value)}"
        )


def _image_size(
    _inst: object, attr: attrs.Attribute[tuple[int, int] | None], value: tuple[int, int] | None
) -> None:
    if value is not None and (len(value) != 2 or min(value) < 1):
        raise ValueError(f"'{attr.name}' must be [height, width] (positive) or null, got {list(value)}")


@attrs.frozen(kw_only=True)
class VideoConfig:
    """MP4 videos of evaluation episodes (config ``env.eval.video_cfg``, RLinf's key)."""

    save_video: bool = False
    """Record the first ``num_envs`` envs of each env rank during every evaluation."""
    video_base_dir: str | None = None
    """Where the videos go (``null``: ``<runner.logger.log_path>/eval/global_step_<N>/videos``)."""
    num_envs: int = attrs.field(default=2, validator=v.ge(1))
    """Envs recorded per env rank (one episode each: the first of the evaluation)."""
    fps: int = attrs.field(default=10, validator=v.ge(1))
    """Frames per second of the files (one frame per env step)."""
    source: Literal["obs", "render"] = "obs"
    """``obs``: the observation's ``rgb`` image (camera modes; the newest frame of a stack); ``render``: the
    backend's ``render()`` (any mode: ManiSkill's render camera, LIBERO's agent view)."""


@attrs.frozen(kw_only=True)
class VecEnvConfig:
    """One set of vectorised environments (config ``env.train`` or ``env.eval``)."""

    env_type: Literal["gymnasium", "maniskill", "libero", "metaworld", "realworld"] = "gymnasium"
    """Simulator backend: ``gymnasium`` (any registered id, MuJoCo with the extra), ``maniskill``, ``libero``,
    ``metaworld``, or ``realworld`` (robot arms reached over TCP; ``env_kwargs.is_dummy`` starts dummy robots)."""
    env_id: str = "CartPole-v1"
    """Task id, e.g. ``CartPole-v1``, ``HalfCheetah-v5``, ``PushCube-v1``; for LIBERO the task suite, e.g.
    ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``, ``libero_90``, ``libero_130``;
    Meta-World: ``MT1/<task>`` (e.g. ``MT1/reach-v3``), ``ML1/<task>`` (goal hidden), ``MT10``, ``MT25``, ``MT50``;
    realworld: ``FrankaPegInsertion-v1``."""
    total_num_envs: int = attrs.field(default=8, validator=v.ge(1))
    """Environments over all env ranks and pipeline stages."""
    group_size: int = attrs.field(default=1, validator=v.ge(1))
    """Consecutive envs sharing initial states (GRPO groups)."""
    max_episode_steps: int | None = attrs.field(default=None, validator=_positive_or_none)
    """Episode time limit (``null``: the task's registered one; LIBERO: the suite's, e.g. 220 for
    ``libero_spatial``, 520 for ``libero_10``)."""
    max_steps_per_rollout_epoch: int = attrs.field(default=32, validator=v.ge(1))
    """Env steps per env in one rollout epoch (train) or at most in one evaluation (eval); a multiple of
    ``actor.model.num_action_chunks``."""
    auto_reset: bool = True
    """Reset an env as soon as its episode ends (training); evaluation uses ``false`` (one episode per env)."""
    seed: int = 0
    """Base seed: env ``i`` of the whole set resets with ``seed + i // group_size``."""
    env_kwargs: dict[str, Any] = attrs.field(factory=dict)
    """Extra keyword arguments for the simulator's ``make`` (LIBERO: for its ``ControlEnv``; Meta-World: for the
    task class; realworld: the robots' settings, ``is_dummy``, ``safety_limits``, ``action_scale``, ... see
    docs/realworld.md)."""
    obs_mode: str = "state"
    """What the envs observe: ``state`` (one float32 vector) or a camera mode giving a dict of images and robot
    vectors (ManiSkill: ``rgb``, ``depth``, ``rgbd``, each optionally ``+state`` for the privileged state beside
    them; LIBERO: ``rgb``, the third-person and wrist cameras and the proprioception; Meta-World: ``rgb``, a
    camera image and the hand position; realworld: ``rgb``, a camera image and the 19-D robot state; the backends
    list theirs)."""
    image_size: tuple[int, int] | None = attrs.field(default=None, validator=_image_size)
    """Camera modes: ``[height, width]`` of the rendered images (``null``: the backend's default; LIBERO 128x128)."""
    frame_stack: int = attrs.field(default=1, validator=v.ge(1))
    """Observe the last ``k`` frames: images stacked along channels ``[H, W, C*k]``, vectors concatenated."""
    video_cfg: VideoConfig = attrs.field(factory=VideoConfig)
    """Videos of evaluation episodes (read from ``env.eval``)."""
    # ManiSkill options (ignored by gymnasium).
    sim_backend: str = "physx_cpu"
    """ManiSkill: ``physx_cpu`` (CPU, one scene per env) or ``physx_cuda``/``gpu``."""
    control_mode: str | None = None
    """ManiSkill: robot controller (``null``: the task's default)."""
    reward_mode: Literal["normalized_dense", "dense", "sparse"] = "normalized_dense"
    """ManiSkill and Meta-World reward (Meta-World: ``dense`` in [0, 10], ``normalized_dense`` = dense / 10,
    ``sparse`` = 1 on success)."""
    ignore_terminations: bool = False
    """ManiSkill, LIBERO, Meta-World, realworld: episodes end only at the time limit (success does not end them)."""
    vector_mode: Literal["sync", "async"] = "sync"
    """ManiSkill CPU, LIBERO, Meta-World: ``sync`` (in the env worker) or ``async`` (one process per env)."""
    # LIBERO options (ignored by the other backends).
    task_ids: tuple[int, ...] | None = attrs.field(default=None, validator=_task_ids)
    """LIBERO: the suite's tasks this env set resets to, by index in the suite (``null``: all of them)."""
    init_state_range: tuple[int, int] | None = attrs.field(default=None, validator=_init_state_range)
    """LIBERO: ``[start, stop)`` of each task's fixed initial states this env set resets to (``null``: all 50);
    e.g. ``[0, 40]`` for training and ``[40, 50]`` for evaluation holds ten states per task out."""
    init_state_sampling: Literal["random", "sequential"] = "random"
    """LIBERO: how a reset picks its (task, initial state) pair from the group's seed: ``random`` (drawn; later
    episodes of an env drawn from the same generator) or ``sequential`` (pair ``seed mod pairs``, cycling through
    the tasks first, so consecutive groups cover every pair once; later episodes repeat the pair)."""
    settle_steps: int = attrs.field(default=10, validator=v.ge(0))
    """LIBERO: zero-action steps after each reset, not counted in the episode, so that the objects come to rest."""
    # Meta-World options.
    camera_name: str | None = None
    """Meta-World camera of ``obs_mode: rgb``: ``topview``, ``corner``, ``corner2``, ``corner3``, ``corner4``,
    ``behindGripper`` or ``gripperPOV`` (``null``: ``corner4``, the view RLinf's Meta-World env renders)."""
    task_description: str | None = None
    """The language instruction of a single-task env (``EnvSpec.task_descriptions``, what a VLA policy is
    prompted with), e.g. ``"pick up the red cube"``; ``null``: the env id. LIBERO suites bring their own
    instructions and refuse it."""

    def __attrs_post_init__(self) -> None:
        if self.total_num_envs % self.group_size:
            raise ValueError(
                f"total_num_envs ({self.total_num_envs}) must be a multiple of group_size ({self.group_size})"
            )


@attrs.frozen(kw_only=True)
class EnvConfig:
    """The env component (config ``env``): training and evaluation environment sets."""

    train: VecEnvConfig = attrs.field(factory=VecEnvConfig)
    eval: VecEnvConfig = attrs.field(
        factory=lambda: VecEnvConfig(auto_reset=False, max_steps_per_rollout_epoch=500, seed=10_000)
    )
    torch_num_threads: int = attrs.field(default=1, validator=v.ge(1))
    """torch threads in each env worker process (the simulators here are single-threaded)."""
