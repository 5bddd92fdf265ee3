"""rlinf_models: see the package README."""

from importlib.metadata import version as _version
from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._config import EmbodiedActorConfig, ExpertConfig, OptimConfig

if TYPE_CHECKING:
    from .embodied._actor_worker import EmbodiedActorWorker

__version__ = _version("rlinf-models")

__all__ = ["EmbodiedActorConfig", "EmbodiedActorWorker", "ExpertConfig", "OptimConfig", "__version__"]

# EmbodiedActorWorker pulls in Ray (through rlinf_scheduler): loaded on first use, so that importing the
# policies or configs stays light.
__getattr__ = lazy_exports(__name__, {"EmbodiedActorWorker": ".embodied._actor_worker"})
