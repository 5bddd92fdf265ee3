"""The reward worker (rule-based rewards from the rlinf-algos registry, e.g. the math verifier)."""

from ._worker import RewardConfig, RewardWorker, build_reward

__all__ = ["RewardConfig", "RewardWorker", "build_reward"]
