"""The seed of each env of a vectorised env at ``reset``: envs of a group share one (same task, same start)."""

from __future__ import annotations

import numpy as np

__all__ = ["env_seeds"]


def env_seeds(seed: int | None, num_envs: int, group_size: int) -> list[int]:
    """Env ``i``'s seed: ``seed + i // group_size``; without a seed, one fresh random seed per group."""
    n_groups = num_envs // group_size
    group_seeds = (
        [seed + g for g in range(n_groups)]
        if seed is not None
        else [int(s) for s in np.random.default_rng().integers(0, 2**31 - 1, n_groups)]
    )
    return [group_seeds[i // group_size] for i in range(num_envs)]
