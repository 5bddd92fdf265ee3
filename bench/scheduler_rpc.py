"""Group-call latency: a small-object method call on a one-worker group vs a bare Ray actor call.

Run: RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/scheduler_rpc.py [--calls 200 --rounds 40]

All cases run in the same Ray instance, interleaved in short blocks (so that load from other processes hits
them alike); each figure is the median over blocks of the mean round-trip time per call (submit + wait for the
result) from the driver.
Target (issue 3): group call <= 1.3x the bare Ray actor call.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import ray
from rlinf_scheduler import Cluster, NodePlacementStrategy, Worker

PAYLOAD = {"step": 3, "ids": [1, 2, 3, 4], "name": "obs"}


class EchoWorker(Worker):
    def echo(self, x: Any) -> Any:
        return x


@ray.remote
class BareActor:
    def echo(self, x: Any) -> Any:
        return x


def per_call_ms(fn: Any, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=200, help="calls per block")
    parser.add_argument("--rounds", type=int, default=40, help="blocks per case")
    args = parser.parse_args()

    with Cluster(num_nodes=1, ray_address="local", num_cpus=2) as cluster:
        bare = BareActor.remote()
        bare_threaded = BareActor.options(max_concurrency=32).remote()
        group = EchoWorker.create_group().launch(cluster, NodePlacementStrategy([0]), name="echo")
        group.wait_ready(timeout=120)
        ray.get([bare.__ray_ready__.remote(), bare_threaded.__ray_ready__.remote()], timeout=120)

        cases = {
            "bare Ray actor (baseline)": lambda: ray.get(bare.echo.remote(PAYLOAD), timeout=60),
            "bare Ray actor, max_concurrency=32": lambda: ray.get(
                bare_threaded.echo.remote(PAYLOAD), timeout=60
            ),
            "group.echo(x).wait()": lambda: group.echo(PAYLOAD).wait(timeout=60),
        }
        for fn in cases.values():  # warm up
            per_call_ms(fn, 200)
        results: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.rounds):
            for name, fn in cases.items():
                results[name].append(per_call_ms(fn, args.calls))

    base = statistics.median(results["bare Ray actor (baseline)"])
    print(f"{'case':40s} {'ms/call (median)':>18s} {'vs baseline':>12s}")
    for name, values in results.items():
        med = statistics.median(values)
        print(f"{name:40s} {med:18.3f} {med / base:11.2f}x")


if __name__ == "__main__":
    main()
