"""The weight-sync protocol between an actor group and a rollout group, written once.

After each update the actor sends its weights to every rollout rank: all actor ranks call the actor side
(gathering a full state dict is collective), and actor rank 0 sends ONE scheduler ``broadcast`` whose groups
are ``[(actor, 0), (rollout, all ranks)]``; every rollout rank makes the matching call and loads the state
dict. The payload is a :class:`WeightMessage`, a plain dict on the wire.

```python
# actor, every rank:                                 # rollout, every rank:
state = full_state_dict()  # {} off rank 0           msg = receive_weights(self, "actor", timeout=60)
send_weights(self, "rollout", state, version)         policy.load_state_dict(msg["state_dict"])
```
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypedDict

__all__ = ["WeightMessage", "WeightSyncPeer", "receive_weights", "send_weights"]


class WeightMessage(TypedDict):
    """What the actor broadcasts to the rollout ranks.

    Attributes:
        version: number of completed updates of the sending actor (0 = its initial weights).
        state_dict: the full (unsharded) CPU state dict, keyed as the receiving model expects.
    """

    version: int
    state_dict: Mapping[str, Any]


class WeightSyncPeer(Protocol):
    """The part of ``rlinf_scheduler.Worker`` the weight sync uses (a worker of either side)."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def group_name(self) -> str: ...

    def group_world_size(self, group_name: str, timeout: float = ...) -> int: ...

    def broadcast(
        self,
        obj: Any,
        groups: Sequence[tuple[str, int | Iterable[int]]],
        src: tuple[str, int],
        *,
        timeout: float | None = None,
    ) -> Any: ...


def send_weights(
    worker: WeightSyncPeer,
    rollout_group: str,
    state_dict: Mapping[str, Any],
    version: int,
    *,
    rollout_world_size: int | None = None,
    timeout: float | None = None,
) -> None:
    """Actor side: rank 0 broadcasts ``{"version", "state_dict"}`` to every rank of ``rollout_group``.

    Call it on every actor rank after gathering the state dict (other ranks return at once).

    Args:
        worker: the actor worker.
        rollout_group: name of the rollout worker group.
        state_dict: the full state dict (only rank 0's is sent).
        version: the weights' version.
        rollout_world_size: ranks of the rollout group (asked from the running group when ``None``).
        timeout: seconds to wait for the broadcast.
    """
    if worker.rank != 0:
        return
    ranks = rollout_world_size or worker.group_world_size(rollout_group)
    message = WeightMessage(version=version, state_dict=state_dict)
    worker.broadcast(
        message,
        groups=[(worker.group_name, 0), (rollout_group, list(range(ranks)))],
        src=(worker.group_name, 0),
        timeout=timeout,
    )


def receive_weights(
    worker: WeightSyncPeer, actor_group: str, *, timeout: float | None = None
) -> WeightMessage:
    """Rollout side: receive the message actor rank 0 of ``actor_group`` broadcasts; call it on every rank.

    Raises:
        TypeError: the payload is not a ``{"version": int, "state_dict": mapping}`` dict.
        TimeoutError: nothing arrived within ``timeout`` seconds.
    """
    groups: list[tuple[str, int | Iterable[int]]] = [
        (actor_group, 0),
        (worker.group_name, list(range(worker.world_size))),
    ]
    msg = worker.broadcast(None, groups, src=(actor_group, 0), timeout=timeout)
    if not isinstance(msg, Mapping) or not isinstance(msg.get("state_dict"), Mapping) or "version" not in msg:
        raise TypeError(
            f"weight sync from {actor_group!r}: expected {{'version': int, 'state_dict': mapping}}, "
            f"got {type(msg).__name__}{sorted(msg) if isinstance(msg, Mapping) else ''}"
        )
    return WeightMessage(version=int(msg["version"]), state_dict=msg["state_dict"])
