"""rlinf_models: see the package README."""

from importlib.metadata import version as _version

from ._config import ActorConfig, OptimConfig
from .embodied import ActorWorker

__version__ = _version("rlinf-models")

__all__ = ["ActorConfig", "ActorWorker", "OptimConfig", "__version__"]
