"""The reward registry: name → rule-based reward class (RLinf ``rewards/__init__.py``).

Built-ins are ``"math"`` (`rlinf_algos.rewards.math.MathReward`, needs the ``rlinf-algos[math]`` extra and
is imported on first lookup), ``"searchr1"`` (`SearchR1Reward`), ``"code"`` (`CodeReward`, sandboxed
execution of the response's program against its tests) and ``"vqa"`` (`VQAReward`, the ``<answer>`` of a
visual question against a multiple-choice or short reference). Lookups are case-insensitive, a taken
name cannot be re-registered with another class, and a miss lists the valid names.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar, cast, overload

from .._registry import Registry
from ._code import CodeReward
from ._searchr1 import SearchR1Reward
from ._vqa import VQAReward

__all__ = [
    "RewardRegistry",
    "get_reward_class",
    "get_rule_based_reward_class",
    "register_reward",
    "reward_registry",
]

C = TypeVar("C", bound=type[Any])


class _Lazy:
    """A built-in entry whose class lives in an optional backend module, imported on first lookup."""

    def __init__(self, module: str, attr: str) -> None:
        self.module = module
        self.attr = attr

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)

    def load(self) -> type[Any]:
        # The one place that picks an optional backend: import it only when the entry is used.
        return cast(type[Any], getattr(importlib.import_module(self.module), self.attr))

    def __repr__(self) -> str:
        return f"<lazy {self.module}.{self.attr}>"


class RewardRegistry(Registry[type[Any]]):
    """A `Registry` of reward classes whose built-ins may live behind an optional extra."""

    def get_fn(self, name: str) -> type[Any]:
        """Return the class registered under ``name`` (importing its backend module if needed).

        Raises:
            ValueError: naming the unknown entry and listing the valid ones.
            ImportError: when the entry's optional extra is not installed (the message names it).
        """
        entry: object = super().get_fn(name)
        if isinstance(entry, _Lazy):
            return entry.load()
        return cast(type[Any], entry)


reward_registry = RewardRegistry(
    "reward",
    {
        "math": cast(type[Any], _Lazy("rlinf_algos.rewards.math", "MathReward")),
        "searchr1": SearchR1Reward,
        "code": CodeReward,
        "vqa": VQAReward,
    },
)
"""The process-wide reward registry (built-ins: ``math``, ``searchr1``, ``code``, ``vqa``)."""


@overload
def register_reward(name: str) -> Callable[[C], C]: ...
@overload
def register_reward(name: str, reward_class: C) -> C: ...
def register_reward(name: str, reward_class: C | None = None) -> C | Callable[[C], C]:
    """Register a reward class under ``name`` (RLinf ``register_reward(name, cls)``, also usable as a decorator).

    The class is constructed by the caller (``cls(...)``) and must offer
    ``get_reward(responses: list[str], references: list[list[str]]) -> list[float]``.

    Args:
        name: registry key, stored lower-case.
        reward_class: the class; omit it to use ``@register_reward("name")`` as a decorator.

    Returns:
        ``reward_class`` unchanged (or the decorator).

    Raises:
        ValueError: if ``name`` is already taken by another class (built-ins included).
    """
    decorator = cast(Callable[[C], C], reward_registry.register(name))
    if reward_class is None:
        return decorator
    return decorator(reward_class)


def get_reward_class(name: str) -> type[Any]:
    """The reward class registered under ``name`` (case-insensitive).

    Raises:
        ValueError: unknown name (the message lists the valid names).
        ImportError: ``"math"`` without the ``rlinf-algos[math]`` extra.
    """
    return reward_registry.get_fn(name)


get_rule_based_reward_class = get_reward_class
"""RLinf's name for `get_reward_class`."""
