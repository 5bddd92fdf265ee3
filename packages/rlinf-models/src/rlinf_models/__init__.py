"""rlinf_models: see the package README."""

from importlib.metadata import version as _version

__version__ = _version("rlinf-models")

__all__ = ["__version__"]
