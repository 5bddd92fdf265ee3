"""rlinf_core: see the package README."""

from importlib.metadata import version as _version

from ._lazy import lazy_exports

__version__ = _version("rlinf-core")

__all__ = ["__version__", "lazy_exports"]
