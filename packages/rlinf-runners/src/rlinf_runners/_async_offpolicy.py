"""Asynchronous off-policy training (SAC family): env and rollout keep filling the replay buffer during updates.

:class:`AsyncOffPolicyRunner` is the :class:`~rlinf_runners.OffPolicyRunner` on the asynchronous machinery of
:class:`~rlinf_runners.AsyncEnvRunner`: while the actor makes the gradient steps of step ``b``, the env and
rollout workers already produce rollout batch ``b + 1`` (random actions during the warm-up) with the newest
published weights, taken at a chunk boundary. Batch ``b`` starts only once version ``b - k`` was published
(``k = algorithm.staleness_threshold``); its transitions, tagged with the versions that chose their actions,
go into the replay buffer at step ``b``, before that step's gradient steps.

Nothing in the update changes: SAC learns from a replay buffer of older transitions anyway, and a batch whose
actions come from slightly older weights is one more such batch. The staleness bound keeps the data the
buffer gets close to the current policy, and the logged ``staleness/*`` metrics say how close.

With ``k = 0`` nothing overlaps and the run computes exactly what the synchronous runner computes.
"""

from __future__ import annotations

from rlinf_core.protocols import OffPolicyActor

from ._async import AsyncEnvRunner
from ._offpolicy import OffPolicyRunner

__all__ = ["AsyncOffPolicyRunner"]


class AsyncOffPolicyRunner(AsyncEnvRunner[OffPolicyActor], OffPolicyRunner):
    """Off-policy training with rollout production overlapping the gradient steps (see the module docstring).

    The arguments are :class:`~rlinf_runners.AsyncEnvRunner`'s: ``actor`` is an ``OffPolicyActor`` group, the
    env group collects transitions, ``random_warmup_steps`` is ``algorithm.random_warmup_steps``.
    """

    def staleness_counts(self) -> list[dict[str, float]]:
        """The staleness counts of the transitions the actor just put into its replay buffer."""
        return self.result(self.actor.call(OffPolicyActor.received_staleness))
