"""The vectorised environment protocol every simulator backend implements.

A vectorised env holds ``num_envs`` independent environments stepped together with ACTION CHUNKS: the
policy emits ``C`` actions per env and the env executes them in order (``chunk_step``). Environments come in
groups of ``group_size`` consecutive envs that share their initial state on ``reset`` (GRPO-style groups).

A vectorised env can hand out its whole state (``get_state``) and take it back (``set_state``): simulator
state, each env's random generator, the in-progress episodes and their running returns. A run resumed from a
checkpoint restores it, so the first rollout after the resume continues the episodes the interrupted run was
in, exactly as an uninterrupted run would.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import numpy as np

from ._obs import NpObs, ObsSpec

__all__ = ["ChunkStepResult", "EnvSpec", "EpisodeStats", "VecEnv"]


@dataclass(frozen=True)
class EnvSpec:
    """What a policy needs to know about an environment.

    Observations are one array per env (``obs_shape``, ``obs_dtype``) or, for tasks with cameras, a dict of
    named arrays (``obs_dict``: e.g. ``{"rgb": ObsSpec((128, 128, 3), "uint8"), "state": ObsSpec((29,))}``); see
    :mod:`rlinf_core.protocols._obs` for the conventions.

    Attributes:
        obs_shape: shape of one array observation, e.g. ``(4,)``; ``()`` for dict observations.
        action_type: ``"discrete"`` (one integer per step) or ``"continuous"`` (a float vector per step).
        num_actions: number of discrete actions (discrete only).
        action_dim: length of the action vector (1 for discrete).
        action_low: lower bounds, shape ``[action_dim]`` (continuous only).
        action_high: upper bounds, shape ``[action_dim]`` (continuous only).
        obs_dtype: element type of an array observation (``float32``, or ``uint8`` for one image).
        obs_dict: the entries of a dict observation (``None``: array observations).
        task_descriptions: the language instruction of each task the env can pose, indexed by the observation's
            integer ``task_index`` entry where it has one (LIBERO suites); a single-task env has one (its config's
            ``task_description`` or its env id). What a vision-language-action policy is prompted with.
    """

    obs_shape: tuple[int, ...]
    action_type: Literal["discrete", "continuous"]
    action_dim: int
    num_actions: int | None = None
    action_low: tuple[float, ...] | None = None
    action_high: tuple[float, ...] | None = None
    obs_dtype: str = "float32"
    obs_dict: Mapping[str, ObsSpec] | None = None
    task_descriptions: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.obs_dict is not None and self.obs_shape != ():
            raise ValueError(f"EnvSpec: dict observations have obs_shape (), got {self.obs_shape}")
        ObsSpec(self.obs_shape, self.obs_dtype)  # validates the dtype

    @property
    def observation(self) -> ObsSpec | Mapping[str, ObsSpec]:
        """The observation layout: one :class:`ObsSpec`, or a dict of them."""
        if self.obs_dict is not None:
            return self.obs_dict
        return ObsSpec(self.obs_shape, self.obs_dtype)


@dataclass
class EpisodeStats:
    """Episodes that finished during a chunk step (one entry per finished episode).

    ``returns`` and ``lengths`` always; the rest where the task defines them (then for every episode):
    ``successes`` (the task was solved at some step of the episode: RLinf's ``success_once``),
    ``successes_at_end`` (solved at the episode's last step: ``success_at_end``) and ``tasks`` (the task's name,
    for multi-task suites such as LIBERO or Meta-World MT10).
    """

    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    successes: list[bool] = field(default_factory=list)
    successes_at_end: list[bool] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)

    def extend(self, other: EpisodeStats) -> None:
        """Append ``other``'s episodes."""
        self.returns += other.returns
        self.lengths += other.lengths
        self.successes += other.successes
        self.successes_at_end += other.successes_at_end
        self.tasks += other.tasks

    def as_dict(self) -> dict[str, list[Any]]:
        """The lists by name (what env workers return to the runner)."""
        return {
            "returns": self.returns,
            "lengths": self.lengths,
            "successes": self.successes,
            "successes_at_end": self.successes_at_end,
            "tasks": self.tasks,
        }


@dataclass(frozen=True)
class ChunkStepResult:
    """The outcome of executing one chunk of ``C`` actions in each of ``N`` envs.

    Attributes:
        obs: ``[N, *obs_shape]`` observation to act on next (after auto-reset for envs that ended); for dict
            observations a dict of ``[N, *shape]`` arrays (so for ``final_obs``).
        rewards: ``[N, C]`` float32 per-step rewards.
        terminations: ``[N, C]`` bool, the episode reached a terminal state at that step.
        truncations: ``[N, C]`` bool, the episode was cut (time limit) at that step.
        final_obs: ``[N, *obs_shape]`` the last observation before an auto-reset, for envs whose last
            step in the chunk ended an episode (bootstrap value target); equal to ``obs`` elsewhere.
        episodes: statistics of the episodes that finished in this chunk.
        interventions: ``[N, C]`` bool, a human took over that step (human-in-the-loop envs that report it in
            their step info, e.g. gym-hil's ``is_intervention``); ``None`` where the env reports none.
        intervention_actions: ``[N, C, action_dim]`` the actions executed at those steps (the human's; the
            policy's elsewhere); ``None`` with ``interventions``.
    """

    obs: NpObs
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    final_obs: NpObs
    episodes: EpisodeStats
    interventions: np.ndarray | None = None
    intervention_actions: np.ndarray | None = None

    @property
    def dones(self) -> np.ndarray:
        """``[N, C]`` bool: terminated or truncated."""
        out: np.ndarray = np.logical_or(self.terminations, self.truncations)
        return out


@runtime_checkable
class VecEnv(Protocol):
    """A batch of environments stepped with action chunks."""

    num_envs: int
    group_size: int
    spec: EnvSpec

    def reset(self, *, seed: int | None = None) -> NpObs:
        """Reset every env; env ``i`` uses seed ``seed + i // group_size``. Returns ``[N, *obs_shape]``."""
        ...

    def chunk_step(self, actions: np.ndarray) -> ChunkStepResult:
        """Execute ``actions`` ``[N, C]`` (discrete) or ``[N, C, action_dim]`` (continuous)."""
        ...

    def get_state(self) -> dict[str, Any]:
        """Everything the next ``chunk_step`` results depend on, as a picklable dict.

        Restoring it with :meth:`set_state` (on this env or on a fresh one built with the same arguments) makes
        the following ``reset``/``chunk_step`` calls return bit-identical observations, rewards and flags.
        """
        ...

    def set_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`get_state` returned; raises ``ValueError`` if it belongs to a different env."""
        ...

    def close(self) -> None:
        """Release simulator resources."""
        ...
