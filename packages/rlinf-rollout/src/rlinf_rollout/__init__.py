"""rlinf_rollout: rollout engines and the ``EmbodiedRolloutWorker`` (batched inference with weights from the actor)."""

from importlib.metadata import version as _version
from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._config import EmbodiedRolloutConfig

if TYPE_CHECKING:
    from ._worker import EmbodiedRolloutWorker

__version__ = _version("rlinf-rollout")

# EmbodiedRolloutWorker pulls in Ray and torch: loaded on first use so that `import rlinf_rollout` stays light.
__getattr__ = lazy_exports(__name__, {"EmbodiedRolloutWorker": "._worker"})


__all__ = ["EmbodiedRolloutConfig", "EmbodiedRolloutWorker", "__version__"]
