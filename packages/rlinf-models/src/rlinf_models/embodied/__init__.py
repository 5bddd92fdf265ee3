"""Embodied training: PPO-family updates of actor-critic policies on rollout batches."""

from typing import TYPE_CHECKING, Any

from ._trainer import REQUIRED_BATCH_KEYS, EmbodiedPPOTrainer

if TYPE_CHECKING:
    from ._actor_worker import CHECKPOINT_SUBDIR, EmbodiedActorWorker

__all__ = ["CHECKPOINT_SUBDIR", "REQUIRED_BATCH_KEYS", "EmbodiedActorWorker", "EmbodiedPPOTrainer"]


def __getattr__(name: str) -> Any:
    # The worker pulls in Ray (through rlinf_scheduler): loaded on first use only.
    if name in ("EmbodiedActorWorker", "CHECKPOINT_SUBDIR"):
        from . import _actor_worker

        return getattr(_actor_worker, name)
    raise AttributeError(f"module 'rlinf_models.embodied' has no attribute {name!r}")
