"""rlinf_scheduler: see the package README."""

from importlib.metadata import version as _version

from ._channel import DEFAULT_KEY, Channel, Empty, Full
from ._cluster import Cluster, NodeInfo
from ._comm import CommMixin, Work
from ._component_placement import (
    ComponentPlacement,
    HybridComponentPlacement,
    ModelParallelComponentPlacement,
    PlacementMode,
    resolve_placement,
)
from ._config import ClusterConfig, NodeEnvConfig, NodeGroupConfig
from ._errors import SchedulerTimeoutError, WorkerFailedError, WorkerFailure
from ._group import GroupCall, GroupLauncher, RoleCall, RoleGroup, WorkerGroup
from ._placement import (
    ClusterView,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Placement,
    PlacementStrategy,
    StaticClusterView,
)
from ._sharding import peer_slices, shard_bounds
from ._worker import Worker, WorkerContext, timed

__version__ = _version("rlinf-scheduler")

__all__ = [
    "DEFAULT_KEY",
    "Channel",
    "Cluster",
    "ClusterConfig",
    "ClusterView",
    "CommMixin",
    "ComponentPlacement",
    "Empty",
    "FlexiblePlacementStrategy",
    "Full",
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
    "RoleCall",
    "RoleGroup",
    "SchedulerTimeoutError",
    "StaticClusterView",
    "Work",
    "Worker",
    "WorkerContext",
    "WorkerFailedError",
    "WorkerFailure",
    "WorkerGroup",
    "__version__",
    "peer_slices",
    "resolve_placement",
    "shard_bounds",
    "timed",
]
