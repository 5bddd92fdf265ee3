"""Round-trip latency of a small ``send``/``recv`` exchange between two workers, by receive mode.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/comm_roundtrip.py [--exchanges 2000] [--gap-ms 0 7]

Two workers on two simulated accelerators (one process each): the *env* side sends an observation-sized
message (16 x 39 float32, as a 16-env Meta-World state step) and waits for an action-sized reply, which the
other side sends as soon as the message arrives. ``--gap-ms`` adds busy work on the env side between exchanges
(a simulator step: the other side's core then idles that long). For each receive mode (the reader-thread path,
``RLINF_COMM_DIRECT_RECV=0``; the direct read without spinning, ``RLINF_COMM_SPIN_US=0``; the default) the
script starts its own Ray instance, since the variables are read when a worker process starts. Prints one JSON
line per (mode, gap) with the median and mean round trip and the median ``send`` call in microseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

MODES = {
    "reader_thread": {"RLINF_COMM_DIRECT_RECV": "0"},
    "direct_no_spin": {"RLINF_COMM_SPIN_US": "0"},
    "direct_default": {},
}


def run_mode(exchanges: int, gaps: list[float]) -> list[dict[str, float]]:
    import numpy as np
    from rlinf_scheduler import Cluster, PackedPlacementStrategy, Worker

    class Answer(Worker):
        def serve(self, n: int) -> int:
            rng = np.random.default_rng(0)
            for _ in range(n):
                msg = self.recv("env", 0, timeout=120)
                k = len(msg["obs"])
                self.send(
                    {
                        "stage": msg["stage"],
                        "actions": rng.uniform(-1, 1, (k, 1, 4)).astype(np.float32),
                        "values": np.zeros((k, 1), np.float32),
                    },
                    "env",
                    0,
                )
            return n

    class Env(Worker):
        def run(self, n: int, gap_s: float) -> tuple[list[float], list[float]]:
            msg = {"stage": 0, "obs": np.zeros((16, 39), np.float32), "new_episode": np.zeros(16, bool)}
            rtt, send = [], []
            for _ in range(n):
                end = time.perf_counter() + gap_s
                while time.perf_counter() < end:  # busy, like a simulator step
                    pass
                start = time.perf_counter()
                self.send(msg, "answer", 0)
                sent = time.perf_counter()
                self.recv("answer", 0, timeout=120)
                rtt.append(time.perf_counter() - start)
                send.append(sent - start)
            return rtt, send

    cluster = Cluster(
        num_nodes=1,
        simulated_accelerators_per_node=2,
        ray_address="local",
        num_cpus=2,
        interrupt_main_on_failure=False,
    )
    rows = []
    try:
        env = Env.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="env")
        answer = Answer.create_group().launch(cluster, PackedPlacementStrategy(1, 1), name="answer")
        for gap in [0.0, *gaps]:  # the first pass warms up and is not reported
            served = answer.serve(exchanges)
            rtt, send = env.run(exchanges, gap / 1000).wait(timeout=3600)[0]
            served.wait(timeout=60)
            rows.append(
                {
                    "gap_ms": gap,
                    "rtt_median_us": round(statistics.median(rtt) * 1e6, 1),
                    "rtt_mean_us": round(statistics.mean(rtt) * 1e6, 1),
                    "send_median_us": round(statistics.median(send) * 1e6, 1),
                }
            )
    finally:
        cluster.shutdown()
    return rows[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exchanges", type=int, default=2000)
    parser.add_argument("--gap-ms", type=float, nargs="+", default=[0.0, 7.0])
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_mode(args.exchanges, args.gap_ms)), flush=True)
        return
    print(json.dumps({"cpus": os.cpu_count(), "loadavg_start": round(os.getloadavg()[0], 1), **vars(args)}))
    for mode in args.modes:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RLINF_COMM_")} | MODES[mode]
        cmd = [sys.executable, __file__, "--child", mode, "--exchanges", str(args.exchanges), "--gap-ms"]
        out = subprocess.run(
            cmd + [str(g) for g in args.gap_ms],
            env=env,
            capture_output=True,
            text=True,
            check=True,
            timeout=3600,
        )
        for row in json.loads(out.stdout.strip().splitlines()[-1]):
            print(json.dumps({"mode": mode, **row, "loadavg": round(os.getloadavg()[0], 1)}), flush=True)


if __name__ == "__main__":
    main()
