"""Finding the size of another worker group of the same run (for actor → rollout weight sync)."""

from __future__ import annotations

import ray

__all__ = ["count_group_workers"]


def count_group_workers(group_name: str, namespace: str | None) -> int:
    """Number of workers of group ``group_name``: its named Ray actors ``f"{group_name}:{rank}"``.

    Raises:
        ValueError: when the group has no worker in ``namespace``.
    """
    n = 0
    while True:
        try:
            ray.get_actor(f"{group_name}:{n}", namespace=namespace)
        except ValueError:
            break
        n += 1
    if n == 0:
        raise ValueError(
            f"sync_model_to_rollout: no worker group {group_name!r} in this run (no Ray actor "
            f"'{group_name}:0' in namespace {namespace!r})"
        )
    return n
