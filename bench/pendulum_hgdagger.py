"""HG-DAgger on Pendulum-v1: the simulated human's intervention rate falls while the learner's return rises.

    uv run python bench/pendulum_hgdagger.py [--expert CHECKPOINT] [--expert-steps 150] [--expert-target -200]
        [--steps 20] [--eval-every 1] [--seed 0] [--out DIR] [--plot PNG]

Two ``uv run apps/embodied/train.py`` runs spawned one after the other: the expert, ``pendulum_sac`` until its
first evaluation at or above ``--expert-target`` (at most ``--expert-steps`` training steps, a checkpoint at
every evaluation; skipped with ``--expert``), then ``pendulum_hgdagger`` for ``--steps`` training steps with
``actor.expert.checkpoint`` at the expert's best evaluated checkpoint, both with the seeds
``actor.seed=s+1 env.train.seed=s rollout.seed=s`` and evaluations of 4 deterministic episodes of 200 steps
(the expert's every 5 training steps, the learner's every ``--eval-every``). The bench writes ``DIR/pendulum_hgdagger.csv`` (per training step: env steps so far,
``train/hgdagger/*`` and the evaluation's mean return where there is one), prints it as a markdown table with
the expert's last evaluation, and plots intervention rate and evaluation return against env steps (``--plot``).
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import time
from pathlib import Path
from typing import Any

# The spawn helpers of the CartPole start-up bench (this directory is on sys.path when run as a script).
from startup_cartpole import _seed_args, _user_env, _uv

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = (
    "step",
    "env_steps",
    "intervention_rate",
    "takeovers",
    "discrepancy",
    "takeover_discrepancy",
    "aggregated",
    "eval_return",
)


def _train(
    config: str, log_path: Path, seed: int, *overrides: str, stop: float | None = None
) -> tuple[list[dict[str, Any]], float]:
    """One training run to completion: its metrics records and wall-clock seconds."""
    cmd = [
        _uv(),
        "run",
        "apps/embodied/train.py",
        "--config-name",
        config,
        f"runner.logger.log_path={log_path}",
        "runner.logger.logger_backends=[]",
        "runner.progress_bar=false",
        f"runner.stop_eval_return={'null' if stop is None else stop}",
        *overrides,
        *_seed_args(seed),
    ]
    start = time.perf_counter()
    with open(log_path.parent / f"{log_path.name}.stderr.txt", "w") as err:
        subprocess.run(cmd, cwd=ROOT, env=_user_env(), stdout=subprocess.DEVNULL, stderr=err, check=True)
    seconds = time.perf_counter() - start
    lines = (log_path / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines], seconds


def _rows(records: list[dict[str, Any]]) -> list[dict[str, float | None]]:
    evals = {int(r["step"]): r["eval/return_mean"] for r in records if "eval/return_mean" in r}
    rows: list[dict[str, float | None]] = [
        {"step": 0, "env_steps": 0, "eval_return": evals.get(0)} | dict.fromkeys(COLUMNS[2:-1])
    ]
    env_steps = 0.0
    for r in records:
        if "train/hgdagger/intervention_rate" not in r:
            continue
        env_steps += r.get("env/steps", 0.0)
        step = int(r["step"])
        row: dict[str, float | None] = {"step": step, "env_steps": env_steps, "eval_return": evals.get(step)}
        for key in COLUMNS[2:-1]:
            row[key] = r.get(f"train/hgdagger/{key}")
        rows.append(row)
    return rows


def _plot(rows: list[dict[str, float | None]], expert_return: float | None, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(6.4, 6.0), sharex=True)
    trained = [r for r in rows if r["intervention_rate"] is not None]
    top.plot([r["env_steps"] for r in trained], [r["intervention_rate"] for r in trained], color="tab:red")
    top.set_ylabel("intervention rate")
    top.set_ylim(0.0, 1.0)
    top.grid(alpha=0.3)
    evals = [r for r in rows if r["eval_return"] is not None]
    bottom.plot(
        [r["env_steps"] for r in evals], [r["eval_return"] for r in evals], marker="o", label="learner (eval)"
    )
    if expert_return is not None:
        bottom.axhline(expert_return, color="gray", linestyle="--", label="expert (eval)")
    bottom.set_ylabel("eval return (4 episodes)")
    bottom.set_xlabel("env steps")
    bottom.grid(alpha=0.3)
    bottom.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--expert", type=Path, help="an expert checkpoint directory (default: train one)")
    parser.add_argument("--expert-steps", type=int, default=150)
    parser.add_argument("--expert-target", type=float, default=-200.0)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--eval-every", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/bench_pendulum_hgdagger"))
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    expert_return = None
    expert = args.expert
    if expert is None:
        records, seconds = _train(
            "pendulum_sac",
            out / "expert",
            args.seed,
            f"runner.max_epochs={args.expert_steps}",
            "runner.save_interval=5",
            "runner.val_check_interval=5",
            stop=args.expert_target,
        )
        checkpoints = out / "expert" / "checkpoints"
        evals = {
            int(r["step"]): r["eval/return_mean"]
            for r in records
            if "eval/return_mean" in r and (checkpoints / f"global_step_{int(r['step'])}").is_dir()
        }
        best = max(evals, key=lambda step: evals[step])
        expert_return = evals[best]
        expert = checkpoints / f"global_step_{best}"
        print(
            f"expert: pendulum_sac, {max(evals)} steps in {seconds:.0f} s, eval returns {evals}, using step {best}"
        )
    records, seconds = _train(
        "pendulum_hgdagger",
        out / "hgdagger",
        args.seed,
        f"runner.max_epochs={args.steps}",
        "runner.save_interval=-1",
        f"runner.val_check_interval={args.eval_every}",
        f"actor.expert.checkpoint={expert.resolve()}",
    )
    rows = _rows(records)
    print(f"pendulum_hgdagger: {args.steps} steps in {seconds:.0f} s")
    with open(out / "pendulum_hgdagger.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    print("| step | env steps | intervention rate | takeovers | discrepancy | aggregated | eval return |")
    print("|---:|---:|---:|---:|---:|---:|---:|")

    def fmt(v: float | None, spec: str) -> str:
        return "" if v is None else format(v, spec)

    for r in rows:
        cells = [
            fmt(r["step"], ".0f"),
            fmt(r["env_steps"], ".0f"),
            fmt(r["intervention_rate"], ".3f"),
            fmt(r["takeovers"], ".0f"),
            fmt(r["discrepancy"], ".3f"),
            fmt(r["aggregated"], ".0f"),
            fmt(r["eval_return"], ".1f"),
        ]
        print("| " + " | ".join(cells) + " |")
    if expert_return is not None:
        print(f"expert's last eval return: {expert_return:.1f}")
    if args.plot is not None:
        _plot(rows, expert_return, args.plot, f"HG-DAgger on Pendulum-v1 (seed {args.seed})")
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
