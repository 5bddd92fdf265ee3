"""Name → function registries with the original RLinf extension API.

A registry holds a read-only mapping of built-in entries and a user overlay filled by ``register``. Lookups
are case-insensitive, registering a taken name with a different function is refused, and a miss lists the
valid names. Nothing registers itself on import: the built-ins are a literal passed at construction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Generic, TypeVar

__all__ = ["Registry"]

F = TypeVar("F", bound=Callable[..., object])


class Registry(Mapping[str, F], Generic[F]):
    """A case-insensitive registry of functions of one kind (advantage, policy loss, reward...).

    Args:
        kind: what the entries are, used in error messages (``"advantage"``).
        builtins: the entries shipped with rlinf_algos; they cannot be replaced.

    Example:
        >>> reg = Registry("advantage", {"zero": lambda **kw: (0, None)})
        >>> @reg.register("Mine")
        ... def mine(**kw):
        ...     return (1, None)
        >>> reg.get("MINE") is mine
        True
        >>> sorted(reg)
        ['mine', 'zero']
    """

    def __init__(self, kind: str, builtins: Mapping[str, F]) -> None:
        self.kind = kind
        self.builtins: Mapping[str, F] = MappingProxyType({k.lower(): v for k, v in builtins.items()})
        self._user: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator that registers a function under ``name`` (stored lower-case) and returns it unchanged.

        Raises:
            ValueError: if ``name`` is empty or already taken by a different function.
        """
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{self.kind} name must be a non-empty string, got {name!r}")
        key = name.strip().lower()

        def decorator(fn: F) -> F:
            existing = self.builtins.get(key, self._user.get(key))
            if existing is not None and existing is not fn:
                raise ValueError(
                    f"{self.kind} {key!r} is already registered to {_qualname(existing)}; "
                    f"pick another name (taken: {', '.join(sorted(self))})"
                )
            self._user[key] = fn
            return fn

        return decorator

    def unregister(self, name: str) -> None:
        """Remove a user-registered entry (built-ins cannot be removed)."""
        key = name.lower()
        if key in self.builtins:
            raise ValueError(f"built-in {self.kind} {key!r} cannot be unregistered")
        if key not in self._user:
            raise KeyError(self._miss(name))
        del self._user[key]

    def get_fn(self, name: str) -> F:
        """Return the function registered under ``name`` (case-insensitive).

        Raises:
            ValueError: naming the unknown entry and listing the valid ones.
        """
        if not isinstance(name, str):
            raise ValueError(self._miss(name))
        key = name.lower()
        fn = self.builtins.get(key, self._user.get(key))
        if fn is None:
            raise ValueError(self._miss(name))
        return fn

    def _miss(self, name: object) -> str:
        return f"unknown {self.kind} {name!r}; valid names: {', '.join(sorted(self))}"

    def __getitem__(self, name: str) -> F:
        try:
            return self.get_fn(name)
        except ValueError as e:
            raise KeyError(str(e)) from None

    def __iter__(self) -> Iterator[str]:
        yield from self.builtins
        yield from (k for k in self._user if k not in self.builtins)

    def __len__(self) -> int:
        return len(self.builtins) + sum(1 for k in self._user if k not in self.builtins)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name.lower() in self.builtins or name.lower() in self._user)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, names={sorted(self)})"


def _qualname(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
