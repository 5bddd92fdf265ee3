"""rlinf_core: see the package README."""

from importlib.metadata import version as _version

__version__ = _version("rlinf-core")

__all__ = ["__version__"]
