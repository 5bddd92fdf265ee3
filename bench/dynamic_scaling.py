"""Dynamic scaling vs the static disaggregated placement: the same reasoning run on the same slots.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/dynamic_scaling.py [--steps 6] [--rounds 2] [key=value ...]

Runs ``apps/reasoning/train.py --config-name grpo_smollm2_disaggregated`` (SmolLM2-135M-Instruct, the actor on
simulated slot 0, the rollout on slot 1, one thread each) with ``runner.dynamic_scaling=false`` (the baseline)
and ``=true`` (the actor grows onto the rollout's slot after each generation), alternating the two
``--rounds`` times so that a slow spell of the machine hits both. Every run is a subprocess timed from its start;
``algorithm.dynamic_sampling=false`` makes every step generate exactly one batch, so that steps compare.

Reports per mode: the mean step time over steps 2..N (step 1 also warms up the channels), its generation and
training parts, the whole run's wall time from process start, and the learning curves side by side (policy
loss, entropy, gradient norm, rollout reward per step) with their largest difference. Also the machine's own
ceiling for the gain: the matmul throughput of two single-threaded processes running at once against one
(``cpu_scaling``; 2.0 on two real cores). Extra ``key=value`` arguments go to train.py. Writes
``<out>/dynamic_scaling.json``; prints it.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CURVES = ("train/actor/policy_loss", "train/actor/entropy", "train/actor/grad_norm", "rollout/reward_mean")


def _matmuls(queue: Any) -> None:
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    start = time.perf_counter()
    for _ in range(40):
        a @ b
    queue.put(time.perf_counter() - start)


def cpu_scaling() -> float:
    """Matmul throughput of two single-threaded processes at once, in units of one process alone."""
    ctx = multiprocessing.get_context("spawn")
    rates = []
    for n in (1, 2):
        queue = ctx.Queue()
        procs = [ctx.Process(target=_matmuls, args=(queue,)) for _ in range(n)]
        for proc in procs:
            proc.start()
        seconds = [queue.get(timeout=120) for _ in procs]
        for proc in procs:
            proc.join()
        rates.append(n / max(seconds))
    return rates[1] / rates[0]


def run_once(out: Path, dynamic: bool, steps: int, overrides: list[str], timeout: float) -> dict[str, object]:
    """One training run in a subprocess; its step times and curves."""
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        metrics.unlink()
    command = [
        sys.executable,
        str(ROOT / "apps" / "reasoning" / "train.py"),
        "--config-name",
        "grpo_smollm2_disaggregated",
        f"runner.logger.log_path={out}",
        "runner.logger.logger_backends=[]",
        f"runner.max_epochs={steps}",
        "runner.val_check_interval=-1",
        "runner.save_interval=-1",
        "runner.progress_bar=false",
        "algorithm.dynamic_sampling=false",
        f"runner.dynamic_scaling={str(dynamic).lower()}",
        "runner.pipeline=false",  # the static baseline runs its phases in sequence (not pipelined)
        *overrides,
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, timeout=timeout, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"train.py exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = sorted((r for r in records if "train/actor/policy_loss" in r), key=lambda r: r["step"])
    later = train[1:] or train
    return {
        "wall_s": wall,
        "step_s": statistics.mean(r["time/step_s"] for r in later),
        "rollout_s": statistics.mean(r["time/rollout_s"] for r in later),
        "train_s": statistics.mean(r["time/train_s"] for r in later),
        "grow_s": statistics.mean(r.get("scaling/grow_s", 0.0) for r in later),
        "shrink_s": statistics.mean(r.get("scaling/shrink_s", 0.0) for r in later),
        "curves": {key: [r[key] for r in train] for key in CURVES},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "dynamic_scaling")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3600.0)
    args, overrides = parser.parse_known_args(argv)
    scaling = cpu_scaling()
    print(
        f"two single-threaded processes at once: {scaling:.2f}x the matmul throughput of one", file=sys.stderr
    )
    runs: dict[str, list[dict[str, object]]] = {"static": [], "dynamic": []}
    for round_ in range(args.rounds):
        for mode in ("static", "dynamic") if round_ % 2 == 0 else ("dynamic", "static"):
            result = run_once(
                args.out / f"{mode}{round_}", mode == "dynamic", args.steps, overrides, args.timeout
            )
            runs[mode].append(result)
            print(
                f"round {round_} {mode:8s} step {result['step_s']:.2f} s (rollout {result['rollout_s']:.2f}, "
                f"train {result['train_s']:.2f}), wall {result['wall_s']:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    def mean_of(mode: str, key: str) -> float:
        return statistics.mean(float(r[key]) for r in runs[mode])  # type: ignore[arg-type]

    summary: dict[str, object] = {
        mode: {
            key: mean_of(mode, key)
            for key in ("step_s", "rollout_s", "train_s", "grow_s", "shrink_s", "wall_s")
        }
        for mode in runs
    }
    summary["cpu_scaling"] = scaling
    summary["step_ratio"] = mean_of("dynamic", "step_s") / mean_of("static", "step_s")
    summary["wall_ratio"] = mean_of("dynamic", "wall_s") / mean_of("static", "wall_s")
    first_static, first_dynamic = runs["static"][0]["curves"], runs["dynamic"][0]["curves"]
    summary["curves"] = {"static": first_static, "dynamic": first_dynamic}
    summary["max_abs_curve_diff"] = {
        key: max(abs(a - b) for a, b in zip(first_static[key], first_dynamic[key], strict=True))  # type: ignore[index]
        for key in CURVES
    }
    summary["command"] = " ".join(["uv run python bench/dynamic_scaling.py", *argv])
    summary["machine"] = (
        f"{platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "dynamic_scaling.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
