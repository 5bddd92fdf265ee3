"""Start-up and end-to-end time of ``uv run apps/embodied/train.py`` vs Stable-Baselines3 PPO, from process start.

    uv run --group bench python bench/startup_cartpole.py [--repeats 3] [--seed 0] [--breakdown]

What the user waits for, both sides timed from the moment the bench spawns the command:

* RLinf: ``uv run apps/embodied/train.py`` (the README's first command; default ``cartpole_ppo`` config, seeds
  ``actor.seed=s+1 env.train.seed=s rollout.seed=s`` as bench/embodied_cartpole.py sets them). The bench polls
  the run's ``metrics.jsonl`` (line-buffered) every 20 ms and notes when the first training-step record and the
  first evaluation with ``eval/return_mean >= 475`` appear; it also reports the app's own
  ``time/since_process_start_s`` of those records (seconds since the Python process was created, so without
  ``uv run``'s own start).
* SB3: ``uv run --group bench python bench/cartpole_sb3.py --seeds s`` (rl-zoo settings); the bench timestamps
  the evaluation line that reaches 475 as it arrives on stderr.

Both run as subprocesses, alternating, ``--repeats`` times; the table gives each repeat and the medians, plus
the load average. ``--breakdown`` adds one RLinf run (in-process, under the same ``uv run``) that times each
phase: interpreter and imports, cluster start, each group's launch and readiness, the env spec, the first
weight sync, first evaluation and first training step.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = 475.0
POLL_S = 0.02


def _uv() -> str:
    uv = shutil.which("uv")
    if uv is None:
        raise SystemExit("uv not found on PATH")
    return uv


def _user_env() -> dict[str, str]:
    """The environment a user's shell would have: without the variables the bench's own ``uv run`` set."""
    env = dict(os.environ)
    for key in ("VIRTUAL_ENV", "UV_RUN_RECURSION_DEPTH", "RAY_ENABLE_UV_RUN_RUNTIME_ENV"):
        env.pop(key, None)
    return env


def _seed_args(seed: int) -> list[str]:
    return [f"actor.seed={seed + 1}", f"env.train.seed={seed}", f"rollout.seed={seed}"]


def run_rlinf(seed: int) -> dict[str, float | None]:
    """One ``uv run apps/embodied/train.py`` from spawn to exit, polling its metrics.jsonl."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = Path(tmp) / "metrics.jsonl"
        cmd = [
            _uv(),
            "run",
            "apps/embodied/train.py",
            f"runner.logger.log_path={tmp}",
            "runner.progress_bar=false",
            *_seed_args(seed),
        ]
        first_step = reached = None
        app_first_step = app_reached = None
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
                lines = metrics.read_text().splitlines()
                now = time.perf_counter() - start
                for line in lines[seen:]:
                    try:
                        rec = json.loads(line)
                    except json.JSONDecodeError:
                        break  # a line being written; read it on the next poll
                    seen += 1
                    if first_step is None and "time/step_s" in rec:
                        first_step, app_first_step = now, rec.get("time/since_process_start_s")
                    if reached is None and rec.get("eval/return_mean", -1.0) >= TARGET:
                        reached, app_reached = now, rec.get("time/since_process_start_s")
            if done:
                break
            time.sleep(POLL_S)
        wall = time.perf_counter() - start
        drain.join(timeout=5)
        if proc.returncode != 0:
            raise RuntimeError(f"train.py failed ({proc.returncode}):\n{''.join(err)[-3000:]}")
    return {
        "first_step_s": first_step,
        "reach_475_s": reached,
        "wall_s": wall,
        "app_first_step_s": app_first_step,
        "app_reach_475_s": app_reached,
    }


_EVAL_LINE = re.compile(r"eval_return=\s*([0-9.]+)")


def run_sb3(seed: int) -> dict[str, float | None]:
    """One SB3 PPO run (rl-zoo settings) from spawn to exit; the time its evaluation first reaches 475."""
    cmd = [
        _uv(),
        "run",
        "--group",
        "bench",
        "python",
        "bench/cartpole_sb3.py",
        "--seeds",
        str(seed),
        "--target",
        str(TARGET),
    ]
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=_user_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    reached = None
    tail: list[str] = []
    for line in proc.stderr or []:
        tail = [*tail, line][-40:]
        m = _EVAL_LINE.search(line)
        if reached is None and m and float(m.group(1)) >= TARGET:
            reached = time.perf_counter() - start
    proc.wait()
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"cartpole_sb3.py failed ({proc.returncode}):\n{''.join(tail)}")
    return {"reach_475_s": reached, "wall_s": wall}


_BREAKDOWN_CHILD = r"""
import json, os, sys, time
import psutil
T0 = psutil.Process().create_time()
marks = []
def mark(name):
    marks.append((name, time.time() - T0))
mark("interpreter started, bench imports done")
import rlinf_scheduler._cluster as _cluster, rlinf_scheduler._group as _group
import rlinf_runners._embodied as _emb
def timed(owner, name, label, first_only=True):
    orig = getattr(owner, name)
    state = {"n": 0}
    def wrapper(*a, **k):
        state["n"] += 1
        tag = label(a) if callable(label) else label
        if first_only and state["n"] > 1:
            return orig(*a, **k)
        mark(tag + ": begin")
        out = orig(*a, **k)
        mark(tag + ": end")
        return out
    setattr(owner, name, wrapper)
timed(_cluster.Cluster, "__init__", "Cluster start (ray.init, node probe)")
timed(_group.GroupLauncher, "launch", lambda a: f"launch {a[0].worker_cls.__name__}", first_only=False)
timed(_group.WorkerGroup, "wait_ready", lambda a: f"wait_ready {a[0].name}", first_only=False)
_orig_call = _group.WorkerGroup.call
_seen = set()
def call(self, method, *a, **k):
    out = _orig_call(self, method, *a, **k)
    key = (self.name, getattr(method, "__qualname__", method))
    if key not in _seen:
        _seen.add(key)
        _orig_wait = out.wait
        def wait(*wa, **wk):
            res = _orig_wait(*wa, **wk)
            mark(f"first {self.name}.{key[1]} answered")
            return res
        out.wait = wait
    return out
_group.WorkerGroup.call = call
timed(_emb.EmbodiedRunner, "sync_weights", "first weight sync")
timed(_emb.EmbodiedRunner, "evaluate", "first evaluation")
timed(_emb.EmbodiedRunner, "collect_and_train", "first training step")
mark("patches installed")
from rlinf_runners.cli import main
mark("cli imported")
try:
    rc = main("embodied", sys.argv[1:], mode="train", app_dir=os.path.join(os.getcwd(), "apps", "embodied"))
finally:
    mark("main returned")
    sys.stdout.flush()
    print("BREAKDOWN " + json.dumps(marks))
"""


def run_breakdown(seed: int) -> list[tuple[str, float]]:
    """One instrumented run: (phase, seconds since the Python process was created)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            _uv(),
            "run",
            "--group",
            "bench",
            "python",
            "-c",
            _BREAKDOWN_CHILD,
            f"runner.logger.log_path={tmp}",
            "runner.progress_bar=false",
            *_seed_args(seed),
        ]
        start = time.perf_counter()
        out = subprocess.run(cmd, cwd=ROOT, env=_user_env(), capture_output=True, text=True, timeout=900)
        wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"breakdown run failed ({out.returncode}):\n{out.stderr[-3000:]}")
    line = next(x for x in out.stdout.splitlines() if x.startswith("BREAKDOWN "))
    marks = [tuple(m) for m in json.loads(line[len("BREAKDOWN ") :])]
    return [*marks, ("process exited (from spawn, incl. uv)", wall)]  # type: ignore[list-item]


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0, help="0 is the default config's setting")
    parser.add_argument("--breakdown", action="store_true", help="add one phase-by-phase RLinf run")
    parser.add_argument("--no-sb3", action="store_true", help="RLinf only (e.g. while iterating)")
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows: list[dict[str, object]] = []
    for i in range(args.repeats):
        r = run_rlinf(args.seed)
        sys.stderr.write(f"repeat {i} rlinf: {r}\n")
        rows.append({"repeat": i, "rlinf": r})
        if not args.no_sb3:
            s = run_sb3(args.seed)
            sys.stderr.write(f"repeat {i} sb3:   {s}\n")
            rows[-1]["sb3"] = s
    summary: dict[str, object] = {
        "command_rlinf": "uv run apps/embodied/train.py " + " ".join(_seed_args(args.seed)),
        "command_sb3": f"uv run --group bench python bench/cartpole_sb3.py --seeds {args.seed}",
        "cpus": os.cpu_count(),
        "load_average_before": load_before,
        "repeats": rows,
    }
    for side, keys in (
        ("rlinf", ("first_step_s", "reach_475_s", "wall_s", "app_first_step_s", "app_reach_475_s")),
        ("sb3", ("reach_475_s", "wall_s")),
    ):
        if side == "sb3" and args.no_sb3:
            continue
        summary[f"{side}_median"] = {
            k: _median([row[side][k] for row in rows])
            for k in keys  # type: ignore[index]
        }
    if args.breakdown:
        summary["breakdown"] = run_breakdown(args.seed)
    summary["load_average_after"] = os.getloadavg()
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
