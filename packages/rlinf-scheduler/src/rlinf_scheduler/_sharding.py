"""Splitting a batch between the ranks of a group, and between two groups of different sizes."""

from __future__ import annotations

__all__ = ["peer_slices", "shard_bounds"]


def shard_bounds(num_items: int, rank: int, world_size: int) -> tuple[int, int]:
    """``[start, stop)`` of rank ``rank``'s contiguous share of ``num_items`` (sizes differ by at most one).

    Concatenating the shares of ranks ``0 .. world_size - 1`` gives back ``range(num_items)``.

    Example:
        >>> [shard_bounds(5, r, 2) for r in range(2)]
        [(0, 3), (3, 5)]
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1} (world_size {world_size})")
    base, extra = divmod(num_items, world_size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def peer_slices(total: int, rank: int, world_size: int, peer_world_size: int) -> list[tuple[int, int, int]]:
    """The peers whose contiguous slice of a ``total``-item batch overlaps this rank's slice.

    Both sides split the batch into equal contiguous slices (rank ``r`` of ``n`` owns
    ``[r * total / n, (r + 1) * total / n)``). The env ranks and the rollout ranks call this with their own and
    the other group's world size, so they agree on who sends which rows to whom.

    Args:
        total: items in the batch (divisible by both world sizes).
        rank: this rank.
        world_size: ranks on this side.
        peer_world_size: ranks on the other side.

    Returns:
        ``(peer_rank, lo, hi)`` in peer order, with ``[lo, hi)`` relative to this rank's own slice.

    Example:
        >>> peer_slices(8, 0, 1, 2)
        [(0, 0, 4), (1, 4, 8)]
        >>> peer_slices(8, 1, 2, 1)
        [(0, 0, 4)]
    """
    for name, n in (("world_size", world_size), ("peer_world_size", peer_world_size)):
        if n < 1 or total % n:
            raise ValueError(f"{name} ({n}) must be >= 1 and divide the batch size ({total})")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    mine = total // world_size
    theirs = total // peer_world_size
    lo, hi = rank * mine, (rank + 1) * mine
    out = []
    for peer in range(lo // theirs, (hi - 1) // theirs + 1):
        plo, phi = max(lo, peer * theirs), min(hi, (peer + 1) * theirs)
        out.append((peer, plo - lo, phi - lo))
    return out
