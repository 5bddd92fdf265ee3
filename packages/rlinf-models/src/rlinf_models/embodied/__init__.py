"""Embodied training: PPO-family updates of actor-critic policies on rollout batches."""

from ._actor_worker import CHECKPOINT_SUBDIR, ActorWorker
from ._trainer import REQUIRED_BATCH_KEYS, EmbodiedPPOTrainer

__all__ = ["CHECKPOINT_SUBDIR", "REQUIRED_BATCH_KEYS", "ActorWorker", "EmbodiedPPOTrainer"]
