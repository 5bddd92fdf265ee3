"""Compose your own workers: a producer group feeds a consumer group; the consumers all-reduce with torch.

Run (CPU only, starts a local Ray instance):

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python packages/rlinf-scheduler/examples/compose_workers.py

Nothing here is RL: two worker classes, a cluster with 4 simulated accelerator slots, two groups placed on
disjoint slots, point-to-point messages between them, and ``torch.distributed`` inside one group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from rlinf_scheduler import Cluster, PackedPlacementStrategy, Worker, timed


class Producer(Worker):
    """Makes batches and sends each consumer its own stream (FIFO per sender/receiver pair)."""

    def __init__(self, batch_size: int) -> None:
        self.batch_size = batch_size

    @timed
    def produce(self, steps: int) -> int:
        """Send ``steps`` batches to the consumer of the same rank; returns how many were sent."""
        for step in range(steps):
            batch = torch.full((self.batch_size,), float(step + self.rank))
            self.send({"step": step, "x": batch}, "consumer", self.rank)
        self.log_info("sent %d batches", steps)
        return steps


class Consumer(Worker):
    """Receives batches from the producer of the same rank and sums them across the group with gloo."""

    def __init__(self) -> None:
        # RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set: no arguments needed.
        dist.init_process_group("gloo")

    def consume(self, steps: int) -> float:
        """Receive ``steps`` batches and return the sum of all values over the whole consumer group."""
        total = torch.zeros(())
        for _ in range(steps):
            msg = self.recv("producer", self.rank, timeout=60)
            total += msg["x"].sum()
        dist.all_reduce(total)
        return float(total)


def main() -> None:
    """Launch both groups, run them concurrently and check the totals."""
    # ray_address="local" always starts a private Ray instance; leave it out to attach to a running cluster
    # (`ray start --head` ...) when there is one and start a local instance otherwise.
    with Cluster(num_nodes=1, simulated_accelerators_per_node=4, ray_address="local") as cluster:
        producers = Producer.create_group(batch_size=3).launch(
            cluster, PackedPlacementStrategy(0, 1), name="producer"
        )
        consumers = Consumer.create_group().launch(cluster, PackedPlacementStrategy(2, 3), name="consumer")
        sent = producers.produce(5)  # returns at once; both groups now run concurrently
        totals = consumers.consume(5).wait(timeout=120)
        assert sent.wait(timeout=60) == [5, 5]
        # rank r sends batches of 3 values step + r for 5 steps: 3 * (10 + 5r); summed over r = 0, 1
        assert totals == [75.0, 75.0], totals
        timings = producers.pop_timings().wait(timeout=60)
        print(f"consumer totals {totals}; producer time/produce per rank {[t['produce'] for t in timings]}")


if __name__ == "__main__":
    main()
