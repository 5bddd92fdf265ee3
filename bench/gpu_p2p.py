"""Worker-to-worker send/recv of CUDA tensors on one GPU (CUDA IPC route) vs a device-to-device copy.

Run (on a machine with a CUDA GPU): RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 python bench/gpu_p2p.py [--mb 64 256 --reps 15]

Two one-worker groups placed on GPU 0 of one node. For each size, worker A alternates a baseline
``t.clone()`` of the CUDA tensor (a device-to-device copy, synchronised) with one ``send`` of the same tensor to
worker B, which is already waiting in ``recv`` and synchronises its stream when the tensor arrives. A transfer is
timed from just before ``send`` on A to the return of B's ``recv`` plus its ``torch.cuda.synchronize`` (the
processes share CLOCK_MONOTONIC). Medians over ``--reps`` after dropping the first (which opens the IPC handle).
GB/s counts the payload once (not read + write). The sender's transport counters are printed to show which
route carried the tensors (``ipc`` expected). ``--cpu`` smoke-tests the script with CPU tensors (shm route).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import ray
import torch
from rlinf_scheduler import Cluster, PackedPlacementStrategy, Worker


class GpuP2PWorker(Worker):
    def sender(
        self, peer: tuple[str, int], numel: int, reps: int, device: str
    ) -> tuple[list[float], list[float]]:
        t = torch.randn(numel, device=device)
        clones, starts = [], []
        for _ in range(reps):
            _sync(device)
            start = time.perf_counter()
            c = t.clone()
            _sync(device)
            clones.append((time.perf_counter() - start) * 1e3)
            del c
            self.recv(*peer, timeout=120)  # the receiver is waiting in recv
            _sync(device)
            starts.append(time.perf_counter())
            self.send(t, *peer)
        ends = self.recv(*peer, timeout=120)
        return clones[1:], [(e - s) * 1e3 for s, e in zip(starts, ends, strict=True)][1:]

    def receiver(self, peer: tuple[str, int], reps: int, device: str) -> str:
        ends, where = [], ""
        for _ in range(reps):
            self.send("ready", *peer)
            got = self.recv(*peer, timeout=120)
            _sync(device)
            ends.append(time.perf_counter())
            where = str(got.device)
            del got
        self.send(ends, *peer)
        return where

    def stats(self) -> dict[str, int]:
        return dict(self._comm().stats)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--cpu", action="store_true", help="smoke-test with CPU tensors (no GPU figures)")
    args = parser.parse_args()
    device = "cpu" if args.cpu else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("gpu_p2p.py needs a CUDA GPU (--cpu only smoke-tests it)")

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        with Cluster(num_nodes=1) as cluster:
            a = GpuP2PWorker.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="gp2p_a")
            b = GpuP2PWorker.create_group().launch(cluster, PackedPlacementStrategy(0, 0), name="gp2p_b")
            a.wait_ready(timeout=120)
            b.wait_ready(timeout=120)
            name = torch.cuda.get_device_name(0) if device == "cuda" else "CPU"
            print(f"device: {name}, torch {torch.__version__}, medians of {args.reps - 1}")
            print(f"{'case':42s} {'ms':>8s} {'GB/s':>8s} {'x copy':>7s}")
            for mb in args.mb:
                numel = mb * 1024 * 1024 // 4
                recv = b.execute_on(0).receiver(("gp2p_a", 0), args.reps, device)
                ((clones, times),) = (
                    a.execute_on(0).sender(("gp2p_b", 0), numel, args.reps, device).wait(timeout=600)
                )
                (where,) = recv.wait(timeout=600)
                copy, p2p = statistics.median(clones), statistics.median(times)
                print(
                    f"{f'{mb} MB device-to-device copy (baseline)':42s} {copy:8.3f} {mb / 1024 / copy * 1e3:8.1f} {1.0:7.2f}"
                )
                print(
                    f"{f'{mb} MB send/recv, arrives on {where}':42s} {p2p:8.3f} {mb / 1024 / p2p * 1e3:8.1f} "
                    f"{copy / p2p:7.2f}"
                )
            print("sender transport counters:", a.execute_on(0).stats().wait(timeout=30)[0])
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
