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
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from rlinf_core.protocols import OffPolicyActor

from ._embodied import EnvRunner
from ._metrics import mean_over_ranks

__all__ = ["OffPolicyRunner"]


class OffPolicyRunner(EnvRunner[OffPolicyActor]):
    """Runs off-policy embodied RL (SAC, CrossQ, RLPD) over actor, rollout and env worker groups.

    One training step: a rollout of ``env.train.max_steps_per_rollout_epoch`` steps per env (random actions
    during the warm-up) whose transitions go to the actor's replay buffer through the channel, then the actor's
    gradient steps. The weight sync before each step, the evaluation and checkpoint cadence, resume and the stop
    target are :class:`~rlinf_runners.EnvRunner`'s and :class:`~rlinf_runners.Runner`'s.

    The arguments are :class:`~rlinf_runners.EnvRunner`'s: ``actor`` is an ``OffPolicyActor`` group, the env
    group collects transitions, ``random_warmup_steps`` is ``algorithm.random_warmup_steps``.
    """

    progress_keys: ClassVar[Sequence[tuple[str, str]]] = (
        ("env/return_mean", "ret"),
        ("eval/return_mean", "eval"),
        ("eval/success_rate", "succ"),
        ("train/sac/critic_loss", "q_loss"),
        ("time/step_s", "s/step"),
    )

    def _check_budget(self, path: Path, saved: int | None) -> None:
        """Nothing to say: the off-policy actor has no learning-rate schedule, another budget just trains longer."""
        del path, saved

    def update(self) -> dict[str, float]:
        """The actor's gradient steps of this training step: ``train/*`` metrics, ``rollout/random_actions``."""
        t1 = time.perf_counter()
        train = mean_over_ranks(self.result(self.actor.call(OffPolicyActor.run_training)))
        metrics = {"time/train_s": time.perf_counter() - t1}
        for key, value in train.items():
            metrics[key if key.startswith(("train/", "time/")) else f"train/{key}"] = value
        metrics["rollout/random_actions"] = float(self.rollout_mode(self.global_step) == "random")
        return metrics

    def train_step(self) -> dict[str, float]:
        """Collect (random actions during the warm-up) into the replay buffer, then the actor's gradient steps."""
        metrics = self.collect(self.rollout_mode(self.global_step))
        metrics.update(self.update())
        metrics.update(self._timings())
        return metrics
