"""rlinf_rollout: see the package README."""

from importlib.metadata import version as _version

__version__ = _version("rlinf-rollout")

__all__ = ["__version__"]
