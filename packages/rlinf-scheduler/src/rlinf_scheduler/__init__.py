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
from ._group import GroupCall, GroupLauncher, RoleCall, RoleGroup, RoleSubset, WorkerGroup
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
from ._trace import (
    COMPUTE,
    DRIVER,
    WAIT,
    GroupUsage,
    ProcessTrace,
    Span,
    Timeline,
    enable_tracing,
    load_trace,
    now_us,
    take_trace,
    trace_span,
    tracing_enabled,
)
from ._worker import Worker, WorkerContext, timed

__version__ = _version("rlinf-scheduler")

__all__ = [
    "COMPUTE",
    "DEFAULT_KEY",
    "DRIVER",
    "WAIT",
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
    "GroupUsage",
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
    "ProcessTrace",
    "RoleCall",
    "RoleGroup",
    "RoleSubset",
    "SchedulerTimeoutError",
    "Span",
    "StaticClusterView",
    "Timeline",
    "Work",
    "Worker",
    "WorkerContext",
    "WorkerFailedError",
    "WorkerFailure",
    "WorkerGroup",
    "__version__",
    "enable_tracing",
    "load_trace",
    "now_us",
    "peer_slices",
    "resolve_placement",
    "shard_bounds",
    "take_trace",
    "timed",
    "trace_span",
    "tracing_enabled",
]
