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

Asynchronous runs publish instead (:func:`publish_weights`, :func:`take_newest_weights`): actor rank 0 puts one
message per rollout rank on a channel and returns at once; each rollout rank takes the newest message waiting
under its rank when it is ready for it (between two inference calls), so neither side waits for the other
unless the rollout needs a version it does not have yet (``min_version``).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, TypedDict

__all__ = [
    "WeightChannel",
    "WeightMessage",
    "WeightSyncPeer",
    "publish_weights",
    "receive_weights",
    "send_weights",
    "take_newest_weights",
]


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
    return _checked(msg, actor_group)


class WeightChannel(Protocol):
    """The part of ``rlinf_scheduler.Channel`` the published weights use (its ``Empty`` is a ``queue.Empty``)."""

    @property
    def name(self) -> str: ...

    def put(self, item: Any, *, key: Any = ..., weight: float = ..., timeout: float | None = ...) -> None: ...

    def get(self, key: Any = ..., *, timeout: float | None = ...) -> Any: ...

    def get_nowait(self, key: Any = ...) -> Any: ...


def publish_weights(
    channel: WeightChannel,
    state_dict: Mapping[str, Any],
    version: int,
    rollout_world_size: int,
    *,
    timeout: float | None = None,
) -> None:
    """Actor side, asynchronous runs: put ``{"version", "state_dict"}`` under every rollout rank's key (``0..W-1``).

    Call it on actor rank 0 only; it returns once the messages are on the channel (the rollout ranks take
    them with :func:`take_newest_weights` when they are ready).

    Args:
        channel: the weights channel of the run.
        state_dict: the full state dict.
        version: the weights' version (completed updates).
        rollout_world_size: ranks of the rollout group.
        timeout: seconds to wait for room on a bounded channel.
    """
    message = WeightMessage(version=version, state_dict=state_dict)
    for rank in range(rollout_world_size):
        channel.put(message, key=rank, timeout=timeout)


def take_newest_weights(
    channel: WeightChannel, rank: int, *, min_version: int = -1, held: int = -1, timeout: float | None = None
) -> WeightMessage | None:
    """Rollout side, asynchronous runs: the newest message waiting under ``rank``, or ``None`` if there is none.

    Older messages waiting under the key are dropped. When the rollout ``held`` a version below
    ``min_version``, it waits (at most ``timeout`` seconds in all) until a message of at least that version
    arrives: this is how a producer that would exceed the staleness bound is held back.

    Raises:
        TimeoutError: no message of version ``>= min_version`` arrived within ``timeout``; the message names
            the channel, the rank, the version held and the version waited for.
    """
    newest: WeightMessage | None = None
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            msg = channel.get_nowait(key=rank)
        except queue.Empty:
            current = held if newest is None else newest["version"]
            if current >= min_version:
                return newest
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                msg = channel.get(key=rank, timeout=remaining)
            except queue.Empty:
                raise TimeoutError(
                    f"rollout rank {rank} waited {timeout:g} s on channel {channel.name!r} for weights of "
                    f"version >= {min_version} (it holds version {current})"
                ) from None
        newest = _checked(msg, channel.name)


def _checked(msg: Any, source: str) -> WeightMessage:
    if not isinstance(msg, Mapping) or not isinstance(msg.get("state_dict"), Mapping) or "version" not in msg:
        raise TypeError(
            f"weight sync from {source!r}: expected {{'version': int, 'state_dict': mapping}}, "
            f"got {type(msg).__name__}{sorted(msg) if isinstance(msg, Mapping) else ''}"
        )
    return WeightMessage(version=int(msg["version"]), state_dict=msg["state_dict"])
