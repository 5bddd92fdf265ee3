"""SAC-Flow (a flow-matching actor) vs SAC (a tanh-Gaussian actor) on Pendulum-v1: learning curves.

    uv run python bench/sac_flow_pendulum.py [--seeds 0 1 2] [--max-env-steps 9600] [--out FILE] [--plot PNG]
        [--replot OUT_FILE --plot PNG]

Each arm is one ``uv run apps/embodied/train.py --config-name <arm>`` per seed, spawned by the bench one after
the other: ``pendulum_sac_flow`` (the flow actor: Flow-G velocity, 4 denoising steps, Flow-SDE noise) and
``pendulum_sac`` (the same critics, buffer, temperature and update-to-data ratio with the Gaussian actor), the
same seeds (``actor.seed=s+1 env.train.seed=s rollout.seed=s``), without the configs' early stop, for
``--max-env-steps`` env steps, evaluated (4 deterministic episodes of 200 steps) every 320 env steps. Per arm
and seed the bench records the evaluation curve, the env steps trained before the first evaluation with mean
return >= -200, the best and last evaluation return, and the median seconds per training step. The table
(markdown) goes to stdout and to ``--out`` with one JSON row per run.
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
from typing import Any

from pickcube_rlpd import _records
from startup_cartpole import _seed_args, _user_env, _uv

ROOT = Path(__file__).resolve().parents[1]
TARGET = -200.0
ENV_STEPS_PER_TRAINING_STEP = 4 * 16  # env.train.total_num_envs x max_steps_per_rollout_epoch of both configs
EVAL_EVERY = 320


def run_arm(config: str, seed: int, max_env_steps: int) -> dict[str, Any]:
    """One training run of ``config`` for ``max_env_steps`` env steps; its evaluation curve and timings."""
    overrides = {
        "runner.logger.logger_backends": "[]",
        "runner.progress_bar": "false",
        "runner.max_epochs": max(1, max_env_steps // ENV_STEPS_PER_TRAINING_STEP),
        "runner.val_check_interval": EVAL_EVERY // ENV_STEPS_PER_TRAINING_STEP,
        "runner.save_interval": -1,
        "runner.stop_eval_return": "null",
    }
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            _uv(),
            "run",
            "apps/embodied/train.py",
            "--config-name",
            config,
            f"runner.logger.log_path={tmp}",
        ]
        cmd += [f"{k}={v}" for k, v in overrides.items()] + _seed_args(seed)
        start = time.perf_counter()
        done = subprocess.run(cmd, cwd=ROOT, env=_user_env(), capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{config} seed {seed} failed ({done.returncode}):\n{done.stderr[-3000:]}")
        records = _records(Path(tmp) / "metrics.jsonl")
    evals: list[tuple[float, float]] = []
    first: float | None = None
    trained = 0.0
    for rec in records:
        if "eval/return_mean" in rec:
            evals.append((trained, rec["eval/return_mean"]))
            if first is None and rec["eval/return_mean"] >= TARGET:
                first = trained
        trained += rec.get("env/steps", 0.0)
    step_s = [r["time/step_s"] for r in records if "time/step_s" in r]
    return {
        "config": config,
        "seed": seed,
        "first_env_steps": first,
        "best_return": max(ret for _, ret in evals),
        "last_return": evals[-1][1],
        "step_s": statistics.median(step_s),
        "trained_env_steps": trained,
        "wall_s": wall,
        "evals": evals,
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"| arm | seed | first eval >= {TARGET:.0f} at env steps | best eval return | last eval return "
        "| s / training step (median) | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        first = "not reached" if r["first_env_steps"] is None else f"{r['first_env_steps']:.0f}"
        lines.append(
            f"| {r['config']} | {r['seed']} | {first} | {r['best_return']:.0f} | {r['last_return']:.0f} "
            f"| {r['step_s']:.3f} | {r['wall_s']:.0f} |"
        )
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Evaluation return against env steps, one line per run (colour by arm), the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    colours = {name: f"C{i}" for i, name in enumerate(dict.fromkeys(r["config"] for r in rows))}
    labelled: set[str] = set()
    for r in rows:
        steps, returns = zip(*r["evals"], strict=True)
        label = None if r["config"] in labelled else r["config"]
        labelled.add(r["config"])
        ax.plot(
            steps, returns, color=colours[r["config"]], marker="o", markersize=2, linewidth=1, label=label
        )
    ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval return (4 episodes)")
    ax.set_title("Pendulum-v1: SAC-Flow (flow-matching actor) vs SAC (Gaussian actor), one line per seed")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--max-env-steps", type=int, default=9600)
    parser.add_argument("--arms", nargs="+", default=["pendulum_sac_flow", "pendulum_sac"])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--plot", type=Path, help="write the evaluation curves to this PNG")
    parser.add_argument("--replot", type=Path, help="only redraw --plot from an earlier run's --out file")
    args = parser.parse_args()
    if args.replot is not None:
        if args.plot is None:
            parser.error("--replot needs --plot")
        lines = args.replot.read_text().splitlines()
        plot([json.loads(line) for line in lines if line.startswith("{")], args.plot)
        return 0
    rows = []
    for seed in args.seeds:
        for config in args.arms:
            rows.append(run_arm(config, seed, args.max_env_steps))
            print(
                json.dumps({k: v for k, v in rows[-1].items() if k != "evals"}), file=sys.stderr, flush=True
            )
    text = table(rows)
    print(text)
    if args.plot is not None:
        plot(rows, args.plot)
    if args.out is not None:
        args.out.write_text(text + "\n\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
