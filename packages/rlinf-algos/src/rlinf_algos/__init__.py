"""rlinf_algos: see the package README."""

from importlib.metadata import version as _version

__version__ = _version("rlinf-algos")

__all__ = ["__version__"]
