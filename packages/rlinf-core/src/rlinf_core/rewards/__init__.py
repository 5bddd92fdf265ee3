"""The reward worker and the process pool of the math verifier.

- `RewardWorker` / `RewardConfig` / `build_reward`: rule-based rewards from the rlinf-algos registry, one
  reward object per rank (the worker pulls in Ray and loads on first use).
- `MathVerifier`: math-verify (`rlinf_algos.rewards.math.verify_math_answer`) in a pool of worker processes
  with a hard per-sample timeout; `math_verify_call` is RLinf's function over a process-wide pool. The
  workers need the ``rlinf-core[math]`` extra.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ._math_verifier import MathVerifier, math_verify_call

if TYPE_CHECKING:
    from ._worker import RewardConfig, RewardWorker, build_reward

__all__ = ["MathVerifier", "RewardConfig", "RewardWorker", "build_reward", "math_verify_call"]

# The worker pulls in Ray (through rlinf_scheduler); the pool's worker processes import this package, so it
# stays light.
__getattr__ = lazy_exports(
    __name__, {"RewardConfig": "._worker", "RewardWorker": "._worker", "build_reward": "._worker"}
)
