"""rlinf_envs: see the package README."""

from importlib.metadata import version as _version

__version__ = _version("rlinf-envs")

__all__ = ["__version__"]
