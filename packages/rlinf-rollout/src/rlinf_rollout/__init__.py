"""rlinf_rollout: rollout engines and the ``EmbodiedRolloutWorker`` (batched inference with weights from the actor)."""

from importlib.metadata import version as _version
from typing import Any

from ._config import EmbodiedRolloutConfig

__version__ = _version("rlinf-rollout")


def __getattr__(name: str) -> Any:
    # EmbodiedRolloutWorker pulls in Ray and torch: load it on first use so that `import rlinf_rollout` stays light.
    if name == "EmbodiedRolloutWorker":
        from ._worker import EmbodiedRolloutWorker

        return EmbodiedRolloutWorker
    raise AttributeError(f"module 'rlinf_rollout' has no attribute {name!r}")


__all__ = ["EmbodiedRolloutConfig", "EmbodiedRolloutWorker", "__version__"]
