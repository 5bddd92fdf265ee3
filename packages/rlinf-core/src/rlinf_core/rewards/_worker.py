"""The reward worker: scores decoded responses with a rule-based reward from the rlinf-algos registry."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from attrs import validators as v
from rlinf_algos.rewards import get_reward_class, reward_registry
from rlinf_scheduler import Worker, shard_bounds, timed

from ._math_verifier import MathVerifier

__all__ = ["RewardConfig", "RewardWorker", "build_reward"]


def _registered_reward(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if value not in reward_registry:
        raise ValueError(f"unknown {attr.name} {value!r}; allowed: {', '.join(sorted(reward_registry))}")


@attrs.frozen(kw_only=True)
class RewardConfig:
    """The reward (config ``reward``); key names follow RLinf's ``reward`` section."""

    reward_type: str = attrs.field(default="math", validator=_registered_reward)
    """Name in the rlinf-algos reward registry (``math``, ``searchr1`` or a registered one)."""
    reward_scale: float = 1.0
    """Multiplier of the math reward (RLinf ``reward_scale``)."""
    reward_min_val: float = -1.0
    """Math reward of a wrong or missing answer, before scaling."""
    reward_max_val: float = 1.0
    """Math reward of a correct answer, before scaling."""
    timeout_s: float = attrs.field(default=10.0, validator=v.gt(0.0))
    """Per-response verification budget of the math verifier (over budget counts as wrong)."""
    num_verify_workers: int = attrs.field(default=1, validator=v.ge(1))
    """Verifier processes per reward rank (math)."""
    correct_threshold: float | None = None
    """A response is counted correct (accuracy metrics) when its reward is at least this; ``null``: the
    math reward's ``reward_max_val * reward_scale``, else ``> 0``."""
    kwargs: Mapping[str, Any] = attrs.field(factory=dict)
    """Constructor arguments of a non-math reward class."""

    def __attrs_post_init__(self) -> None:
        if self.reward_type.lower() == "math" and self.reward_max_val <= self.reward_min_val:
            raise ValueError(
                f"reward_max_val ({self.reward_max_val}) must be greater than reward_min_val ({self.reward_min_val})"
            )

    def is_correct(self, reward: float) -> bool:
        """Whether ``reward`` counts as a correct answer (see :attr:`correct_threshold`)."""
        if self.correct_threshold is not None:
            return reward >= self.correct_threshold
        if self.reward_type.lower() == "math":
            return math.isclose(reward, self.reward_max_val * self.reward_scale) or (
                reward >= self.reward_max_val * self.reward_scale
            )
        return reward > 0.0


def build_reward(cfg: RewardConfig) -> Any:
    """Build the reward object of ``cfg`` (an object with ``get_reward(responses, references) -> list[float]``).

    ``math`` gets its own `MathVerifier` pool of ``num_verify_workers`` processes.

    Raises:
        ValueError: for an unknown ``reward_type`` (the message lists the registered names).
        ImportError: for ``math`` without the ``rlinf-algos[math]`` extra (``rlinf-core[math]``).
    """
    cls = get_reward_class(cfg.reward_type)
    if cfg.reward_type.lower() == "math":
        verifier = MathVerifier(cfg.num_verify_workers)
        return cls(
            scale=cfg.reward_scale,
            min_val=cfg.reward_min_val,
            max_val=cfg.reward_max_val,
            timeout_s=cfg.timeout_s,
            verifier=verifier,
        )
    return cls(**dict(cfg.kwargs))


class RewardWorker(Worker):
    """Scores responses against reference answers (one reward object per rank).

    Args:
        cfg: the ``reward`` config.
    """

    def __init__(self, cfg: RewardConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.reward = build_reward(cfg)

    def _share(self, n: int) -> tuple[int, int]:
        """``[start, stop)`` of this rank's contiguous share of ``n`` items (all of them outside a group)."""
        if self._rlinf_context is None:
            return 0, n
        return shard_bounds(n, self.rank, self.world_size)

    @timed(name="reward")
    def compute(
        self, responses: Sequence[str], references: Sequence[Sequence[str]], *, shard: bool = True
    ) -> dict[str, list[float] | list[bool]]:
        """Score this rank's contiguous share of ``responses`` against their accepted answers.

        A group call sends the same lists to every rank; concatenating the ranks' results in rank order gives
        one score per response. Pass ``shard=False`` to score everything on one rank.

        Args:
            responses: ``[B]`` decoded responses.
            references: ``[B]`` accepted answers of each response's prompt.
            shard: score only this rank's share.

        Returns:
            ``{"rewards": floats, "correct": bools}`` of the share.

        Raises:
            ValueError: if the lengths differ.
        """
        if len(responses) != len(references):
            raise ValueError(f"{len(responses)} responses but {len(references)} reference lists")
        start, stop = self._share(len(responses)) if shard else (0, len(responses))
        texts = list(responses[start:stop])
        if not texts:
            return {"rewards": [], "correct": []}
        refs = [list(r) for r in references[start:stop]]
        rewards = [float(r) for r in self.reward.get_reward(texts, refs)]
        return {"rewards": rewards, "correct": [self.cfg.is_correct(r) for r in rewards]}
