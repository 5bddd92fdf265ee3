"""Embodied training: PPO-family updates of actor-critic policies on rollout batches."""

from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._types import EMBODIED_ADV_TYPES, MASKED_ADV_TYPES, REQUIRED_BATCH_KEYS

if TYPE_CHECKING:
    from ._actor_worker import (
        CHECKPOINT_SUBDIR,
        EmbodiedActorWorker,
        gather_trajectories,
        init_from_model_path,
    )
    from ._trainer import STALENESS_BINS, EmbodiedPPOTrainer, staleness_counts

__all__ = [
    "CHECKPOINT_SUBDIR",
    "EMBODIED_ADV_TYPES",
    "MASKED_ADV_TYPES",
    "REQUIRED_BATCH_KEYS",
    "STALENESS_BINS",
    "EmbodiedActorWorker",
    "EmbodiedPPOTrainer",
    "gather_trajectories",
    "init_from_model_path",
    "staleness_counts",
]

# The trainer (torch) and the worker (also Ray, through rlinf_scheduler) load on first use only, so the names
# the config checks read import without either.
__getattr__ = lazy_exports(
    __name__,
    {
        "EmbodiedActorWorker": "._actor_worker",
        "CHECKPOINT_SUBDIR": "._actor_worker",
        "EmbodiedPPOTrainer": "._trainer",
        "STALENESS_BINS": "._trainer",
        "staleness_counts": "._trainer",
        "gather_trajectories": "._actor_worker",
        "init_from_model_path": "._actor_worker",
    },
)
