"""Asynchronous embodied PPO: env and rollout keep producing rollout batches while the actor trains.

:class:`AsyncEmbodiedRunner` is the :class:`~rlinf_runners.EmbodiedRunner` on the asynchronous machinery of
:class:`~rlinf_runners.AsyncEnvRunner` (production running ahead, published weights, the staleness bound
``k = algorithm.staleness_threshold``, checkpoints between productions). What it adds is the PPO side: before
the update the actor recomputes the proximal log-probs of the batch under its current weights
(``EmbodiedActor.compute_proximal_logprobs``, which also counts the samples' staleness) and trains with the
decoupled PPO loss.

With ``k = 0`` nothing overlaps and every sample is of the current version: the samples' proximal log-probs
are their behaviour log-probs, the decoupled loss reduces to the PPO loss, and the run computes exactly what
the synchronous runner computes.
"""

from __future__ import annotations

from rlinf_core.protocols import EmbodiedActor

from ._async import AsyncEnvRunner, staleness_metrics
from ._embodied import EmbodiedRunner

__all__ = ["AsyncEmbodiedRunner", "staleness_metrics"]


class AsyncEmbodiedRunner(AsyncEnvRunner[EmbodiedActor], EmbodiedRunner):
    """Embodied PPO with rollout production overlapping the actor update (see the module docstring).

    The arguments are :class:`~rlinf_runners.AsyncEnvRunner`'s, ``actor`` being an ``EmbodiedActor`` group.
    """

    def staleness_counts(self) -> list[dict[str, float]]:
        """The proximal log-probs of the received batch (decoupled PPO), with each rank's staleness counts."""
        return self.result(self.actor.call(EmbodiedActor.compute_proximal_logprobs))
