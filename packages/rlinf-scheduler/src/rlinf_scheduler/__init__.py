"""rlinf_scheduler: see the package README."""

from importlib.metadata import version as _version

from ._component_placement import (
    ComponentPlacement,
    HybridComponentPlacement,
    ModelParallelComponentPlacement,
    PlacementMode,
    resolve_placement,
)
from ._config import ClusterConfig, NodeEnvConfig, NodeGroupConfig
from ._placement import (
    ClusterView,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Placement,
    PlacementStrategy,
    StaticClusterView,
)

__version__ = _version("rlinf-scheduler")

__all__ = [
    "ClusterConfig",
    "ClusterView",
    "ComponentPlacement",
    "FlexiblePlacementStrategy",
    "HybridComponentPlacement",
    "ModelParallelComponentPlacement",
    "NodeEnvConfig",
    "NodeGroupConfig",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementMode",
    "PlacementStrategy",
    "StaticClusterView",
    "__version__",
    "resolve_placement",
]
