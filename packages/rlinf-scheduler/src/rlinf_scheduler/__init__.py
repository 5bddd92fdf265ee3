"""rlinf_scheduler: see the package README."""

from importlib.metadata import version as _version

__version__ = _version("rlinf-scheduler")

__all__ = ["__version__"]
