"""SAC on Pendulum-v1: ``uv run apps/embodied/train.py --config-name pendulum_sac`` vs Stable-Baselines3 SAC.

    uv run --group bench python bench/pendulum_sac.py [--repeats 3] [--seed 0]

Both are timed from the moment the bench spawns them, as subprocesses, alternating, ``--repeats`` times, to the
first evaluation whose mean return is >= -200:

* RLinf: ``uv run apps/embodied/train.py --config-name pendulum_sac`` (seeds ``actor.seed=s+1
  env.train.seed=s rollout.seed=s``). Its evaluation (4 episodes, deterministic actions) runs every
  ``runner.val_check_interval`` training steps = 320 env steps; the bench polls ``metrics.jsonl`` every 20 ms
  and also reports the app's ``time/since_process_start_s`` and the env steps of that evaluation.
* SB3: this file with ``--sb3`` under ``uv run --group bench``: SAC with RL-Zoo's Pendulum-v1 settings
  (rl-baselines3-zoo ``hyperparams/sac.yml``: ``learning_rate: 1e-3``, everything else SB3's defaults: buffer
  1e6, ``learning_starts`` 100, batch 256, tau 0.005, gamma 0.99, ``train_freq`` 1, ``gradient_steps`` 1,
  automatic entropy coefficient, two 256-unit hidden layers), one torch thread, evaluated with the same
  cadence (every 320 env steps) and the same 4 deterministic episodes; it prints each evaluation on stderr.
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
from pathlib import Path
from typing import Any

# The same spawn helpers as the CartPole start-up bench (this directory is on sys.path when run as a script).
from startup_cartpole import _seed_args, _user_env, _uv

ROOT = Path(__file__).resolve().parents[1]
TARGET = -200.0
EVAL_EVERY = 320
EVAL_EPISODES = 4
POLL_S = 0.02


# ------------------------------------------------------------------------------------------------ RLinf
def run_rlinf(seed: int, extra: list[str]) -> dict[str, float | None]:
    """One ``uv run apps/embodied/train.py --config-name pendulum_sac`` from spawn to exit."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [
            _uv(),
            "run",
            "apps/embodied/train.py",
            "--config-name",
            "pendulum_sac",
            f"runner.logger.log_path={tmp}",
            "runner.progress_bar=false",
            *_seed_args(seed),
            *extra,
        ]
        out: dict[str, float | None] = {"first_step_s": None, "reach_s": None, "app_reach_s": None}
        out["env_steps"] = None
        steps = 0.0
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=_user_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        err: list[str] = []
        drain = threading.Thread(target=lambda: err.extend(proc.stderr or []), daemon=True)
        drain.start()
        seen = 0
        while True:
            done = proc.poll() is not None
            if metrics.exists():
                now = time.perf_counter() - start
                for line in metrics.read_text().splitlines()[seen:]:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        break  # a line being written; read it on the next poll
                    seen += 1
                    steps += rec.get("env/steps", 0.0)
                    if out["first_step_s"] is None and "time/step_s" in rec:
                        out["first_step_s"] = now
                    if out["reach_s"] is None and rec.get("eval/return_mean", -1e9) >= TARGET:
                        out["reach_s"], out["app_reach_s"] = now, rec.get("time/since_process_start_s")
                        out["env_steps"] = steps
            if done:
                break
            time.sleep(POLL_S)
        out["wall_s"] = time.perf_counter() - start
        drain.join(timeout=5)
        if proc.returncode != 0:
            raise RuntimeError(f"train.py failed ({proc.returncode}):\n{''.join(err)[-3000:]}")
    return out


# -------------------------------------------------------------------------------------------------- SB3
_EVAL_LINE = re.compile(r"steps=\s*(\d+) .*eval_return=\s*(-?[0-9.]+)")


def run_sb3(seed: int) -> dict[str, float | None]:
    """One SB3 SAC run from spawn to exit; the time its evaluation first reaches the target."""
    cmd = [_uv(), "run", "--group", "bench", "python", "bench/pendulum_sac.py", "--sb3", "--seed", str(seed)]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_user_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    out: dict[str, float | None] = {"reach_s": None, "env_steps": None}
    tail: list[str] = []
    for line in proc.stderr or []:
        tail = [*tail, line][-40:]
        m = _EVAL_LINE.search(line)
        if out["reach_s"] is None and m and float(m.group(2)) >= TARGET:
            out["reach_s"], out["env_steps"] = time.perf_counter() - start, float(m.group(1))
    proc.wait()
    out["wall_s"] = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"SB3 run failed ({proc.returncode}):\n{''.join(tail)}")
    return out


def sb3_child(seed: int, max_steps: int) -> int:
    """The SB3 side (run under ``uv run --group bench``): SAC, RL-Zoo settings, stops at the target."""
    import gymnasium as gym
    import numpy as np
    import torch
    from stable_baselines3 import SAC
    from stable_baselines3.common.callbacks import BaseCallback

    torch.set_num_threads(1)

    def evaluate(model: Any) -> float:
        env = gym.make("Pendulum-v1")
        returns = []
        for ep in range(EVAL_EPISODES):
            obs, _ = env.reset(seed=10_000 + ep)
            done, total = False, 0.0
            while not done:
                action, _ = model.predict(obs, deterministic=True)
                obs, r, term, trunc, _ = env.step(action)
                total += float(r)
                done = term or trunc
            returns.append(total)
        return float(np.mean(returns))

    class StopAtTarget(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % EVAL_EVERY:
                return True
            ret = evaluate(self.model)
            sys.stderr.write(f"  steps={self.num_timesteps:6d} eval_return={ret:8.1f}\n")
            sys.stderr.flush()
            return ret < TARGET

    env = gym.make("Pendulum-v1")
    model = SAC("MlpPolicy", env, learning_rate=1e-3, seed=seed, device="cpu", verbose=0)
    model.learn(total_timesteps=max_steps, callback=StopAtTarget())
    return 0


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sb3", action="store_true", help="run the SB3 side in this process (the bench's child)"
    )
    parser.add_argument("--max-steps", type=int, default=20_000, help="SB3 budget (RL-Zoo: 2e4)")
    parser.add_argument("--no-sb3", action="store_true", help="RLinf only (e.g. while tuning)")
    parser.add_argument("overrides", nargs="*", help="extra RLinf config overrides (key=value)")
    args = parser.parse_args()
    if args.sb3:
        return sb3_child(args.seed, args.max_steps)
    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    for i in range(args.repeats):
        row: dict[str, Any] = {"repeat": i, "rlinf": run_rlinf(args.seed, args.overrides)}
        sys.stderr.write(f"repeat {i} rlinf: {row['rlinf']}\n")
        if not args.no_sb3:
            row["sb3"] = run_sb3(args.seed)
            sys.stderr.write(f"repeat {i} sb3:   {row['sb3']}\n")
        rows.append(row)
    summary: dict[str, Any] = {
        "command_rlinf": " ".join(
            [
                "uv run apps/embodied/train.py --config-name pendulum_sac",
                *_seed_args(args.seed),
                *args.overrides,
            ]
        ),
        "command_sb3": f"uv run --group bench python bench/pendulum_sac.py --sb3 --seed {args.seed}",
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "repeats": rows,
    }
    sides = ("rlinf",) if args.no_sb3 else ("rlinf", "sb3")
    for side in sides:
        summary[f"{side}_median"] = {k: _median([r[side][k] for r in rows]) for k in rows[0][side]}
    if not args.no_sb3:
        ours, theirs = summary["rlinf_median"]["reach_s"], summary["sb3_median"]["reach_s"]
        summary["ratio_rlinf_over_sb3"] = ours / theirs if ours and theirs else None
    summary["load_average_after"] = os.getloadavg()
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
