"""Startup: Cluster + two one-worker groups ready, vs plain ``ray.init`` + two bare actors ready.

Run: RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/scheduler_startup.py [--repeats 3]

Each measurement runs in a fresh Python process (so Ray really starts), alternating the two variants. The
clock starts after imports, right before ``ray.init`` / ``Cluster(...)``, and stops when both workers answered
a first call. Target (issue 3): ours is no slower than the baseline by more than 3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("baseline", "rlinf")


def _baseline() -> dict[str, float]:
    import ray

    @ray.remote
    class Bare:
        def ping(self) -> str:
            return "pong"

    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    t1 = time.perf_counter()
    actors = [Bare.remote(), Bare.remote()]
    ray.get([a.ping.remote() for a in actors], timeout=300)
    t2 = time.perf_counter()
    ray.shutdown()
    return {"start": t1 - t0, "workers": t2 - t1, "total": t2 - t0}


def _rlinf() -> dict[str, float]:
    from rlinf_scheduler import Cluster, NodePlacementStrategy, Worker

    class Pinger(Worker):
        def ping(self) -> str:
            return "pong"

    t0 = time.perf_counter()
    cluster = Cluster(num_nodes=1, ray_address="local", num_cpus=2)
    t1 = time.perf_counter()
    a = Pinger.create_group().launch(cluster, NodePlacementStrategy([0]), name="a")
    b = Pinger.create_group().launch(cluster, NodePlacementStrategy([0]), name="b")
    a.ping().wait(timeout=300)
    b.ping().wait(timeout=300)
    t2 = time.perf_counter()
    cluster.shutdown()
    return {"start": t1 - t0, "workers": t2 - t1, "total": t2 - t0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = _baseline() if args.child == "baseline" else _rlinf()
        print("RESULT " + json.dumps(result), flush=True)
        return

    env = dict(os.environ, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    for _ in range(args.repeats):
        for variant in VARIANTS:
            out = subprocess.run(
                [sys.executable, __file__, "--child", variant],
                capture_output=True,
                text=True,
                env=env,
                timeout=600,
                check=True,
            ).stdout
            line = next(line for line in out.splitlines() if line.startswith("RESULT "))
            runs[variant].append(json.loads(line.removeprefix("RESULT ")))

    print(f"{'variant':40s} {'start s':>8s} {'workers s':>10s} {'total s':>8s}   (medians of {args.repeats})")
    med: dict[str, float] = {}
    for variant, label in zip(
        VARIANTS, ("ray.init + 2 bare actors (baseline)", "Cluster + 2 one-worker groups"), strict=True
    ):
        values = runs[variant]
        row = {k: statistics.median(r[k] for r in values) for k in ("start", "workers", "total")}
        med[variant] = row["total"]
        print(f"{label:40s} {row['start']:8.2f} {row['workers']:10.2f} {row['total']:8.2f}")
    print(f"difference: {med['rlinf'] - med['baseline']:+.2f} s (target: <= +3 s)")


if __name__ == "__main__":
    main()
