"""What every asynchronous embodied runner shares: production running ahead of the update, published weights.

:class:`AsyncEnvRunner` changes three things of an :class:`~rlinf_runners.EnvRunner`, whatever the actor
trains (PPO on the rollout batch, SAC on its replay buffer):

- **production runs ahead.** Rollout batch ``b`` is the batch training step ``b`` consumes. The runner starts
  producing batch ``b`` (``EnvRole.interact`` with ``batch=b`` ‖ ``EmbodiedRollout.generate``) as soon as the
  previous production ended and the bound below allows it, also while the actor trains; its trajectories wait
  on the env → actor channel under the keys ``(b, actor rank)``. One production runs at a time (the env and
  rollout workers serve one rollout at a time).
- **weights are published, not broadcast.** After each update the actor puts the new weights on a weights
  channel (``TrajectoryActor.publish_weights``) and goes on; the rollout takes the newest weights there before
  each inference call (a chunk boundary), and every sample carries the version that chose its action
  (``versions [T, E]`` in the trajectory).
- **staleness is bounded.** With ``k = algorithm.staleness_threshold``, batch ``b`` starts only once version
  ``b - k`` was published, and the rollout waits until it holds it (``min_version``). Versions only grow,
  so every sample of batch ``b`` lags the weights that train it (version ``b``) by at most ``k``.

With ``k = 0`` batch ``b`` starts after the update ``b - 1`` was published and nothing overlaps: the run
computes exactly what the synchronous runner computes.

Checkpoints are written at points where no production runs: a batch whose step ends at a save is never
started early, so a checkpoint holds the env episodes, the rollout RNGs and the actor state between two
batches, as in a synchronous run.

A concrete runner mixes this class in front of its synchronous runner (``class AsyncX(AsyncEnvRunner[Actor],
X)``), which supplies ``update`` and ``rollout_mode``, and implements :meth:`AsyncEnvRunner.staleness_counts`.
"""

from __future__ import annotations

import abc
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from rlinf_core.metrics import MetricLogger
from rlinf_core.protocols import EmbodiedRollout, EnvRole, TrajectoryActor
from rlinf_scheduler import Channel, RoleCall, RoleGroup, SchedulerTimeoutError

from ._base import StepCallback
from ._config import RunnerConfig
from ._embodied import EnvRunner, rollout_metrics

__all__ = ["AsyncEnvRunner", "staleness_metrics"]

A = TypeVar("A", bound=TrajectoryActor)
R = TypeVar("R")

_POLL_S = 0.005
"""How often the driver checks, while it waits for a call, whether the next production may start."""


def staleness_metrics(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Merge the actor ranks' ``staleness/*`` counts into the logged staleness metrics.

    Returns:
        ``staleness/mean``, ``staleness/max``, ``staleness/min`` and the histogram ``staleness/frac_<d>``
        (share of the batch's samples ``d`` versions behind; the last bin holds that many or more).
    """
    samples = sum(r.get("staleness/samples", 0.0) for r in per_rank)
    if samples == 0:
        return {}
    out = {
        "staleness/mean": sum(r["staleness/sum"] for r in per_rank) / samples,
        "staleness/max": max(r["staleness/max"] for r in per_rank if r.get("staleness/samples")),
        "staleness/min": min(r["staleness/min"] for r in per_rank if r.get("staleness/samples")),
    }
    bins = sorted({k for r in per_rank for k in r if k.startswith("staleness/count_")}, key=_bin_index)
    for key in bins:
        out[f"staleness/frac_{_bin_index(key)}"] = sum(r.get(key, 0.0) for r in per_rank) / samples
    return out


def _bin_index(key: str) -> int:
    return int(key.rsplit("_", 1)[1])


class _Production:
    """One rollout batch being produced (or produced and not yet consumed)."""

    def __init__(
        self, batch: int, serve: RoleCall[int], interact: RoleCall[dict[str, Any]], started: float
    ) -> None:
        self.batch = batch
        self.serve = serve
        self.interact = interact
        self.started = started
        self.env_results: list[dict[str, Any]] | None = None
        self.seconds = 0.0

    def done(self) -> bool:
        return self.interact.done() and self.serve.done()


class AsyncEnvRunner(EnvRunner[A]):
    """An :class:`~rlinf_runners.EnvRunner` whose rollout production overlaps the update (module docstring).

    Args:
        cfg: the ``runner`` config.
        actor: the actor group (a ``TrajectoryActor``: it publishes weights and reads batches by index).
        rollout: the rollout group.
        env: the env group.
        rollout_epoch: rollouts per training step (``algorithm.rollout_epoch``).
        random_warmup_steps: the first rollout batches, with uniform random actions (``algorithm.random_warmup_steps``,
            off-policy).
        staleness_threshold: ``algorithm.staleness_threshold``: the most updates a sample's behaviour weights
            may lag behind the weights it trains.
        run_config: the resolved configuration, stored with W&B / SwanLab runs.
        on_step: called with ``(global_step, record)`` after each logged step.
        channel: the env → actor channel (default: one created on the first step, shut down at the end).
        weights: the actor → rollout weights channel (default: likewise).
        eval_task_name: task name of ``eval/results.json`` rows for envs that report none (the eval env id).
        video_dir: where evaluation videos go (``None``: under ``<log_path>/eval/global_step_<N>``).

    Raises:
        ValueError: for a negative ``staleness_threshold``.
    """

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        actor: RoleGroup[A],
        rollout: RoleGroup[EmbodiedRollout],
        env: RoleGroup[EnvRole],
        rollout_epoch: int = 1,
        random_warmup_steps: int = 0,
        staleness_threshold: int = 1,
        run_config: Mapping[str, Any] | None = None,
        on_step: StepCallback | None = None,
        channel: Any = None,
        weights: Any = None,
        eval_task_name: str = "eval",
        video_dir: str | None = None,
    ) -> None:
        if staleness_threshold < 0:
            raise ValueError(f"staleness_threshold must be >= 0, got {staleness_threshold}")
        # The next class in the MRO is the synchronous runner, which takes EnvRunner's arguments.
        super().__init__(
            cfg,
            actor=actor,
            rollout=rollout,
            env=env,
            rollout_epoch=rollout_epoch,
            random_warmup_steps=random_warmup_steps,
            run_config=run_config,
            on_step=on_step,
            channel=channel,
            eval_task_name=eval_task_name,
            video_dir=video_dir,
        )
        self.staleness_threshold = staleness_threshold
        self._weights: Any = weights
        self._owns_weights = weights is None
        self._published = -1
        self._next_batch = 0
        self._productions: dict[int, _Production] = {}

    # ------------------------------------------------------------------------------- what a subclass adds
    @abc.abstractmethod
    def staleness_counts(self) -> list[dict[str, float]]:
        """Each actor rank's ``staleness/*`` counts of the received batch (before its update)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------------ production
    def _weights_channel(self) -> Any:
        if self._weights is None:
            self._weights = Channel.create(f"{self.actor.name}-weights-to-{self.rollout.name}-{id(self):x}")
        return self._weights

    def generate_options(self) -> dict[str, Any]:
        """The weights channel, and the version the rollout must hold before it serves (the newest published)."""
        return {"weights": self._weights_channel(), "min_version": self._published}

    def _running(self) -> _Production | None:
        return next((p for p in self._productions.values() if p.env_results is None), None)

    def _oldest_version(self, batch: int) -> int:
        """The oldest weights that may produce ``batch``: ``batch - staleness_threshold``, at least the first."""
        return max(batch - self.staleness_threshold, 0)

    def _may_start(self, batch: int) -> bool:
        """Whether production of ``batch`` may start now (the staleness bound, checkpoints, the budget)."""
        if batch >= self.cfg.total_steps or self._running() is not None:
            return False
        if self._oldest_version(batch) > self._published:
            return False  # its samples would lag the weights that train them by more than the bound
        save = self.cfg.save_interval
        # A batch consumed right after a checkpoint starts after it: checkpoints fall between productions.
        return not (batch > self.global_step and save > 0 and batch % save == 0)

    def _advance(self) -> None:
        """Collect a production that ended and start the next one when allowed; never blocks."""
        running = self._running()
        if running is not None and running.done():
            self._finish(running)
        if self._may_start(self._next_batch):
            batch = self._next_batch
            self._next_batch += 1
            mode: Literal["train", "random"] = self.rollout_mode(batch)
            options = {"weights": self._weights_channel(), "min_version": self._oldest_version(batch)}
            serve = self.rollout.call(EmbodiedRollout.generate, self.env.name, mode, **options)
            interact = self.env.call(
                EnvRole.interact,
                self.rollout.name,
                self._channel_for_actor(),
                self.actor.world_size,
                batch=batch,
            )
            self._productions[batch] = _Production(batch, serve, interact, time.perf_counter())

    def _finish(self, production: _Production) -> None:
        production.env_results = self.wait(production.interact)
        self.wait(production.serve)
        production.seconds = time.perf_counter() - production.started

    def _drain(self) -> None:
        """Wait for the running production (before an evaluation or a checkpoint: the workers serve one thing)."""
        running = self._running()
        if running is not None:
            self._finish(running)

    def result(self, call: RoleCall[R]) -> list[R]:
        """Wait for ``call`` (at most ``runner.step_timeout_s``) while starting productions as they become due."""
        deadline = time.monotonic() + self.cfg.step_timeout_s
        self._advance()
        while not call.done():
            self._advance()
            if time.monotonic() > deadline:
                raise SchedulerTimeoutError(
                    f"waited {self.cfg.step_timeout_s:g} s (runner.step_timeout_s) for an actor call of step "
                    f"{self.global_step + 1} while producing rollout batch {self._next_batch - 1}"
                )
            time.sleep(_POLL_S)
        return self.wait(call)

    # ---------------------------------------------------------------------------------------- the phases
    def sync_weights(self) -> None:
        """Publish the actor's weights unless the newest version already is (never waits for the rollout)."""
        if self._published < self.global_step:
            self._publish()

    def _publish(self) -> None:
        versions = self.result(
            self.actor.call(
                TrajectoryActor.publish_weights,
                self._weights_channel(),
                self.rollout.world_size,
                self.cfg.step_timeout_s,
            )
        )
        self._published = int(versions[0])

    def evaluate(self) -> dict[str, float]:
        """The synchronous evaluation, after the running production ended (the env and rollout are free)."""
        self._drain()
        return super().evaluate()

    def train_step(self) -> dict[str, float]:
        """Consume rollout batch ``global_step``, update, publish the new weights; productions go on meanwhile."""
        step = self.global_step
        t0 = time.perf_counter()
        self._advance()  # starts this step's batch unless it was started (or produced) during the last update
        gather = self.actor.call(
            TrajectoryActor.recv_rollout_batch,
            self._channel_for_actor(),
            self.num_messages,
            self.cfg.step_timeout_s,
            batch=step,
        )
        self.result(gather)
        production = self._productions.pop(step)
        if production.env_results is None:
            self._finish(production)  # its trajectories arrived: the env and rollout are ending the rollout
        t1 = time.perf_counter()
        staleness = staleness_metrics(self.staleness_counts())
        metrics = self.update()
        self._publish()
        self._advance()
        t2 = time.perf_counter()
        metrics.update(rollout_metrics(production.env_results or [], production.seconds))
        metrics["time/rollout_s"] = t1 - t0  # the wait for the batch; time/step_s adds up to the step's wall
        metrics["time/train_s"] = t2 - t1
        metrics["rollout/env_steps_per_s"] = metrics["env/steps"] / max(t2 - t0, 1e-9)
        metrics["time/production_s"] = production.seconds
        metrics.update(staleness)
        metrics["staleness/published_version"] = float(self._published)
        metrics.update(self._timings())
        return metrics

    # ------------------------------------------------------------------------------------- run hooks
    def save_worker_state(self, staging: Path) -> None:
        """The synchronous checkpoint (no production runs at a save: see :meth:`_may_start`)."""
        self._drain()
        super().save_worker_state(staging)

    def before_training(self, logger: MetricLogger) -> None:
        """The first batch to produce is the one the next step consumes (after a resume too)."""
        del logger
        self._next_batch = self.global_step
        self._productions.clear()

    def release(self) -> None:
        """Let a running production end (a run stopped early), then shut the channels this runner created."""
        try:
            # Not while an error propagates: the run is failing, and its workers may be gone.
            if self._running() is not None and sys.exc_info()[1] is None:
                self._drain()
        finally:
            self._productions.clear()
            if self._owns_weights and self._weights is not None:
                self._weights.shutdown()
                self._weights = None
            super().release()
