"""Cross-node send/recv, broadcast and Channel on two simulated Ray nodes (ray.cluster_utils.Cluster)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
import ray
import torch
from ray.cluster_utils import Cluster as RayTestCluster
from rlinf_scheduler import Channel, Cluster, NodePlacementStrategy, Worker, WorkerGroup

pytestmark = [pytest.mark.ray, pytest.mark.multinode]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BIG = 512 * 1024  # float32 elements: 2 MB, above the inline limit


class NodePeer(Worker):
    def send_to(self, obj: Any, group: str, rank: int) -> None:
        self.send(obj, group, rank)

    def recv_sum(self, group: str, rank: int, n: int) -> list[float]:
        return [float(self.recv(group, rank, timeout=60)["t"].sum()) for _ in range(n)]

    def exchange(self, group: str, rank: int, n: int) -> list[float]:
        works = [self.isend({"t": torch.full((BIG,), float(self.rank + i))}, group, rank) for i in range(n)]
        for w in works:
            w.wait(timeout=60)
        return [float(self.recv(group, rank, timeout=60)["t"][0]) for _ in range(n)]

    def bcast(self, obj: Any, groups: list[tuple[str, Any]], src: tuple[str, int]) -> float:
        got = self.broadcast(obj, groups, src, timeout=60)
        return float(got.sum())

    def node_and_stats(self) -> tuple[int, dict[str, int]]:
        return self.node_rank, dict(self._comm().stats)

    def put_big(self, ch: Channel, n: int) -> None:
        for i in range(n):
            ch.put(torch.full((BIG,), float(i)))

    def get_big(self, ch: Channel, n: int) -> list[float]:
        return [float(ch.get(timeout=60)[0]) for _ in range(n)]


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[tuple[WorkerGroup, WorkerGroup]]:
    ray_cluster = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 1})
    try:
        ray_cluster.add_node(num_cpus=1)
        ray_cluster.wait_for_nodes()
        ray.init(address=ray_cluster.address, log_to_driver=False)
        try:
            with Cluster(num_nodes=2) as cluster:
                a = NodePeer.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="na")
                b = NodePeer.create_group().launch(cluster, NodePlacementStrategy([1, 1]), name="nb")
                yield a, b
        finally:
            ray.shutdown()
    finally:
        ray_cluster.shutdown()


def test_workers_are_on_two_nodes(two_nodes: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = two_nodes
    assert [n for n, _ in a.node_and_stats().wait(timeout=60)] == [0, 0]
    assert [n for n, _ in b.node_and_stats().wait(timeout=60)] == [1, 1]


def test_cross_node_send_recv_uses_gloo(two_nodes: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = two_nodes
    n = 4
    recv = b.execute_on(0).recv_sum("na", 0, n)
    for i in range(n):
        a.execute_on(0).send_to({"t": torch.full((BIG,), float(i))}, "nb", 0).wait(timeout=120)
    assert recv.wait(timeout=120) == [[float(i * BIG) for i in range(n)]]
    (_, stats) = a.execute_on(0).node_and_stats().wait(timeout=30)[0]
    assert stats["gloo"] >= n
    # Small payloads ride inline in the control frame, across nodes too.
    recv = b.execute_on(0).recv_sum("na", 0, 1)
    a.execute_on(0).send_to({"t": torch.ones(3)}, "nb", 0).wait(timeout=60)
    assert recv.wait(timeout=60) == [[3.0]]


def test_cross_node_crossed_sends(two_nodes: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = two_nodes
    n = 3
    left = a.execute_on(1).exchange("nb", 0, n)
    right = b.execute_on(0).exchange("na", 1, n)
    assert left.wait(timeout=120) == [[float(i) for i in range(n)]]  # nb rank 0 sends 0 + i
    assert right.wait(timeout=120) == [[float(1 + i) for i in range(n)]]  # na rank 1 sends 1 + i


def test_broadcast_across_nodes_crosses_each_node_once(two_nodes: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = two_nodes
    obj = torch.arange(BIG, dtype=torch.float32)
    spec = [("na", [0, 1]), ("nb", [0, 1])]
    (_, src_before), _ = a.node_and_stats().wait(timeout=30)
    (_, lead_before), _ = b.node_and_stats().wait(timeout=30)
    calls = [
        a.execute_on(0).bcast(obj, spec, ("na", 0)),
        a.execute_on(1).bcast(None, spec, ("na", 0)),
        b.bcast(None, list(reversed(spec)), ("na", 0)),
    ]
    expected = float(obj.sum())
    assert [c.wait(timeout=120) for c in calls] == [[expected], [expected], [expected, expected]]
    (_, src_after), _ = a.node_and_stats().wait(timeout=30)
    (_, lead_after), _ = b.node_and_stats().wait(timeout=30)
    # na:0 -> na:1 in shared memory and one gloo transfer to node 1, where nb:0 relays to nb:1.
    assert src_after["shm"] - src_before["shm"] == 1
    assert src_after["gloo"] - src_before["gloo"] == 1
    assert lead_after["shm"] - lead_before["shm"] == 1


def test_channel_across_nodes(two_nodes: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = two_nodes
    ch = Channel.create("cross-node")
    try:
        got = b.execute_on(0).get_big(ch, 3)
        a.execute_on(0).put_big(ch, 3).wait(timeout=120)
        assert got.wait(timeout=120) == [[0.0, 1.0, 2.0]]
    finally:
        ch.shutdown()
