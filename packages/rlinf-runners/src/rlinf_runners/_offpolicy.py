"""The synchronous off-policy loop (SAC family): env steps into the actor's replay buffer, then gradient steps.

The runner drives three groups through their role protocols, like the embodied runner (whose env ↔ rollout
exchange, weight sync, evaluation and checkpoints it shares through :class:`~rlinf_runners.EnvRunner`):

- ``actor`` (:class:`~rlinf_core.protocols.OffPolicyActor`): ``recv_rollout_batch`` puts the step's
  transitions into its replay buffer, ``run_training`` makes the step's gradient steps (``algorithm.utd_ratio``
  x transitions, or ``algorithm.update_epoch``; none while the buffer is below ``min_buffer_size``);
- ``rollout``: ``generate`` in ``random`` mode (uniform actions) for the first ``algorithm.random_warmup_steps``
  training steps, ``train`` mode afterwards;
- ``env``: ``interact`` with transitions (``next_obs``, ``terminations``), ``evaluate``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from rlinf_core.protocols import EmbodiedRollout, EnvRole, OffPolicyActor
from rlinf_scheduler import RoleGroup

from ._base import StepCallback
from ._config import RunnerConfig
from ._embodied import EnvRunner
from ._metrics import mean_over_ranks

__all__ = ["OffPolicyRunner"]


class OffPolicyRunner(EnvRunner[OffPolicyActor]):
    """Runs off-policy embodied RL (SAC, CrossQ, RLPD) over actor, rollout and env worker groups.

    One training step: a rollout of ``env.train.max_steps_per_rollout_epoch`` steps per env (random actions
    during the warm-up) whose transitions go to the actor's replay buffer through the channel, then the actor's
    gradient steps. The weight sync before each step, the evaluation and checkpoint cadence, resume and the stop
    target are :class:`~rlinf_runners.EnvRunner`'s and :class:`~rlinf_runners.Runner`'s.

    Args:
        cfg: the ``runner`` config.
        actor: the actor group (the ``OffPolicyActor`` role).
        rollout: the rollout group.
        env: the env group (collecting transitions).
        random_warmup_steps: training steps with uniform random actions (``algorithm.random_warmup_steps``).
        rollout_epoch: rollouts per training step (``algorithm.rollout_epoch``).
        run_config: the resolved configuration, stored with W&B / SwanLab runs.
        on_step: called with ``(global_step, record)`` after each logged step.
        channel: the env → actor channel (default: one created on the first step, shut down at the end).
    """

    progress_keys: ClassVar[Sequence[tuple[str, str]]] = (
        ("env/return_mean", "ret"),
        ("eval/return_mean", "eval"),
        ("eval/success_rate", "succ"),
        ("train/sac/critic_loss", "q_loss"),
        ("time/step_s", "s/step"),
    )

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        actor: RoleGroup[OffPolicyActor],
        rollout: RoleGroup[EmbodiedRollout],
        env: RoleGroup[EnvRole],
        random_warmup_steps: int = 0,
        rollout_epoch: int = 1,
        run_config: Mapping[str, Any] | None = None,
        on_step: StepCallback | None = None,
        channel: Any = None,
    ) -> None:
        super().__init__(
            cfg,
            actor=actor,
            rollout=rollout,
            env=env,
            rollout_epoch=rollout_epoch,
            run_config=run_config,
            on_step=on_step,
            channel=channel,
        )
        self.random_warmup_steps = random_warmup_steps

    def _check_budget(self, path: Path, saved: int | None) -> None:
        """Nothing to say: the off-policy actor has no learning-rate schedule, another budget just trains longer."""
        del path, saved

    def train_step(self) -> dict[str, float]:
        """Collect (random actions during the warm-up) into the replay buffer, then the actor's gradient steps."""
        warmup = self.global_step < self.random_warmup_steps
        metrics = self.collect("random" if warmup else "train")
        t1 = time.perf_counter()
        train = mean_over_ranks(self.wait(self.actor.call(OffPolicyActor.run_training)))
        metrics["time/train_s"] = time.perf_counter() - t1
        for key, value in train.items():
            metrics[key if key.startswith(("train/", "time/")) else f"train/{key}"] = value
        metrics["rollout/random_actions"] = float(warmup)
        metrics.update(self._timings())
        return metrics
