"""Wall-clock to evaluation return 475 on CartPole-v1: RLinf's default app vs Stable-Baselines3 PPO, same run.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run --group bench python bench/embodied_cartpole.py [--seeds 0 1 2]

RLinf: ``apps/embodied/train.py`` with the default ``cartpole_ppo`` config (actor, rollout and env worker
groups on Ray, collocated), one process per seed (``actor.seed`` / ``env.train.seed`` / ``rollout.seed``).
Its figure is ``time/train_wall_s`` of the first evaluation with ``eval/return_mean >= 475``: seconds since
the training loop started, evaluation time excluded (what bench/cartpole_sb3.py measures for SB3). The
process wall time (Ray start, worker launch, evaluations included) is reported too.
Baseline: bench/cartpole_sb3.py (rl-zoo settings), run in this same process run, same seeds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_rlinf(seed: int, target: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        out = subprocess.run(
            [
                sys.executable,
                str(ROOT / "apps" / "embodied" / "train.py"),
                f"runner.logger.log_path={tmp}",
                "runner.progress_bar=false",
                f"runner.stop_eval_return={target}",
                "runner.logger.logger_backends=[]",
                f"actor.seed={seed + 1}",
                f"env.train.seed={seed}",
                f"rollout.seed={seed}",
            ],
            capture_output=True,
            text=True,
            timeout=900,
        )
        wall = time.perf_counter() - start
        if out.returncode != 0:
            raise RuntimeError(f"train.py failed ({out.returncode}):\n{out.stderr[-3000:]}")
        records = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval/return_mean" in r]
    hit = next((r for r in evals if r["eval/return_mean"] >= target), None)
    return {
        "seed": seed,
        "reached": hit is not None,
        "train_seconds_to_target": hit["time/train_wall_s"] if hit else None,
        "training_steps_to_target": hit["step"] if hit else None,
        "env_steps_to_target": hit["step"] * 256 if hit else None,
        "process_wall_seconds": wall,
        "final_eval_return": evals[-1]["eval/return_mean"] if evals else None,
    }


def run_sb3(seeds: list[int], target: float) -> dict:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "cartpole_sb3.py"),
            "--target",
            str(target),
            "--seeds",
            *map(str, seeds),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if out.returncode != 0:
        raise RuntimeError(f"cartpole_sb3.py failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=475.0)
    args = parser.parse_args()
    ours = [run_rlinf(s, args.target) for s in args.seeds]
    for r in ours:
        sys.stderr.write(f"rlinf seed {r['seed']}: {r}\n")
    sb3 = run_sb3(args.seeds, args.target)
    t_ours = [r["train_seconds_to_target"] for r in ours if r["reached"]]
    t_sb3 = sb3["median_train_seconds_to_target"]
    median_ours = statistics.median(t_ours) if t_ours else None
    summary = {
        "target": args.target,
        "rlinf": ours,
        "rlinf_median_train_seconds_to_target": median_ours,
        "rlinf_reached": f"{len(t_ours)}/{len(ours)}",
        "rlinf_median_process_wall_seconds": statistics.median(r["process_wall_seconds"] for r in ours),
        "sb3": sb3,
        "ratio_rlinf_over_sb3": (median_ours / t_sb3) if (median_ours and t_sb3) else None,
    }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
