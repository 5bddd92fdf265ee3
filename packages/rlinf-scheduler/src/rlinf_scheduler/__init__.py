"""rlinf_scheduler: see the package README."""

from importlib.metadata import version as _version

from ._cluster import Cluster, NodeInfo
from ._component_placement import (
    ComponentPlacement,
    HybridComponentPlacement,
    ModelParallelComponentPlacement,
    PlacementMode,
    resolve_placement,
)
from ._config import ClusterConfig, NodeEnvConfig, NodeGroupConfig
from ._errors import SchedulerTimeoutError, WorkerFailedError, WorkerFailure
from ._group import GroupCall, GroupLauncher, WorkerGroup
from ._placement import (
    ClusterView,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Placement,
    PlacementStrategy,
    StaticClusterView,
)
from ._worker import Worker, WorkerContext, timed

__version__ = _version("rlinf-scheduler")

__all__ = [
    "Cluster",
    "ClusterConfig",
    "ClusterView",
    "ComponentPlacement",
    "FlexiblePlacementStrategy",
    "GroupCall",
    "GroupLauncher",
    "HybridComponentPlacement",
    "ModelParallelComponentPlacement",
    "NodeEnvConfig",
    "NodeGroupConfig",
    "NodeInfo",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementMode",
    "PlacementStrategy",
    "SchedulerTimeoutError",
    "StaticClusterView",
    "Worker",
    "WorkerContext",
    "WorkerFailedError",
    "WorkerFailure",
    "WorkerGroup",
    "__version__",
    "resolve_placement",
    "timed",
]
