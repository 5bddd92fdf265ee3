"""Embodied training: PPO-family updates of actor-critic policies on rollout batches."""

from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._trainer import EMBODIED_ADV_TYPES, MASKED_ADV_TYPES, REQUIRED_BATCH_KEYS, EmbodiedPPOTrainer

if TYPE_CHECKING:
    from ._actor_worker import CHECKPOINT_SUBDIR, EmbodiedActorWorker

__all__ = [
    "CHECKPOINT_SUBDIR",
    "EMBODIED_ADV_TYPES",
    "MASKED_ADV_TYPES",
    "REQUIRED_BATCH_KEYS",
    "EmbodiedActorWorker",
    "EmbodiedPPOTrainer",
]

# The worker pulls in Ray (through rlinf_scheduler): loaded on first use only.
__getattr__ = lazy_exports(
    __name__, {"EmbodiedActorWorker": "._actor_worker", "CHECKPOINT_SUBDIR": "._actor_worker"}
)
