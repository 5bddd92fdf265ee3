"""Channel: per-key FIFO queues with weights, back-pressure, nowait/async forms, used by driver and workers."""

from __future__ import annotations

import asyncio
import contextlib
import pickle
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
import ray
import torch
from rlinf_scheduler import DEFAULT_KEY, Channel, Cluster, Empty, Full, PackedPlacementStrategy, Worker

pytestmark = pytest.mark.ray

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BIG = 512 * 1024  # float32 elements: 2 MB, above the inline limit (shared-memory path)


class Producer(Worker):
    def produce(self, ch: Channel, n: int, key: str) -> None:
        for i in range(n):
            item = {"i": i, "t": torch.full((BIG,), float(i))} if i % 2 else {"i": i}
            ch.put(item, key=key, weight=1)

    def make_channel(self, name: str) -> Channel:
        ch = Channel.create(name, maxsize=4)
        ch.put("from-worker")
        return ch


class Consumer(Worker):
    def consume(self, ch: Channel, n: int, key: str) -> list[tuple[int, float]]:
        out = []
        for _ in range(n):
            item = ch.get(key=key, timeout=30)
            out.append((item["i"], float(item["t"][0]) if "t" in item else -1.0))
        return out

    def get_from(self, name: str) -> Any:
        return Channel.create(name).get(timeout=30)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with Cluster(num_nodes=1, simulated_accelerators_per_node=2) as c:
            yield c
    finally:
        ray.shutdown()


@pytest.fixture
def channel(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[Channel]:
    maxsize = getattr(request, "param", 0)
    ch = Channel.create(f"test-{request.node.name}", maxsize=maxsize)
    yield ch
    ch.shutdown()


def test_fifo_and_sizes(channel: Channel) -> None:
    assert channel.empty() and channel.qsize() == 0 and not channel.full()
    for i in range(5):
        channel.put(i)
    channel.put("x", key="other")
    assert channel.qsize() == 5 and channel.qsize("other") == 1 and channel.qsize(DEFAULT_KEY) == 5
    assert [channel.get(timeout=10) for _ in range(5)] == list(range(5))
    assert channel.get(key="other", timeout=10) == "x"
    assert channel.empty()


@pytest.mark.parametrize("channel", [2], indirect=True)
def test_back_pressure_full_and_empty(channel: Channel) -> None:
    assert channel.maxsize == 2
    channel.put_nowait("a")
    channel.put("b", timeout=1)
    assert channel.full()
    with pytest.raises(Full, match="queue full"):
        channel.put_nowait("c")
    start = time.monotonic()
    with pytest.raises(Full):
        channel.put("c", timeout=0.3)
    assert 0.25 < time.monotonic() - start < 5
    # A blocked put proceeds as soon as a get makes room, and keeps its place in line.
    done = threading.Event()
    t = threading.Thread(target=lambda: (channel.put("c", timeout=30), done.set()))
    t.start()
    time.sleep(0.2)
    assert not done.is_set()
    assert channel.get(timeout=10) == "a"
    assert done.wait(10)
    t.join(10)
    assert [channel.get(timeout=10), channel.get_nowait()] == ["b", "c"]
    with pytest.raises(Empty, match="nothing available"):
        channel.get_nowait()
    start = time.monotonic()
    with pytest.raises(Empty):
        channel.get(timeout=0.3)
    assert 0.25 < time.monotonic() - start < 5
    assert isinstance(Full(), __import__("queue").Full) and isinstance(Empty(), __import__("queue").Empty)


def test_a_get_on_one_key_never_blocks_another(channel: Channel) -> None:
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(channel.get(key="slow", timeout=30)))
    waiter.start()
    time.sleep(0.2)
    start = time.monotonic()
    for i in range(50):
        channel.put(i, key="fast")
        assert channel.get(key="fast", timeout=5) == i
    assert time.monotonic() - start < 10 and not got
    channel.put("late", key="slow")
    waiter.join(10)
    assert got == ["late"]


def test_get_batch_weights(channel: Channel) -> None:
    for name, w in [("a", 1), ("b", 2), ("c", 3), ("d", 2), ("e", 2)]:
        channel.put(name, weight=w)
    assert channel.get_batch(3, timeout=10) == ["a", "b"]  # 1 + 2 reaches 3
    assert channel.get_batch(4, timeout=10) == ["c"]  # 3 + 2 would overshoot 4: "d" stays
    with pytest.raises(Empty):  # 2 + 2 = 4 < 10 and nothing more arrives: nothing is taken
        channel.get_batch(10, timeout=0.3)
    assert channel.qsize() == 2
    with pytest.raises(ValueError, match=r"weighs 2\.0, more than target_weight=1\.0"):
        channel.get_batch(1, timeout=5)
    assert channel.get_batch_nowait(4) == ["d", "e"]
    with pytest.raises(Empty):
        channel.get_batch_nowait(1)


def test_get_batch_waits_until_the_target_is_reached(channel: Channel) -> None:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(channel.get_batch(3, timeout=30)))
    t.start()
    for i in range(3):
        time.sleep(0.05)
        channel.put(i, weight=1)
    t.join(30)
    assert out == [[0, 1, 2]]


def test_async_forms_keep_order(channel: Channel) -> None:
    async def main() -> tuple[list[Any], list[Any]]:
        coros = []
        for i in range(1000):
            coros.append(channel.put_async(i))
            coros.append(channel.get_async(timeout=30))
        results = await asyncio.gather(*coros)
        await channel.put_async("x", weight=2, key="k")
        await channel.put_async("y", weight=1, key="k")
        batch = await channel.get_batch_async(3, key="k", timeout=30)
        return results[1::2], batch

    gets, batch = asyncio.run(main())
    assert gets == list(range(1000))
    assert batch == ["x", "y"]


def test_cancelled_get_async_leaves_the_channel_usable(channel: Channel) -> None:
    async def main() -> list[Any]:
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(channel.get_async(), 0.2)
        # The withdrawn get must not swallow the next item, and the process's reader must still answer.
        await channel.put_async("after")
        return [await channel.get_async(timeout=5), channel.qsize()]

    assert asyncio.run(main()) == ["after", 0]
    channel.put({"t": torch.ones(BIG)}, timeout=5)  # sync calls from the same process still get answers
    assert float(channel.get(timeout=5)["t"].sum()) == BIG


def test_cancelling_gets_at_any_moment_loses_no_item(channel: Channel) -> None:
    n = 60

    async def main() -> list[int]:
        got: list[int] = []
        for i in range(n):
            task = asyncio.ensure_future(channel.get_async(key="race"))
            await asyncio.sleep(0.001 * (i % 4))
            await channel.put_async(i, key="race")
            await asyncio.sleep(0.0005 * (i % 3))
            task.cancel()  # lands before, during or after the answer
            with contextlib.suppress(asyncio.CancelledError):
                got.append(await task)
        await asyncio.sleep(0.5)  # items given back by withdrawn gets reach the queue
        while channel.qsize(key="race"):
            got.append(channel.get_nowait(key="race"))
        return got

    assert sorted(asyncio.run(main())) == list(range(n))


@pytest.mark.parametrize("channel", [1], indirect=True)
def test_cancelled_put_async_is_withdrawn(channel: Channel) -> None:
    async def main() -> list[Any]:
        await channel.put_async("first")
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(channel.put_async("withdrawn"), 0.2)
        first = await channel.get_async(timeout=5)
        await channel.put_async("second", timeout=5)  # the withdrawn put no longer holds the slot
        return [first, await channel.get_async(timeout=5), channel.qsize()]

    assert asyncio.run(main()) == ["first", "second", 0]


def test_rlinf_positional_put_fails_loudly(channel: Channel) -> None:
    # RLinf spells put(item, weight, key); here key and weight are keyword-only, never silently swapped.
    with pytest.raises(TypeError, match="positional argument"):
        channel.put("x", 3)  # type: ignore[misc]
    with pytest.raises(TypeError, match="positional argument"):
        channel.put_nowait("x", 3)  # type: ignore[misc]
    with pytest.raises(TypeError, match="async_op"):
        channel.put("x", async_op=True)  # type: ignore[call-arg]
    assert channel.qsize() == 0 and channel.qsize(key=3) == 0


def test_create_existing_name_connects(cluster: Cluster) -> None:
    first = Channel.create("shared-name", maxsize=3)
    try:
        second = Channel.create("shared-name", maxsize=7)
        assert second.maxsize == 3
        first.put({"v": torch.arange(3)})
        assert torch.equal(second.get(timeout=10)["v"], torch.arange(3))
        clone = pickle.loads(cloudpickle.dumps(first))
        clone.put(5)
        assert first.get(timeout=10) == 5
    finally:
        first.shutdown()


def test_producer_worker_to_consumer_worker(cluster: Cluster, channel: Channel) -> None:
    prod = Producer.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="chp")
    cons = Consumer.create_group().launch(cluster, PackedPlacementStrategy(1, 1), name="chc")
    try:
        n = 20
        got = cons.consume(channel, n, "k")
        prod.produce(channel, n, "k").wait(timeout=120)
        assert got.wait(timeout=120) == [[(i, float(i) if i % 2 else -1.0) for i in range(n)]]
        # A channel created inside a worker is reachable by name from the driver and other workers.
        (made,) = prod.make_channel("made-in-worker").wait(timeout=60)
        try:
            assert made.maxsize == 4
            assert cons.get_from("made-in-worker").wait(timeout=60) == ["from-worker"]
        finally:
            made.shutdown()
    finally:
        prod.shutdown()
        cons.shutdown()


def test_large_items_are_not_copied_through_the_actor(channel: Channel) -> None:
    t = torch.randn(BIG)
    channel.put({"t": t})
    got = channel.get(timeout=30)["t"]
    assert torch.equal(got, t)
    got += 1  # a private, writable tensor
    assert not torch.equal(got, t)


def test_shutdown_fails_pending_and_later_calls(cluster: Cluster) -> None:
    ch = Channel.create("doomed")
    errors: list[BaseException] = []

    def blocked() -> None:
        try:
            ch.get(timeout=60)
        except RuntimeError as e:
            errors.append(e)

    t = threading.Thread(target=blocked)
    t.start()
    time.sleep(0.2)
    ch.shutdown()
    t.join(30)
    assert len(errors) == 1 and "shut down" in str(errors[0])
    with pytest.raises(RuntimeError, match="'doomed' is shut down"):
        ch.put(1)


def test_arguments_are_checked(channel: Channel) -> None:
    with pytest.raises(ValueError, match="maxsize must be an int >= 0, got -1"):
        Channel.create("bad", maxsize=-1)
    with pytest.raises(ValueError, match="name must be a non-empty str, got ''"):
        Channel.create("")
    with pytest.raises(ValueError, match="weight must be a number >= 0, got -1"):
        channel.put(1, weight=-1)
    with pytest.raises(TypeError, match=r"key must be hashable, got \[1\]"):
        channel.put(1, key=[1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="target_weight must be a number > 0, got 0"):
        channel.get_batch(0)
    with pytest.raises(ValueError, match="timeout must be None or a number >= 0, got -1"):
        channel.get(timeout=-1)
