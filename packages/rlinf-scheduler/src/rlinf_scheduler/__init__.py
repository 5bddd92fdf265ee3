"""rlinf_scheduler: see the package README."""

from importlib.metadata import version as _version

from ._config import ClusterConfig, NodeEnvConfig, NodeGroupConfig

__version__ = _version("rlinf-scheduler")

__all__ = ["ClusterConfig", "NodeEnvConfig", "NodeGroupConfig", "__version__"]
