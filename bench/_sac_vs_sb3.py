"""Shared machinery of the SAC benches: our ``apps/embodied/train.py`` vs Stable-Baselines3 SAC, from spawn.

A :class:`Task` names the env, our config, SB3's settings (RL-Zoo's), the evaluation cadence and episodes,
the return to reach and the budgets. :func:`main` runs both sides as subprocesses, alternating, and prints a
JSON summary; each time is measured by the bench from the moment it spawns the command to the moment the
first evaluation at or above the target appears (our ``metrics.jsonl``, polled; SB3's evaluation lines on
stderr, timestamped as they arrive). Every evaluation of both sides is kept (``curve``: env steps, seconds,
return) so a run that misses the target still shows how far it got.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The same spawn helpers as the CartPole start-up bench (this directory is on sys.path when run as a script).
from startup_cartpole import _seed_args, _user_env, _uv

ROOT = Path(__file__).resolve().parents[1]
POLL_S = 0.02


@dataclass(frozen=True)
class Task:
    """One comparison.

    Attributes:
        script: the bench file (``bench/<name>.py``) that re-runs itself with ``--sb3`` as SB3's child.
        config: our config name (``apps/embodied/config/<config>.yaml``).
        env_id: the gymnasium id both sides train and evaluate on.
        target: the evaluation mean return to reach; ``None``: the highest multiple of ``target_step`` that
            SB3's evaluations reach within ``budget_s`` (both sides then run their whole budget, SB3 first).
        eval_every: env steps between evaluations, on both sides.
        eval_episodes: deterministic episodes per evaluation (seeds 10000, 10001, ...), on both sides.
        sb3_kwargs: ``stable_baselines3.SAC`` arguments besides the policy, env, seed and device (RL-Zoo's).
        sb3_max_steps: SB3's env-step budget.
        budget_s: each side is stopped this many seconds after spawn (``None``: no wall budget).
        rlinf_overrides: config overrides the bench always passes to ours (evaluation cadence, logging).
    """

    script: str
    config: str
    env_id: str
    target: float | None
    eval_every: int
    eval_episodes: int
    sb3_kwargs: dict[str, Any]
    sb3_max_steps: int
    budget_s: float | None = None
    rlinf_overrides: tuple[str, ...] = field(default=())
    target_step: float = 250.0


def _spawn(cmd: list[str]) -> subprocess.Popen[str]:
    """A side's process, in its own session (so :func:`_stop` ends its whole tree), stderr piped."""
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=_user_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen[str]) -> None:
    """End a side that reached the target or its budget (the whole process group: Ray's workers too)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, 9)
            proc.wait()


def run_rlinf(task: Task, seed: int, extra: list[str], *, stop_at_target: bool) -> dict[str, Any]:
    """One ``uv run apps/embodied/train.py --config-name <task.config>``, from spawn to the target or budget."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [
            _uv(),
            "run",
            "apps/embodied/train.py",
            "--config-name",
            task.config,
            f"runner.logger.log_path={tmp}",
            "runner.progress_bar=false",
            *task.rlinf_overrides,
            *_seed_args(seed),
            *extra,
        ]
        out: dict[str, Any] = {"first_step_s": None, "reach_s": None, "app_reach_s": None, "env_steps": None}
        curve: list[list[float]] = []
        steps = 0.0
        start = time.perf_counter()
        proc = _spawn(cmd)
        err: list[str] = []
        drain = threading.Thread(target=lambda: err.extend(proc.stderr or []), daemon=True)
        drain.start()
        seen = 0
        stopped = False
        while True:
            done = proc.poll() is not None
            now = time.perf_counter() - start
            if metrics.exists():
                for line in metrics.read_text().splitlines()[seen:]:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        break  # a line being written; read it on the next poll
                    seen += 1
                    if out["first_step_s"] is None and "time/step_s" in rec:
                        out["first_step_s"] = now
                    if "eval/return_mean" in rec:
                        ret = rec["eval/return_mean"]
                        curve.append([steps, round(now, 2), round(ret, 2)])
                        if out["reach_s"] is None and task.target is not None and ret >= task.target:
                            out["reach_s"], out["app_reach_s"] = now, rec.get("time/since_process_start_s")
                            out["env_steps"] = steps
                    steps += rec.get("env/steps", 0.0)
            if done:
                break
            if (stop_at_target and out["reach_s"] is not None) or (
                task.budget_s is not None and now > task.budget_s
            ):
                stopped = True
                _stop(proc)
                break
            time.sleep(POLL_S)
        out["wall_s"] = time.perf_counter() - start
        drain.join(timeout=5)
        if proc.returncode != 0 and not stopped:
            raise RuntimeError(f"train.py failed ({proc.returncode}):\n{''.join(err)[-3000:]}")
    out["curve"] = curve
    return out


_EVAL_LINE = re.compile(r"steps=\s*(\d+) .*eval_return=\s*(-?[0-9.]+)")


def run_sb3(task: Task, seed: int, *, stop_at_target: bool) -> dict[str, Any]:
    """One SB3 SAC run from spawn to the target or budget (its child prints each evaluation on stderr)."""
    cmd = [_uv(), "run", "--group", "bench", "python", task.script, "--sb3", "--seed", str(seed)]
    if stop_at_target:
        cmd.append("--sb3-stop-at-target")
    start = time.perf_counter()
    proc = _spawn(cmd)
    out: dict[str, Any] = {"reach_s": None, "env_steps": None}
    curve: list[list[float]] = []
    tail: list[str] = []
    timer = None
    budget_hit = threading.Event()

    def stop_at_budget() -> None:
        budget_hit.set()  # before the kill: the reader below sees the flag once the pipe closes
        _stop(proc)

    if task.budget_s is not None:
        timer = threading.Timer(task.budget_s, stop_at_budget)
        timer.start()
    for line in proc.stderr or []:
        tail = [*tail, line][-40:]
        m = _EVAL_LINE.search(line)
        if m:
            now, ret = time.perf_counter() - start, float(m.group(2))
            curve.append([float(m.group(1)), round(now, 2), ret])
            if out["reach_s"] is None and task.target is not None and ret >= task.target:
                out["reach_s"], out["env_steps"] = now, float(m.group(1))
    proc.wait()
    if timer is not None:
        timer.cancel()
        timer.join()
    out["wall_s"] = time.perf_counter() - start
    if proc.returncode != 0 and not budget_hit.is_set():
        raise RuntimeError(f"SB3 run failed ({proc.returncode}):\n{''.join(tail)}")
    out["curve"] = curve
    return out


def sb3_child(task: Task, seed: int, *, stop_at_target: bool) -> int:
    """The SB3 side (under ``uv run --group bench``): SAC with ``task.sb3_kwargs``, one torch thread."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)

    def evaluate(model: Any) -> float:
        env = gym.make(task.env_id)
        returns = []
        for ep in range(task.eval_episodes):
            obs, _ = env.reset(seed=10_000 + ep)
            done, total = False, 0.0
            while not done:
                action, _ = model.predict(obs, deterministic=True)
                obs, r, term, trunc, _ = env.step(action)
                total += float(r)
                done = term or trunc
            returns.append(total)
        return float(np.mean(returns))

    class Evaluate(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % task.eval_every:
                return True
            ret = evaluate(self.model)
            sys.stderr.write(f"  steps={self.num_timesteps:7d} eval_return={ret:9.1f}\n")
            sys.stderr.flush()
            return not (stop_at_target and task.target is not None and ret >= task.target)

    env = gym.make(task.env_id)
    model = SAC("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **task.sb3_kwargs)
    model.learn(total_timesteps=task.sb3_max_steps, callback=Evaluate())
    return 0


def _reach(curve: list[list[float]], target: float) -> tuple[float | None, float | None]:
    """``(seconds, env steps)`` of the first evaluation at or above ``target`` in a curve, or ``(None, None)``."""
    for steps, seconds, ret in curve:
        if ret >= target:
            return seconds, steps
    return None, None


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    """RLinf / SB3 seconds to the target: ``inf`` when only SB3 reached it, ``None`` when SB3 did not."""
    if not theirs:
        return None
    return ours / theirs if ours else float("inf")


def _shown(ratio: float | None) -> float | str | None:
    """A ratio for the JSON summary (``inf`` spelled out)."""
    return "rlinf missed the target" if ratio == float("inf") else ratio


def _one_seed(task: Task, seed: int, args: argparse.Namespace) -> tuple[dict[str, Any], float | None]:
    """``--repeats`` pairs at ``seed``: (both curves, the target and each side's medians; their ratio)."""
    derive = task.target is None
    stop = not (args.full_curves or derive)
    rows: list[dict[str, Any]] = []

    def show(i: int, side: str, out: dict[str, Any]) -> None:
        brief = {k: v for k, v in out.items() if k != "curve"}
        sys.stderr.write(f"seed {seed} repeat {i} {side}: {json.dumps(brief)} evals {out['curve']}\n")

    for i in range(args.repeats):
        row: dict[str, Any] = {"repeat": i}
        if derive:  # SB3 first: its curve sets the target
            row["sb3"] = run_sb3(task, seed, stop_at_target=False)
            show(i, "sb3", row["sb3"])
        row["rlinf"] = run_rlinf(task, seed, args.overrides, stop_at_target=stop)
        show(i, "rlinf", row["rlinf"])
        if not args.no_sb3 and not derive:
            row["sb3"] = run_sb3(task, seed, stop_at_target=stop)
            show(i, "sb3", row["sb3"])
        rows.append(row)
    target = task.target
    if derive:
        best = min(max(ret for _, _, ret in r["sb3"]["curve"]) for r in rows)
        target = task.target_step * (best // task.target_step)
        for r in rows:
            for side in ("rlinf", "sb3"):
                r[side]["reach_s"], r[side]["env_steps"] = _reach(r[side]["curve"], target)
    out: dict[str, Any] = {
        "seed": seed,
        "command_rlinf": " ".join(
            [
                f"uv run apps/embodied/train.py --config-name {task.config}",
                *task.rlinf_overrides,
                *_seed_args(seed),
                *args.overrides,
            ]
        ),
        "command_sb3": f"uv run --group bench python {task.script} --sb3 --seed {seed}",
        "target": target,
        "target_from_sb3_curve": derive,
        "repeats": rows,
    }
    sides = ("rlinf",) if args.no_sb3 else ("rlinf", "sb3")
    for side in sides:
        keys = [k for k in rows[0][side] if k != "curve"]
        out[f"{side}_median"] = {k: _median([r[side][k] for r in rows]) for k in keys}
    ratio = None
    if not args.no_sb3:
        ratio = _ratio(out["rlinf_median"]["reach_s"], out["sb3_median"]["reach_s"])
        out["ratio_rlinf_over_sb3"] = _shown(ratio)
    return out, ratio


def main(task: Task, doc: str | None) -> int:
    """The bench's command line for ``task`` (``--repeats``, ``--seed`` / ``--seeds``, ``--no-sb3``, overrides)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3, help="pairs per seed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="several seeds, one after another (overrides --seed): each gets its own target (when SB3's curve "
        "sets it) and ratio, and the summary adds the median ratio over the seeds (a seed where only SB3 "
        "reached the target counts as slower than every other)",
    )
    parser.add_argument(
        "--sb3", action="store_true", help="run the SB3 side in this process (the bench's child)"
    )
    parser.add_argument("--sb3-stop-at-target", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-sb3", action="store_true", help="ours only (e.g. while tuning)")
    parser.add_argument(
        "--full-curves",
        action="store_true",
        help="run each side to its budget instead of stopping at the target (the whole learning curve)",
    )
    parser.add_argument("overrides", nargs="*", help="extra config overrides of ours (key=value)")
    args = parser.parse_args()
    if args.sb3:
        return sb3_child(task, args.seed, stop_at_target=args.sb3_stop_at_target)
    if task.target is None and args.no_sb3:
        raise SystemExit("this task's target comes from SB3's curve: drop --no-sb3")
    seeds = args.seeds if args.seeds is not None else [args.seed]
    load_before = os.getloadavg()
    results = [_one_seed(task, seed, args) for seed in seeds]
    summary: dict[str, Any] = {"cpus": os.cpu_count(), "load_average_before": load_before}
    if len(results) == 1:
        summary.update(results[0][0])
    else:
        summary["seeds"] = [out for out, _ in results]
        known = [r for _, r in results if r is not None]
        if known:  # a seed where only SB3 reached the target sorts above every other (inf)
            summary["ratio_per_seed"] = [_shown(r) for _, r in results]
            summary["ratio_median_over_seeds"] = _shown(statistics.median(known))
    summary["load_average_after"] = os.getloadavg()
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0
