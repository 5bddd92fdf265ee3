"""Embodied training: PPO-family updates of actor-critic policies on rollout batches."""

from ._trainer import REQUIRED_BATCH_KEYS, EmbodiedPPOTrainer

__all__ = ["REQUIRED_BATCH_KEYS", "EmbodiedPPOTrainer"]
