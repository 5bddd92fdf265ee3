"""Role protocols: the worker methods a runner calls on each of its groups.

A runner holds each group as a ``RoleGroup[Role]`` (see ``rlinf_scheduler.RoleGroup``) and calls a method by
passing the role's function, ``actor.call(EmbodiedActor.run_training)``, so a reader, an IDE and mypy follow
the call from the runner to the role, and from the role to the worker classes that implement it (a test checks
that each worker class has every method of its role with the same parameters). Every group call runs on all
ranks of the group; the result is one value per rank.

Roles and the classes that play them:

- :class:`EmbodiedActor`: ``rlinf_models.EmbodiedActorWorker``;
- :class:`OffPolicyActor`: ``rlinf_models.offpolicy.OffPolicyActorWorker``;
- :class:`EmbodiedRollout`: ``rlinf_rollout.EmbodiedRolloutWorker``;
- :class:`EnvRole`: ``rlinf_envs.EnvWorker``;
- :class:`LLMActor`: ``rlinf_models.llm.LLMActorWorker`` and ``MegatronLLMActorWorker``;
- :class:`LLMRollout`: ``rlinf_rollout.llm.LLMRolloutWorker``;
- :class:`AgentRollout`: ``rlinf_rollout.agent.AgentRolloutWorker``;
- :class:`RewardRole`: ``rlinf_core.rewards.RewardWorker``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from rlinf_scheduler import Channel, ProcessTrace

__all__ = [
    "ActorRole",
    "AgentRollout",
    "CheckpointRole",
    "EmbodiedActor",
    "EmbodiedRollout",
    "EnvRole",
    "LLMActor",
    "LLMRollout",
    "OffPolicyActor",
    "OffloadRole",
    "RewardRole",
    "RolloutRole",
    "TimedRole",
    "TracedRole",
    "TrajectoryActor",
]


class TimedRole(Protocol):
    """Any worker: the durations its ``timed`` sections accumulated (``rlinf_scheduler.Worker.pop_timings``)."""

    def pop_timings(self) -> dict[str, float]:
        """Seconds by section name since the last call (then reset)."""
        ...


class TracedRole(Protocol):
    """Any worker: the spans of its timeline (``rlinf_scheduler.Worker.set_tracing`` / ``pop_trace``)."""

    def set_tracing(self, enabled: bool) -> None:
        """Turn the worker process's span recorder on or off."""
        ...

    def pop_trace(self) -> ProcessTrace:
        """The spans recorded since the last call (then dropped on the worker)."""
        ...


class OffloadRole(Protocol):
    """A worker that can free its accelerator memory between phases (collocated actor and rollout)."""

    def offload(self) -> None:
        """Move weights (and optimizer state) off the accelerator."""
        ...

    def onload(self) -> None:
        """Bring them back before the next phase."""
        ...


class CheckpointRole(Protocol):
    """A worker whose state goes into the run's checkpoints."""

    def save_checkpoint(self, path: str) -> None:
        """Write this worker's state into the (staging) checkpoint directory ``path``."""
        ...

    def load_checkpoint(self, path: str) -> None:
        """Restore it from the checkpoint directory ``path``."""
        ...


class ActorRole(CheckpointRole, Protocol):
    """The trained model: it sends versioned weights to the rollout group."""

    def get_model_version(self) -> int:
        """Completed training updates (0: initial weights)."""
        ...

    def sync_model_to_rollout(
        self, rollout_group_name: str, rollout_world_size: int | None = None, *, timeout: float | None = None
    ) -> int:
        """Send ``{"version", "state_dict"}`` to every rank of ``rollout_group_name``; returns the version."""
        ...


class RolloutRole(CheckpointRole, Protocol):
    """The inference copy of the model: it receives the actor's weights; its checkpoint holds its RNGs."""

    def get_model_version(self) -> int:
        """Version of the weights it holds."""
        ...

    def sync_model_from_actor(self, actor_group: str) -> int:
        """Receive the weights the actor group sends (the matching broadcast); returns their version."""
        ...


class TrajectoryActor(ActorRole, TimedRole, Protocol):
    """An actor fed with env trajectories through a ``Channel`` (the embodied actors, on- and off-policy)."""

    def recv_rollout_batch(
        self,
        channel: Channel,
        num_messages: int,
        timeout: float | None = None,
        *,
        key: Any = None,
        batch: int | None = None,
    ) -> int:
        """Take this rank's share of one rollout's ``num_messages`` trajectories from ``channel``.

        ``batch``: read the key ``(batch, rank)`` the env ranks put that rollout batch under (asynchronous runs).
        """
        ...

    def publish_weights(self, channel: Channel, rollout_world_size: int, timeout: float | None = None) -> int:
        """Put the current weights on ``channel`` for every rollout rank; returns their version.

        It does not wait for the rollout, which takes them between two inference calls (asynchronous runs).
        """
        ...


class EmbodiedActor(TrajectoryActor, Protocol):
    """The embodied actor (policy and value training on env trajectories)."""

    def compute_proximal_logprobs(self) -> dict[str, float]:
        """Decoupled PPO: the proximal log-probs of the received batch under the current weights.

        Samples of the current version keep their behaviour log-probs; returns ``staleness/*`` counts over
        this rank's samples.
        """
        ...

    def compute_advantages_and_returns(self) -> dict[str, float]:
        """Fill advantages (and returns) into the received batch; returns ``rollout/*`` means."""
        ...

    def run_training(self) -> dict[str, float]:
        """The update on the received batch; returns its ``actor/*`` metrics."""
        ...


class OffPolicyActor(TrajectoryActor, Protocol):
    """The off-policy embodied actor: trajectories go into its replay buffer, updates sample from it."""

    def run_training(self) -> dict[str, float]:
        """The gradient steps of one training step on replay batches (none before the buffer's minimum size)."""
        ...

    def received_staleness(self) -> dict[str, float]:
        """``staleness/*`` counts of the last received rollout's transitions against the current version."""
        ...


class EmbodiedRollout(RolloutRole, OffloadRole, TimedRole, Protocol):
    """The embodied rollout: serves the env group's action requests."""

    def generate(
        self,
        env_group: str,
        mode: Literal["train", "eval", "random"] = "train",
        *,
        weights: Channel | None = None,
        min_version: int = -1,
    ) -> int:
        """Answer ``env_group``'s observations until its rollout (``train``) or evaluation (``eval``) ends.

        ``random``: a training rollout with actions uniform over the action bounds (off-policy warm-up).
        With a ``weights`` channel (asynchronous runs) it takes the newest published weights before each
        inference call, and waits before the first one until it holds at least ``min_version``.
        """
        ...


class EnvRole(TimedRole, CheckpointRole, Protocol):
    """The simulator group: steps the envs with actions from the rollout group.

    Its checkpoint holds the episodes in progress.
    """

    def interact(
        self,
        rollout_group: str,
        actor_channel: Channel,
        actor_world_size: int = 1,
        *,
        batch: int | None = None,
    ) -> dict[str, Any]:
        """Run the training rollouts; trajectories go to ``actor_channel``, episode lists come back.

        ``batch``: put the trajectories under ``(batch, actor rank)`` instead of the actor rank (asynchronous
        runs keep several rollout batches on the channel).
        """
        ...

    def evaluate(
        self,
        rollout_group: str,
        video_dir: str | None = None,
        progress: Any = None,
        progress_key: str = "eval_progress",
    ) -> dict[str, Any]:
        """Run one deterministic evaluation; returns its episode lists (``returns``, ``lengths``, ...).

        With ``video_dir`` (and videos enabled in the env config) the rank also writes episode videos there.
        With ``progress`` (a ``Channel``) the rank reports its progress there under ``progress_key``.
        """
        ...


class LLMActor(ActorRole, OffloadRole, Protocol):
    """The LLM actor: RL and SFT updates on padded token batches (``[N, T]`` arrays)."""

    def compute_logprobs(self, batch: Mapping[str, Any]) -> Mapping[str, Any]:
        """Per-token ``logprobs`` (and ``ref_logprobs``, ``values`` when the run has them), ``[N, T]``."""
        ...

    def run_training(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """One RL update on this rank's share of ``batch``; returns its metrics."""
        ...

    def run_training_stream(
        self, channel: Channel, key: str, *, timeout: float | None = None
    ) -> dict[str, float]:
        """One RL update over micro-batches streamed through ``channel`` (the pipelined mode).

        The rank reads key ``f"{key}/{rank}"`` until a ``None`` and trains on each item as it arrives.
        """
        ...

    def run_sft(self, batch: Mapping[str, Any]) -> dict[str, float]:
        """One supervised update on this rank's share of ``batch``; returns ``loss`` and the like."""
        ...

    def update_reference_model(self) -> None:
        """Make the current weights the KL reference."""
        ...


class LLMRollout(RolloutRole, OffloadRole, Protocol):
    """The LLM rollout: sampling, each rank on its contiguous share of the prompts."""

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Mapping[str, Any] | None = None,
        *,
        shard: bool = True,
        images: Sequence[Sequence[Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """One output dict (``token_ids``, ``logprobs``, ``text``, ``finish_reason``) per prompt of the share.

        ``images``: each prompt's ``[H, W, 3]`` uint8 images, for a vision-language model (sharded with the prompts).
        """
        ...


class AgentRollout(LLMRollout, Protocol):
    """The agent rollout: whole multi-turn tool-using episodes."""

    def run_episodes(
        self,
        requests: Sequence[Mapping[str, Any]],
        sampling: Mapping[str, Any] | None = None,
        *,
        shard: bool = True,
    ) -> list[dict[str, Any]]:
        """One episode dict per request of this rank's share."""
        ...

    def build_demonstrations(
        self, requests: Sequence[Mapping[str, Any]], *, shard: bool = True
    ) -> list[dict[str, Any]]:
        """Token ids (``prompt_ids``, ``token_ids``, ``loss_mask``) of this rank's share of demonstrations."""
        ...


class RewardRole(Protocol):
    """The reward group: scores responses against accepted answers, each rank its share."""

    def compute(
        self, responses: Sequence[str], references: Sequence[Sequence[str]], *, shard: bool = True
    ) -> dict[str, list[float] | list[bool]]:
        """``{"rewards": [...], "correct": [...]}`` for this rank's share."""
        ...
