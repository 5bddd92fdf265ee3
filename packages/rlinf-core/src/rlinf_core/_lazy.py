"""`lazy_exports`: a package ``__getattr__`` that imports heavy public names on first use."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """Build a module-level ``__getattr__`` (PEP 562) that loads each name from its submodule on first use.

    Workers pull in Ray and torch, engines pull in transformers: a package lists them here instead of
    importing them at the top, so that ``import rlinf_x`` (configs, protocols) stays light. The first
    access imports the submodule and stores the value in the package, so later accesses are plain
    attribute lookups. Pair it with ``if TYPE_CHECKING:`` imports of the same names for type checkers.

    Args:
        package: the package's ``__name__``.
        exports: public name -> the submodule that defines it, relative to ``package`` (``"._worker"``)
            or absolute.

    Returns:
        The function to bind as the package's ``__getattr__``; it raises AttributeError for any other name.

    Example:
        >>> __getattr__ = lazy_exports("rlinf_envs", {"EnvWorker": "._worker"})  # in rlinf_envs/__init__.py
        >>> __getattr__("nope")
        Traceback (most recent call last):
        ...
        AttributeError: module 'rlinf_envs' has no attribute 'nope'
    """
    table = dict(exports)

    def __getattr__(name: str) -> Any:
        submodule = table.get(name)
        if submodule is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(submodule, package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
