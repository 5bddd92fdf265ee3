"""rlinf_rollout: rollout engines and the ``RolloutWorker`` (batched inference with weights from the actor)."""

from importlib.metadata import version as _version
from typing import Any

from ._config import RolloutConfig

__version__ = _version("rlinf-rollout")


def __getattr__(name: str) -> Any:
    # RolloutWorker pulls in Ray and torch: load it on first use so that `import rlinf_rollout` stays light.
    if name == "RolloutWorker":
        from ._worker import RolloutWorker

        return RolloutWorker
    raise AttributeError(f"module 'rlinf_rollout' has no attribute {name!r}")


__all__ = ["RolloutConfig", "RolloutWorker", "__version__"]
