"""RLPD (scripted-expert demonstrations) vs SAC (none) on ManiSkill PickCube-v1, CPU sim, from the same seed.

    uv run python bench/pickcube_rlpd.py [--max-env-steps 20000] [--eval-every 800] [--seed 0] [--out FILE]
        [--parallel] [--plot PNG] [--replot OUT_FILE --plot PNG]

Each arm is one ``uv run apps/embodied/train.py`` spawned by the bench: ``maniskill_pickcube_rlpd`` (its demo
file is generated first with ``apps/embodied/make_demos.py`` when missing, and that time is reported apart) and
``maniskill_pickcube_sac``, with the same seeds (``actor.seed=s+1 env.train.seed=s rollout.seed=s``), the same
evaluation (8 deterministic episodes of ``env.eval``) every ``--eval-every`` env steps, and at most
``--max-env-steps`` env steps. The bench reads ``metrics.jsonl`` every second and stops an arm at its first
evaluation with ``eval/success_rate >= 0.5``, recording the env steps trained before that evaluation and the
seconds since spawn; an arm that reaches the cap without it is reported as not reached. The table (markdown)
goes to stdout and to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# The same spawn helpers as the CartPole start-up bench (this directory is on sys.path when run as a script).
from startup_cartpole import _seed_args, _user_env, _uv

ROOT = Path(__file__).resolve().parents[1]
TARGET = 0.5
ENV_STEPS_PER_TRAINING_STEP = 8 * 4  # env.train.total_num_envs x max_steps_per_rollout_epoch of both configs
DEMOS = ROOT / "apps" / "embodied" / "data" / "pickcube_demos.pt"


def _records(metrics: Path) -> list[dict[str, Any]]:
    out = []
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break  # the line being written
    return out


def _first_success(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first evaluation at or above the target, with the env steps trained before it."""
    steps = 0.0
    for rec in records:
        if rec.get("eval/success_rate", -1.0) >= TARGET:
            return {"env_steps": steps, "step": rec.get("step"), "success_rate": rec["eval/success_rate"]}
        steps += rec.get("env/steps", 0.0)
    return None


def run_arm(config: str, seed: int, max_env_steps: int, eval_every: int) -> dict[str, Any]:
    """One training run, stopped at the target or at the env-step cap."""
    steps = max(1, max_env_steps // ENV_STEPS_PER_TRAINING_STEP)
    interval = max(1, eval_every // ENV_STEPS_PER_TRAINING_STEP)
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        overrides = {
            "runner.logger.log_path": tmp,
            "runner.logger.logger_backends": "[]",
            "runner.progress_bar": "false",
            "runner.max_epochs": steps,
            "runner.val_check_interval": interval,
            "runner.save_interval": -1,
        }
        train = [_uv(), "run", "apps/embodied/train.py", "--config-name", config]
        cmd = train + [f"{k}={v}" for k, v in overrides.items()] + _seed_args(seed)
        start = time.perf_counter()
        with open(Path(tmp) / "stderr.txt", "w") as err:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=_user_env(), stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
            reached: dict[str, Any] | None = None
            while proc.poll() is None and reached is None:
                time.sleep(1.0)
                reached = _first_success(_records(metrics))
            seconds = time.perf_counter() - start
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)  # the group of the run this bench started
                proc.wait(timeout=60)
            elif proc.returncode != 0:
                raise RuntimeError(
                    f"{config} failed ({proc.returncode}):\n{(Path(tmp) / 'stderr.txt').read_text()[-3000:]}"
                )
        records = _records(metrics)
        trained = sum(r.get("env/steps", 0.0) for r in records)
        evals = [(r.get("step"), r["eval/success_rate"]) for r in records if "eval/success_rate" in r]
    return {
        "config": config,
        "reached": reached is not None,
        "env_steps": None if reached is None else reached["env_steps"],
        "seconds": seconds if reached is not None else None,
        "success_rate": None if reached is None else reached["success_rate"],
        "trained_env_steps": trained,
        "wall_s": seconds,
        "evals": evals,
    }


def make_demos() -> float:
    """Write the demo file when it is missing; the seconds it took (0 when it existed)."""
    if DEMOS.is_file():
        return 0.0
    start = time.perf_counter()
    subprocess.run([_uv(), "run", "apps/embodied/make_demos.py"], cwd=ROOT, env=_user_env(), check=True)
    return time.perf_counter() - start


def table(rows: list[dict[str, Any]], cap: int) -> str:
    lines = [
        f"| arm | success >= {TARGET} at env steps | seconds from spawn | env steps trained | wall (s) |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        at = f"{r['env_steps']:.0f}" if r["reached"] else f"not reached (cap {cap})"
        secs = f"{r['seconds']:.0f}" if r["reached"] else "-"
        lines.append(f"| {r['config']} | {at} | {secs} | {r['trained_env_steps']:.0f} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Evaluation success rate against env steps, one line per arm, the target dashed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    for r in rows:
        steps = [step * ENV_STEPS_PER_TRAINING_STEP for step, _ in r["evals"]]
        ax.plot(steps, [rate for _, rate in r["evals"]], marker="o", markersize=3, label=r["config"])
    ax.axhline(TARGET, color="grey", linestyle="--", linewidth=1)
    ax.set_xlabel("env steps")
    ax.set_ylabel("eval success rate (8 episodes)")
    ax.set_title("ManiSkill PickCube-v1 (state, CPU sim): RLPD with 50 scripted demos vs SAC")
    ax.title.set_fontsize(9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--max-env-steps", type=int, default=20_000)
    parser.add_argument("--eval-every", type=int, default=800)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--arms", nargs="+", default=["maniskill_pickcube_rlpd", "maniskill_pickcube_sac"])
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run the arms at the same time (the env-step figures stay comparable; the seconds do not)",
    )
    parser.add_argument("--plot", type=Path, help="write the success-rate curves of the arms to this PNG")
    parser.add_argument(
        "--replot", type=Path, help="only redraw --plot from the rows of an earlier run's --out file"
    )
    args = parser.parse_args()
    if args.replot is not None:
        if args.plot is None:
            parser.error("--replot needs --plot")
        lines = args.replot.read_text().splitlines()
        plot([json.loads(line) for line in lines if line.startswith("{")], args.plot)
        return 0
    demo_s = make_demos()

    def arm(config: str) -> dict[str, Any]:
        row = run_arm(config, args.seed, args.max_env_steps, args.eval_every)
        print(json.dumps(row), file=sys.stderr, flush=True)
        return row

    if args.parallel:
        with ThreadPoolExecutor(len(args.arms)) as pool:
            rows = list(pool.map(arm, args.arms))
    else:
        rows = [arm(config) for config in args.arms]
    text = table(rows, args.max_env_steps) + f"\n\ndemo generation: {demo_s:.0f} s (0: the file existed)\n"
    print(text)
    if args.plot is not None:
        plot(rows, args.plot)
    if args.out is not None:
        args.out.write_text(text + "\n" + "\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
