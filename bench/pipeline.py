"""Pipelined GRPO against the same disaggregated placement run in sequence (``runner.pipeline``).

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/pipeline.py [--steps 6] [--rounds 1] [key=value ...]

Runs ``apps/reasoning/train.py --config-name grpo_smollm2_pipeline`` (SmolLM2-135M-Instruct, the default
reasoning task and its GRPO settings, dynamic sampling included; the actor on simulated slot 0, the rollout on
slot 1, one thread each) with ``runner.pipeline=false`` (the baseline: generation, reward, training one after
another) and ``=true`` (finished chunks stream into the actor while the rollout generates the next ones),
alternating the order each ``--rounds`` round so that a slow spell of the machine hits both. Every run is a
subprocess timed from its start, with the SFT warm-up of the config and no evaluation.

``--modes`` adds ``pipelined-batch`` (one generation request per generation batch: it draws exactly the
sequential run's samples, so the two learning curves match to float precision while DAPO's extra generation
batches overlap the training of the groups already kept) and ``chunked`` (sequential, but the rollout generates in chunks of one prompt's samples,
``rollout.max_batch_size=8``): it draws exactly the pipelined run's samples, so its learning curve must match
the pipelined one to float precision, and it shows what chunked generation alone costs.

Reports per mode: RL steps/s from the driver's wall clock between the ends of step 1 and step N (weight syncs
included; step 1 also warms up the channels), the mean ``time/step_s``, the generation and the after-generation
training parts, the whole run's wall time from process start, and
the learning curves (policy loss, gradient norm, rollout reward, accuracy per step). Extra ``key=value``
arguments go to train.py. Writes ``<out>/pipeline.json``; prints it.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CURVES = ("train/actor/policy_loss", "train/actor/grad_norm", "rollout/reward_mean", "rollout/accuracy")
MODES = {
    "sequential": ["runner.pipeline=false"],
    "pipelined": ["runner.pipeline=true"],
    "chunked": ["runner.pipeline=false", "rollout.max_batch_size=8"],
    # one request per generation batch (the config's 4 prompts): the sequential run's samples exactly
    "pipelined-batch": ["runner.pipeline=true", "runner.pipeline_chunk_prompts=4"],
}


def run_once(out: Path, mode: str, steps: int, overrides: list[str], timeout: float) -> dict[str, Any]:
    """One training run in a subprocess; its step times and curves."""
    out.mkdir(parents=True, exist_ok=True)
    metrics = out / "metrics.jsonl"
    if metrics.exists():
        metrics.unlink()
    command = [
        sys.executable,
        str(ROOT / "apps" / "reasoning" / "train.py"),
        "--config-name",
        "grpo_smollm2_pipeline",
        f"runner.logger.log_path={out}",
        "runner.logger.logger_backends=[]",
        f"runner.max_epochs={steps}",
        "runner.val_check_interval=-1",
        "runner.save_interval=-1",
        "runner.progress_bar=false",
        *MODES[mode],
        *overrides,
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, timeout=timeout, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"train.py ({mode}) exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = sorted((r for r in records if "train/actor/policy_loss" in r), key=lambda r: r["step"])
    later = train[1:] or train
    step_s = statistics.mean(r["time/step_s"] for r in later)
    # the driver's wall clock between the ends of steps 1 and N: weight syncs and logging included
    walls = [r["time/train_wall_s"] for r in train]
    wall_per_step = (walls[-1] - walls[0]) / (len(walls) - 1) if len(walls) > 1 else step_s
    return {
        "wall_s": wall,
        "step_s": step_s,
        "wall_per_step_s": wall_per_step,
        "steps_per_s": 1.0 / wall_per_step,
        "rollout_s": statistics.mean(r["time/rollout_s"] for r in later),
        "train_s": statistics.mean(r["time/train_s"] for r in later),
        "gen_batches": statistics.mean(r["dapo/num_gen_batches"] for r in later),
        "step_times": [r["time/step_s"] for r in train],
        "curves": {key: [r.get(key) for r in train] for key in CURVES},
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "pipeline")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--modes", default="sequential,pipelined", help=f"comma-separated, of {list(MODES)}")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args, overrides = parser.parse_known_args(argv)
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"--modes: unknown {unknown}; allowed: {', '.join(MODES)}")
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    for round_ in range(args.rounds):
        for mode in modes if round_ % 2 == 0 else modes[::-1]:
            result = run_once(args.out / f"{mode}{round_}", mode, args.steps, overrides, args.timeout)
            runs[mode].append(result)
            print(
                f"round {round_} {mode:10s} step {result['step_s']:.2f} s (generation {result['rollout_s']:.2f}, "
                f"training after it {result['train_s']:.2f}, {result['gen_batches']:.1f} generation batches), "
                f"wall {result['wall_s']:.1f} s",
                file=sys.stderr,
                flush=True,
            )

    def mean_of(mode: str, key: str) -> float:
        return statistics.mean(float(r[key]) for r in runs[mode])

    keys = ("step_s", "wall_per_step_s", "steps_per_s", "rollout_s", "train_s", "gen_batches", "wall_s")
    summary: dict[str, Any] = {mode: {key: mean_of(mode, key) for key in keys} for mode in runs}
    for mode in runs:
        if mode != "sequential" and "sequential" in runs:
            summary[f"{mode}_steps_per_s_ratio"] = mean_of(mode, "steps_per_s") / mean_of(
                "sequential", "steps_per_s"
            )
            summary[f"{mode}_wall_ratio"] = mean_of(mode, "wall_s") / mean_of("sequential", "wall_s")
    summary["curves"] = {mode: runs[mode][0]["curves"] for mode in runs}
    summary["step_times"] = {mode: [r["step_times"] for r in runs[mode]] for mode in runs}
    summary["command"] = " ".join(["uv run python bench/pipeline.py", *argv])
    summary["machine"] = (
        f"{platform.node()} {platform.processor() or platform.machine()}, python {platform.python_version()}"
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pipeline.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
