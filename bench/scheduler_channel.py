"""Channel throughput from a producer worker to a consumer worker, vs Ray's own queue in the same run.

Run: RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/scheduler_channel.py [--small 5000 --big 400 --rounds 3]

Two one-worker groups on one node: the producer ``put``s items one by one, the consumer ``get``s them one by
one (blocking forms). The consumer times from the first item to the last (steady state, both sides running).
Items: small ``{"i": i, "tag": "obs"}`` and 1 MB float32 tensors (the consumer reads one element of each).
Baseline: ``ray.util.queue.Queue`` (an actor-backed stdlib-like queue) with the same workers and items.
Targets (issue 3): >= 2,000 small items/s and >= 500 MB/s for 1 MB tensors. Median over ``--rounds``.

Cold start (``--cold 50``, the default): what the first step of a run pays. For each round, two new one-worker
groups (fresh processes) and a new ``Channel``; the consumer is already waiting in ``get`` when the producer
starts; the time runs from just before the producer's first ``put`` to the consumer's return of the last of
the first ``--cold`` 1 MB tensors (same-node wall clock), so it includes every first-use cost on the way
(peer lookups, connections, shared-memory segments). Target (issue 14): >= 500 MB/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import torch
from ray.util.queue import Queue
from rlinf_scheduler import Channel, Cluster, NodePlacementStrategy, Worker

MB1 = 256 * 1024  # float32 elements


def make_item(kind: str, i: int) -> Any:
    return {"i": i, "tag": "obs"} if kind == "small" else torch.full((MB1,), float(i))


class Producer(Worker):
    def produce(self, q: Any, kind: str, n: int) -> None:
        for i in range(n + 1):  # item 0 starts the consumer's clock
            q.put(make_item(kind, i))


class ColdProducer(Worker):
    def produce_timed(self, q: Any, n: int) -> float:
        """Put ``n`` 1 MB tensors; return the wall-clock time just before the first put."""
        items = [make_item("1 MB tensor", i) for i in range(n)]
        start = time.time()
        for item in items:
            q.put(item)
        return start


class ColdConsumer(Worker):
    def __init__(self) -> None:
        super().__init__()
        # Like every worker of a run that receives tensors, this one has torch loaded before the first item
        # (the class travels by value, so the bench module's own `import torch` does not run here).
        import torch  # noqa: F401

    def consume_timed(self, q: Any, n: int) -> float:
        """Get ``n`` items in order; return the wall-clock time the last one arrived."""
        for i in range(n):
            item = q.get(timeout=120)
            if int(item[0]) != i:
                raise RuntimeError(f"out of order: got {int(item[0])}, expected {i}")
        return time.time()


def cold_rate(cluster: Cluster, n: int, round_: int) -> float:
    """MB/s of the first ``n`` 1 MB tensors between two fresh workers through a fresh Channel."""
    where = NodePlacementStrategy([0])
    prod = ColdProducer.create_group().launch(cluster, where, name=f"cold_prod{round_}")
    cons = ColdConsumer.create_group().launch(cluster, where, name=f"cold_cons{round_}")
    prod.wait_ready(timeout=120)
    cons.wait_ready(timeout=120)
    ch = Channel.create(f"cold{round_}")
    end_call = cons.consume_timed(ch, n)
    time.sleep(0.5)  # the consumer is waiting in get()
    (start,) = prod.produce_timed(ch, n).wait(timeout=300)
    (end,) = end_call.wait(timeout=300)
    ch.shutdown()
    prod.shutdown()
    cons.shutdown()
    return n * MB1 * 4 / 1e6 / (end - start)


class Consumer(Worker):
    def consume(self, q: Any, kind: str, n: int) -> float:
        """Return items per second between the first and the last item."""
        q.get(timeout=120)
        start = time.perf_counter()
        for i in range(1, n + 1):
            item = q.get(timeout=120)
            value = item["i"] if kind == "small" else int(item[0])
            if value != i:
                raise RuntimeError(f"out of order: got {value}, expected {i}")
        return n / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--small", type=int, default=5000, help="small items per run")
    parser.add_argument("--big", type=int, default=400, help="1 MB tensors per run")
    parser.add_argument("--rounds", type=int, default=3, help="runs per case")
    parser.add_argument("--cold", type=int, default=50, help="1 MB tensors of the cold-start case (0: skip)")
    args = parser.parse_args()

    with Cluster(num_nodes=1, ray_address="local", num_cpus=2) as cluster:
        prod = Producer.create_group().launch(cluster, NodePlacementStrategy([0]), name="bench_prod")
        cons = Consumer.create_group().launch(cluster, NodePlacementStrategy([0]), name="bench_cons")
        prod.wait_ready(timeout=120)
        cons.wait_ready(timeout=120)
        queues = {"rlinf Channel": Channel.create("bench"), "ray.util.queue.Queue (baseline)": Queue()}
        results: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for kind, n in (("small", args.small), ("1 MB tensor", args.big)):
                for name, q in queues.items():
                    got = cons.consume(q, kind, n)
                    prod.produce(q, kind, n).wait(timeout=900)
                    (rate,) = got.wait(timeout=900)
                    results.setdefault((kind, name), []).append(rate)
        queues["rlinf Channel"].shutdown()
        cold = [cold_rate(cluster, args.cold, r) for r in range(args.rounds)] if args.cold else []

    print(f"{'items':12s} {'queue':34s} {'items/s':>10s} {'MB/s':>9s} {'vs baseline':>12s}")
    for kind in ("small", "1 MB tensor"):
        base = statistics.median(results[(kind, "ray.util.queue.Queue (baseline)")])
        for name in queues:
            rate = statistics.median(results[(kind, name)])
            mbs = f"{rate:9.0f}" if kind != "small" else f"{'-':>9s}"
            print(f"{kind:12s} {name:34s} {rate:10.0f} {mbs} {rate / base:11.1f}x")
    if cold:
        print(
            f"cold start, first {args.cold} x 1 MB through a fresh Channel between fresh workers: "
            f"{statistics.median(cold):.0f} MB/s (median; rounds: {', '.join(f'{c:.0f}' for c in cold)})"
        )


if __name__ == "__main__":
    main()
