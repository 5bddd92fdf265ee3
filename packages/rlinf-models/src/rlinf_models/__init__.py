"""rlinf_models: see the package README."""

from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from ._config import EmbodiedActorConfig, OptimConfig

if TYPE_CHECKING:
    from .embodied._actor_worker import EmbodiedActorWorker

__version__ = _version("rlinf-models")

__all__ = ["EmbodiedActorConfig", "EmbodiedActorWorker", "OptimConfig", "__version__"]


def __getattr__(name: str) -> Any:
    # EmbodiedActorWorker pulls in Ray (through rlinf_scheduler): loaded on first use, so that importing the
    # policies or configs stays light.
    if name == "EmbodiedActorWorker":
        from .embodied._actor_worker import EmbodiedActorWorker

        return EmbodiedActorWorker
    raise AttributeError(f"module 'rlinf_models' has no attribute {name!r}")
