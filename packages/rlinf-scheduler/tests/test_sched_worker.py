"""Worker groups on one local Ray node: launch, group calls, env vars, torch.distributed, logging, timers."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

import cloudpickle
import pytest
import ray
from rlinf_scheduler import (
    Cluster,
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    RoleGroup,
    SchedulerTimeoutError,
    StaticClusterView,
    Worker,
    WorkerContext,
    timed,
)

pytestmark = pytest.mark.ray

# Test modules are imported by path (--import-mode=importlib); ship their classes to Ray workers by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with Cluster(num_nodes=1, simulated_accelerators_per_node=4) as c:
            yield c
    finally:
        ray.shutdown()


class Echo(Worker):
    def __init__(self, tag: str, *, scale: int = 1) -> None:
        self.tag = tag
        self.scale = scale
        self._release = threading.Event()

    def identity(self) -> dict[str, Any]:
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"]
        keys += ["RLINF_VISIBLE_ACCELERATORS", "RLINF_ACCELERATOR_TYPE"]
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "group": self.group_name,
            "node_rank": self.node_rank,
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "namespace": self.namespace,
            "node_ip": self.node_ip,
            "accelerators": self.placement.local_accelerators,
            "env": {k: os.environ.get(k) for k in keys},
        }

    def scaled(self, x: int, *, plus: int = 0) -> tuple[str, int]:
        return self.tag, x * self.scale + self.rank + plus

    def block_until_released(self, timeout: float) -> bool:
        return self._release.wait(timeout)

    def release(self) -> None:
        self._release.set()

    def sleep(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds

    async def coro(self, x: int) -> int:
        await asyncio.sleep(0.01)
        return x + self.rank

    async def composed(self, x: int) -> list[int]:
        # RLinf's workers await their own coroutine methods (and gather them) inside a coroutine method.
        one = await self.coro(x)
        timed_too = await self.work_async()
        both = await asyncio.gather(self.coro(x + 1), self.coro(x + 2))
        return [one, *both, len(timed_too)]

    def sync_calls_async(self, x: int) -> int:
        return self.coro(x)  # type: ignore[return-value]  # a plain method may call a coroutine method

    @timed
    def work(self) -> None:
        time.sleep(0.05)

    @timed
    async def work_async(self) -> str:
        await asyncio.sleep(0.05)
        return "done"

    @timed(name="custom")
    def work_named(self) -> None:
        with self.timer("inner"):
            time.sleep(0.02)

    def _private(self) -> int:
        return 1

    def size_of(self, group_name: str) -> int | str:
        try:
            return self.group_world_size(group_name)
        except ValueError as e:  # returned, not raised: a raising method would end the run
            return str(e)


class SlowInit(Worker):
    def __init__(self, seconds: float) -> None:
        time.sleep(seconds)

    def ping(self) -> str:
        return "pong"


class TorchDist(Worker):
    def all_reduce(self, value: float) -> tuple[float, int, int]:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            t = torch.tensor([value])
            dist.all_reduce(t)
            return float(t.item()), dist.get_rank(), dist.get_world_size()
        finally:
            dist.destroy_process_group()


def test_group_call_results_in_rank_order_and_env(cluster: Cluster) -> None:
    group = Echo.create_group("a", scale=10).launch(cluster, PackedPlacementStrategy(0, 3), name="echo")
    try:
        assert group.world_size == 4 and group.name == "echo"
        assert group.scaled(2, plus=1).wait(timeout=60) == [("a", 21 + r) for r in range(4)]
        ids = group.identity().wait(timeout=30)
        assert [i["rank"] for i in ids] == [0, 1, 2, 3]
        assert {i["world_size"] for i in ids} == {4}
        assert {i["group"] for i in ids} == {"echo"}
        assert {i["namespace"] for i in ids} == {cluster.namespace}
        assert [i["accelerators"] for i in ids] == [(0,), (1,), (2,), (3,)]
        assert [i["local_rank"] for i in ids] == [0, 1, 2, 3]
        ports = {i["env"]["MASTER_PORT"] for i in ids}
        assert len(ports) == 1 and int(ports.pop()) > 0
        for i in ids:
            env = i["env"]
            assert env["RANK"] == str(i["rank"]) and env["WORLD_SIZE"] == "4"
            assert env["LOCAL_RANK"] == str(i["rank"]) and env["LOCAL_WORLD_SIZE"] == "4"
            assert env["MASTER_ADDR"] == cluster.node(0).ip == i["node_ip"]
            assert env["RLINF_VISIBLE_ACCELERATORS"] == str(i["rank"])
            assert env["RLINF_ACCELERATOR_TYPE"] == "cpu"
    finally:
        group.shutdown()


def test_group_world_size_of_another_group(cluster: Cluster) -> None:
    three = Echo.create_group("a").launch(cluster, PackedPlacementStrategy(0, 2), name="sized3")
    two = Echo.create_group("b").launch(cluster, PackedPlacementStrategy(0, 1), name="sized2")
    try:
        assert two.size_of("sized3").wait(timeout=60) == [3, 3]
        assert three.size_of("sized2").wait(timeout=60) == [2, 2, 2]
        assert three.size_of("sized3").wait(timeout=60) == [3, 3, 3]
        (missing,) = two.execute_on(0).size_of("absent").wait(timeout=60)
        assert "no worker group 'absent'" in missing
    finally:
        three.shutdown()
        two.shutdown()


def test_execute_on_and_await(cluster: Cluster) -> None:
    group = Echo.create_group("b").launch(cluster, PackedPlacementStrategy(0, 2), name="subset")
    try:
        assert group.execute_on(2, 0).scaled(5).wait(timeout=60) == [("b", 7), ("b", 5)]
        assert group.execute_on(1).call("scaled", 1).wait(timeout=30) == [("b", 2)]

        async def main() -> list[Any]:
            return await group.coro(3)

        assert asyncio.run(main()) == [3, 4, 5]
        with pytest.raises(ValueError, match=r"rank 3 is not in 0\.\.2"):
            group.execute_on(3)
    finally:
        group.shutdown()


def test_async_methods_compose(cluster: Cluster) -> None:
    group = Echo.create_group("a").launch(cluster, PackedPlacementStrategy(0, 1), name="composed")
    try:
        assert group.composed(10).wait(timeout=60) == [[10, 11, 12, 4], [11, 12, 13, 4]]
        assert group.sync_calls_async(5).wait(timeout=60) == [5, 6]
        assert group.pop_timings().wait(timeout=30)[0].keys() == {"work_async"}
    finally:
        group.shutdown()


class Scaler(Protocol):
    """A role protocol: the methods a driver calls, with the worker's signatures."""

    def scaled(self, x: int, *, plus: int = 0) -> tuple[str, int]: ...

    def missing(self) -> None: ...


def test_call_with_a_role_method(cluster: Cluster) -> None:
    group = Echo.create_group("r", scale=2).launch(cluster, PackedPlacementStrategy(0, 1), name="typed")
    try:
        role: RoleGroup[Scaler] = group  # a WorkerGroup is a RoleGroup of any role its class plays
        call = role.call(Scaler.scaled, 3, plus=1)
        assert call.wait(timeout=60) == [("r", 7), ("r", 8)]
        assert group.call(Echo.scaled, 1).wait(timeout=30) == [("r", 2), ("r", 3)]
        assert group.execute_on(1).call(Scaler.scaled, 0).wait(timeout=30) == [("r", 1)]
        assert group.call("scaled", 1).wait(timeout=30) == [("r", 2), ("r", 3)]  # the name form stays
        with pytest.raises(AttributeError, match=r"no public method 'missing'.*'scaled'"):
            role.call(Scaler.missing)
        with pytest.raises(TypeError, match="expected a method name or a method"):
            group.call(lambda self: None)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="expected a method name or a method"):
            group.call(3)  # type: ignore[call-overload]
    finally:
        group.shutdown()


def test_private_and_unknown_methods_are_not_exposed(cluster: Cluster) -> None:
    group = Echo.create_group("c").launch(cluster, NodePlacementStrategy([0]), name="private")
    try:
        with pytest.raises(AttributeError):
            group._private
        with pytest.raises(AttributeError, match=r"no public method 'nope'.*'scaled'"):
            group.nope()
        with pytest.raises(AttributeError, match="no public method '_private'"):
            group.call("_private")
    finally:
        group.shutdown()


def test_launch_returns_at_once_and_workers_are_named_actors(cluster: Cluster) -> None:
    start = time.monotonic()
    group = SlowInit.create_group(2.0).launch(cluster, NodePlacementStrategy([0, 0]), name="slow")
    try:
        assert time.monotonic() - start < 1.5
        group.wait_ready(timeout=60)
        assert time.monotonic() - start >= 2.0
        handle = ray.get_actor("slow:1", namespace=cluster.namespace)
        assert ray.get(handle.ping.remote(), timeout=30) == "pong"
        with pytest.raises(ValueError, match="already runs"):
            SlowInit.create_group(0.0).launch(cluster, NodePlacementStrategy([0]), name="slow")
    finally:
        group.shutdown()
    with pytest.raises(RuntimeError, match="was shut down"):
        group.ping()


def test_threaded_actor_runs_calls_concurrently(cluster: Cluster) -> None:
    group = Echo.create_group("d").launch(cluster, NodePlacementStrategy([0]), name="threaded")
    try:
        blocked = group.block_until_released(30.0)
        time.sleep(0.2)
        assert not blocked.done()
        group.release().wait(timeout=30)
        assert blocked.wait(timeout=30) == [True]
        # Coroutine methods do not turn the actor into a single-threaded asyncio actor.
        blocked = group.block_until_released(30.0)
        assert group.coro(1).wait(timeout=30) == [1]
        assert blocked.wait(timeout=30) == [True]
    finally:
        group.shutdown()


def test_wait_timeout_names_what_it_waited_for(cluster: Cluster) -> None:
    group = Echo.create_group("e").launch(cluster, NodePlacementStrategy([0, 0]), name="timeouts")
    try:
        group.wait_ready(timeout=60)
        with pytest.raises(SchedulerTimeoutError, match=r"timeouts\.sleep\(\) on rank\(s\) \[0, 1\]"):
            group.sleep(3.0).wait(timeout=0.3)
        with pytest.raises(SchedulerTimeoutError, match=r"timeouts\.sleep\(\) on rank\(s\) \[1\]"):
            group.execute_on(1).sleep(3.0).wait(timeout=0.3)

        async def main() -> None:
            await group.sleep(3.0).wait_async(timeout=0.3)

        with pytest.raises(SchedulerTimeoutError, match=r"timeouts\.sleep"):
            asyncio.run(main())
    finally:
        group.shutdown()


def test_timers_accumulate_and_pop(cluster: Cluster) -> None:
    group = Echo.create_group("f").launch(cluster, NodePlacementStrategy([0]), name="timers")
    try:
        group.work().wait(timeout=60)
        group.work().wait(timeout=30)
        group.work_named().wait(timeout=30)
        assert group.work_async().wait(timeout=30) == ["done"]
        (timings,) = group.pop_timings().wait(timeout=30)
        assert set(timings) == {"work", "custom", "inner", "work_async"}
        assert 0.05 <= timings["work_async"] < 1.0
        assert 0.1 <= timings["work"] < 1.0
        assert timings["custom"] >= timings["inner"] >= 0.02
        assert group.pop_timings().wait(timeout=30) == [{}]
    finally:
        group.shutdown()


def test_torch_distributed_gloo_all_reduce_inside_a_group(cluster: Cluster) -> None:
    pytest.importorskip("torch")
    group = TorchDist.create_group().launch(cluster, FlexiblePlacementStrategy([[0], [1]]), name="dist")
    try:
        assert group.all_reduce(1.5).wait(timeout=120) == [(3.0, 0, 2), (3.0, 1, 2)]
    finally:
        group.shutdown()


def test_log_methods_prefix_group_and_rank(caplog: pytest.LogCaptureFixture) -> None:
    placement = PackedPlacementStrategy(0, 1).get_placement(StaticClusterView(num_nodes=1, accelerators=2))[1]
    worker = Echo("x")
    worker._rlinf_context = WorkerContext(
        group_name="grp",
        rank=1,
        world_size=2,
        namespace="ns",
        placement=placement,
        node_ip="127.0.0.1",
        master_addr="127.0.0.1",
        env_vars={},
    )
    with caplog.at_level(logging.INFO, logger="rlinf_scheduler.worker"):
        worker.log_info("step %d", 3)
        worker.log_warning("careful")
        worker.log_error("bad")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "[grp:1] step 3"),
        ("WARNING", "[grp:1] careful"),
        ("ERROR", "[grp:1] bad"),
    ]


def test_worker_outside_a_group_explains_itself() -> None:
    with pytest.raises(RuntimeError, match="not running in a worker group"):
        _ = Echo("y").rank


def test_launch_argument_errors(cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="name: expected a non-empty string without ':'"):
        Echo.create_group("z").launch(cluster, NodePlacementStrategy([0]), name="a:b")
    with pytest.raises(ValueError, match="max_concurrency"):
        Echo.create_group("z").launch(cluster, NodePlacementStrategy([0]), name="mc", max_concurrency=4)
    with pytest.raises(TypeError, match="not a subclass"):
        Worker.create_group.__func__(int)  # type: ignore[attr-defined]
