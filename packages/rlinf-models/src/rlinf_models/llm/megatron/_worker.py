"""``MegatronLLMActorWorker``: :class:`~rlinf_models.llm.LLMActorWorker` bound to the Megatron-core backend.

What :func:`~rlinf_models.llm.actor_worker_class` returns for ``actor.training_backend: megatron``: the same
host, methods, batch contract and weight-sync protocol, on :class:`MegatronActorBackend` (GPU only). Not run in
this repository (no GPU); see ``docs/gpu_backends.md``.
"""

from __future__ import annotations

from typing import ClassVar

from .._actor_worker import LLMActorWorker
from ._backend import MegatronActorBackend

__all__ = ["MegatronLLMActorWorker"]


class MegatronLLMActorWorker(LLMActorWorker):
    """Trains a causal LM with megatron-core (TP / PP / DP) whatever ``actor.training_backend`` says.

    Constructor arguments as :class:`~rlinf_models.llm.LLMActorWorker` (``megatron=`` the parallel layout); the
    algorithm must be a policy loss (no critic on this backend), see :class:`MegatronActorBackend`.
    """

    backend_override: ClassVar[str | None] = "megatron"
    backend: MegatronActorBackend
