"""The weight-sync protocol (``rlinf_core.protocols``): who broadcasts, to whom, and what arrives."""

from __future__ import annotations

import queue
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from rlinf_core.protocols import (
    WeightMessage,
    publish_weights,
    receive_weights,
    send_weights,
    take_newest_weights,
)


class FakePeer:
    """Records ``broadcast`` calls; answers the receiver with ``reply``."""

    def __init__(self, group: str, rank: int, world_size: int, reply: Any = None, peers: int = 3) -> None:
        self.group_name, self.rank, self.world_size = group, rank, world_size
        self.reply, self.peers = reply, peers
        self.calls: list[tuple[Any, list[tuple[str, Any]], tuple[str, int], float | None]] = []

    def group_world_size(self, group_name: str, timeout: float = 60.0) -> int:
        return self.peers

    def broadcast(
        self,
        obj: Any,
        groups: Sequence[tuple[str, int | Iterable[int]]],
        src: tuple[str, int],
        *,
        timeout: float | None = None,
    ) -> Any:
        self.calls.append((obj, list(groups), src, timeout))
        return obj if obj is not None else self.reply


def test_actor_rank_zero_broadcasts_to_every_rollout_rank() -> None:
    actor = FakePeer("actor", 0, 2)
    send_weights(actor, "rollout", {"w": 1}, 4, timeout=9.0)
    assert actor.calls == [
        ({"version": 4, "state_dict": {"w": 1}}, [("actor", 0), ("rollout", [0, 1, 2])], ("actor", 0), 9.0)
    ]
    explicit = FakePeer("actor", 0, 1)
    send_weights(explicit, "rollout", {}, 0, rollout_world_size=2)
    assert explicit.calls[0][1] == [("actor", 0), ("rollout", [0, 1])]


def test_other_actor_ranks_send_nothing() -> None:
    actor = FakePeer("actor", 1, 2)
    send_weights(actor, "rollout", {}, 1)
    assert actor.calls == []


def test_rollout_ranks_receive_the_message() -> None:
    rollout = FakePeer("rollout", 1, 2, reply={"version": 3, "state_dict": {"w": 2}})
    msg = receive_weights(rollout, "actor", timeout=5.0)
    assert msg == WeightMessage(version=3, state_dict={"w": 2})
    assert rollout.calls == [(None, [("actor", 0), ("rollout", [0, 1])], ("actor", 0), 5.0)]


@pytest.mark.parametrize("reply", [None, {"version": 1}, {"state_dict": {}}, {"version": 1, "state_dict": 3}])
def test_a_malformed_payload_is_refused(reply: Any) -> None:
    with pytest.raises(TypeError, match=r"weight sync from 'actor': expected \{'version': int"):
        receive_weights(FakePeer("rollout", 0, 1, reply=reply), "actor")


class FakeChannel:
    """A dict of FIFO queues standing in for ``rlinf_scheduler.Channel`` (``get`` never blocks here)."""

    name = "weights"

    def __init__(self) -> None:
        self.queues: dict[Any, list[Any]] = {}

    def put(
        self, item: Any, *, key: Any = "default", weight: float = 1, timeout: float | None = None
    ) -> None:
        self.queues.setdefault(key, []).append(item)

    def get_nowait(self, key: Any = "default") -> Any:
        if not self.queues.get(key):
            raise queue.Empty
        return self.queues[key].pop(0)

    def get(self, key: Any = "default", *, timeout: float | None = None) -> Any:
        return self.get_nowait(key)


def test_published_weights_reach_every_rollout_rank_and_the_newest_wins() -> None:
    channel = FakeChannel()
    publish_weights(channel, {"w": 1}, 1, 2)
    publish_weights(channel, {"w": 2}, 2, 2)
    assert take_newest_weights(channel, 0) == {"version": 2, "state_dict": {"w": 2}}
    assert take_newest_weights(channel, 0, held=2) is None  # nothing new
    assert take_newest_weights(channel, 1, min_version=2)["version"] == 2  # type: ignore[index]


def test_a_rollout_below_the_bound_waits_and_names_what_it_waits_for() -> None:
    channel = FakeChannel()
    publish_weights(channel, {"w": 1}, 1, 1)
    with pytest.raises(
        TimeoutError, match=r"rollout rank 0 .* 'weights' .* version >= 3 \(it holds version 1\)"
    ):
        take_newest_weights(channel, 0, min_version=3, held=0, timeout=0.1)
    channel.put({"oops": 1}, key=0)
    with pytest.raises(TypeError, match="expected"):
        take_newest_weights(channel, 0)
