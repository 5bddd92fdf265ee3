"""Several Ray nodes on this machine (ray.cluster_utils.Cluster): node ranks, net devices, node groups, gloo."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import cloudpickle
import pytest
import ray
from ray.cluster_utils import Cluster as RayTestCluster
from rlinf_scheduler import (
    Cluster,
    ClusterConfig,
    NodeGroupConfig,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Worker,
)

pytestmark = [pytest.mark.ray, pytest.mark.multinode]

cloudpickle.register_pickle_by_value(sys.modules[__name__])

# The head node gets rank 1 and the added node rank 0, so that ordering by RLINF_NODE_RANK is visible
# (without it the head would come first).
HEAD_ENV = {"RLINF_NODE_RANK": "1", "RLINF_COMM_NET_DEVICES": "lo"}
OTHER_ENV = {"RLINF_NODE_RANK": "0"}


@pytest.fixture(scope="module")
def ray_nodes() -> Iterator[RayTestCluster]:
    nodes = RayTestCluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "include_dashboard": False, "env_vars": HEAD_ENV},
    )
    try:
        nodes.add_node(num_cpus=1, env_vars=OTHER_ENV)
        ray.init(address=nodes.address, log_to_driver=False)
        try:
            yield nodes
        finally:
            ray.shutdown()
    finally:
        nodes.shutdown()


def _remove_node(nodes: RayTestCluster, node: Any) -> None:
    """Remove a node and wait until Ray no longer counts it as alive (the next test counts nodes)."""
    node_id = node.node_id
    nodes.remove_node(node)
    deadline = time.monotonic() + 60
    while any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, f"node {node_id} still alive 60 s after removal"
        time.sleep(0.2)


class Probe(Worker):
    def where(self) -> dict[str, Any]:
        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "node_rank": self.node_rank,
            "env": {
                k: os.environ.get(k)
                for k in (
                    "GLOO_SOCKET_IFNAME",
                    "NCCL_SOCKET_IFNAME",
                    "RLINF_TEST_GROUP",
                    "MASTER_ADDR",
                    "RANK",
                )
            },
        }

    def all_reduce(self, value: float) -> float:
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            t = torch.tensor([value])
            dist.all_reduce(t)
            return float(t.item())
        finally:
            dist.destroy_process_group()


def test_nodes_are_ranked_by_env_and_workers_pinned(ray_nodes: RayTestCluster) -> None:
    with Cluster(num_nodes=2, simulated_accelerators_per_node=1) as cluster:
        assert cluster.num_nodes == 2 and cluster.num_accelerators == 2
        assert not cluster.node(0).is_head and cluster.node(1).is_head
        assert dict(cluster.node(1).env_vars) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
        assert dict(cluster.node(0).env_vars) == {}
        group = Probe.create_group().launch(cluster, PackedPlacementStrategy(0, 1), name="probe")
        where = group.where().wait(timeout=120)
        assert [w["node_rank"] for w in where] == [0, 1]
        assert [w["node_id"] for w in where] == [cluster.node(0).node_id, cluster.node(1).node_id]
        assert where[0]["env"]["GLOO_SOCKET_IFNAME"] is None
        assert where[1]["env"]["GLOO_SOCKET_IFNAME"] == where[1]["env"]["NCCL_SOCKET_IFNAME"] == "lo"
        assert {w["env"]["MASTER_ADDR"] for w in where} == {cluster.node(0).ip}


def test_gloo_all_reduce_across_nodes(ray_nodes: RayTestCluster) -> None:
    pytest.importorskip("torch")
    with Cluster(num_nodes=2, simulated_accelerators_per_node=1) as cluster:
        group = Probe.create_group().launch(cluster, PackedPlacementStrategy(0, 1), name="dist")
        assert group.all_reduce(2.5).wait(timeout=120) == [5.0, 5.0]


def test_node_group_places_on_its_nodes_with_its_env(ray_nodes: RayTestCluster) -> None:
    config = ClusterConfig(
        num_nodes=2,
        node_groups=[
            NodeGroupConfig(label="second", node_ranks=[1], env_vars={"RLINF_TEST_GROUP": "second"})
        ],
    )
    with Cluster(config) as cluster:
        grouped = Probe.create_group().launch(
            cluster, NodePlacementStrategy([0], node_group="second"), name="g"
        )
        plain = Probe.create_group().launch(cluster, NodePlacementStrategy([0, 1]), name="p")
        (g,) = grouped.where().wait(timeout=120)
        assert g["node_rank"] == 1 and g["env"]["RLINF_TEST_GROUP"] == "second"
        p = plain.where().wait(timeout=120)
        assert [w["env"]["RLINF_TEST_GROUP"] for w in p] == [None, "second"]


def test_cluster_waits_for_a_node_that_joins_late(ray_nodes: RayTestCluster) -> None:
    result: dict[str, Any] = {}

    def build() -> None:
        try:
            result["cluster"] = Cluster(num_nodes=3, node_wait_timeout_s=90)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=build)
    thread.start()
    node = ray_nodes.add_node(num_cpus=1, env_vars={"RLINF_NODE_RANK": "2"})
    try:
        thread.join(timeout=120)
        assert not thread.is_alive(), "Cluster did not return after the third node joined"
        assert "error" not in result, result.get("error")
        cluster: Cluster = result["cluster"]
        try:
            assert cluster.num_nodes == 3 and [n.rank for n in cluster.nodes] == [0, 1, 2]
            assert cluster.node(1).is_head
        finally:
            cluster.shutdown()
    finally:
        _remove_node(ray_nodes, node)


def test_a_node_without_node_rank_among_ranked_nodes_is_an_error(ray_nodes: RayTestCluster) -> None:
    node = ray_nodes.add_node(num_cpus=1)
    try:
        with pytest.raises(ValueError, match=r"RLINF_NODE_RANK is set on 2 of 3 nodes"):
            Cluster(num_nodes=3, node_wait_timeout_s=60)
    finally:
        _remove_node(ray_nodes, node)
