"""Cross-node GPU send/recv over directed NCCL pair groups, on two simulated Ray nodes of one 2-GPU machine.

Skipped without 2 CUDA devices (this file holds only that test: it needs its own Ray cluster, separate from
the single-node Ray instance of ``test_sched_comm_cuda.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import cloudpickle
import pytest
import ray
import torch
from rlinf_scheduler import Cluster, PackedPlacementStrategy, Worker, WorkerGroup

cloudpickle.register_pickle_by_value(sys.modules[__name__])

BIG = 512 * 1024  # float32 elements: 2 MB, above the inline limit
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


class GpuPeer(Worker):
    def send_mixed(self, group: str, rank: int) -> float:
        g = torch.arange(BIG, device="cuda", dtype=torch.float32)
        self.send({"g": g, "c": torch.ones(BIG), "k": 7}, group, rank)
        g.fill_(-1.0)  # stream-ordered after the NCCL send: the receiver must not see it
        return float(torch.arange(BIG, dtype=torch.float64).sum())

    def recv_mixed(self, group: str, rank: int) -> tuple[str, str, int, float, float]:
        got = self.recv(group, rank, timeout=120)
        g, c = got["g"], got["c"]
        return g.device.type, c.device.type, got["k"], float(g.double().sum()), float(c.sum())

    def crossed(self, group: str, rank: int, n: int) -> list[float]:
        works = [self.isend(torch.full((BIG,), float(i), device="cuda"), group, rank) for i in range(n)]
        for w in works:
            w.wait(timeout=120)
        return [float(self.recv(group, rank, timeout=120)[0].cpu()) for _ in range(n)]

    def stats(self) -> dict[str, int]:
        return dict(self._comm().stats)


@pytest.fixture(scope="module")
def two_nodes_gpus() -> Iterator[tuple[WorkerGroup, WorkerGroup]]:
    from ray.cluster_utils import Cluster as RayTestCluster

    ray_cluster = RayTestCluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 2})
    try:
        ray_cluster.add_node(num_cpus=1, num_gpus=2)
        ray_cluster.wait_for_nodes()
        ray.init(address=ray_cluster.address, log_to_driver=False)
        try:
            with Cluster(num_nodes=2) as cluster:
                # Both simulated nodes are this machine: put the two workers on different physical GPUs.
                a = GpuPeer.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="xa")
                b = GpuPeer.create_group().launch(cluster, PackedPlacementStrategy(3, 3), name="xb")
                yield a, b
        finally:
            ray.shutdown()
    finally:
        ray_cluster.shutdown()


@pytest.mark.gpu
@pytest.mark.ray
@pytest.mark.multinode
@pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA devices")
def test_cross_node_cuda_tensors_use_nccl(two_nodes_gpus: tuple[WorkerGroup, WorkerGroup]) -> None:
    a, b = two_nodes_gpus
    recv = b.execute_on(0).recv_mixed("xa", 0)
    (expected,) = a.execute_on(0).send_mixed("xb", 0).wait(timeout=180)
    assert recv.wait(timeout=180) == [("cuda", "cpu", 7, expected, float(BIG))]
    stats = a.execute_on(0).stats().wait(timeout=30)[0]
    assert stats["nccl"] >= 1 and stats["gloo"] >= 1  # the CPU tensor still crosses over gloo
    left = a.execute_on(0).crossed("xb", 0, 3)
    right = b.execute_on(0).crossed("xa", 0, 3)
    assert left.wait(timeout=180) == [[0.0, 1.0, 2.0]]
    assert right.wait(timeout=180) == [[0.0, 1.0, 2.0]]
