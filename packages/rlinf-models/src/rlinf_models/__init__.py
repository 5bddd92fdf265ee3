"""rlinf_models: see the package README."""

from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from ._config import ActorConfig, OptimConfig

if TYPE_CHECKING:
    from .embodied._actor_worker import ActorWorker

__version__ = _version("rlinf-models")

__all__ = ["ActorConfig", "ActorWorker", "OptimConfig", "__version__"]


def __getattr__(name: str) -> Any:
    # ActorWorker pulls in Ray (through rlinf_scheduler): loaded on first use, so that importing the
    # policies or configs stays light.
    if name == "ActorWorker":
        from .embodied._actor_worker import ActorWorker

        return ActorWorker
    raise AttributeError(f"module 'rlinf_models' has no attribute {name!r}")
