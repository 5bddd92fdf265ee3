"""LIBERO env-steps/s: raw LIBERO envs in a loop vs LiberoVecEnv (make_vec_env + chunk_step) vs the EnvWorker.

    uv run python bench/libero_env_steps.py [--suite libero_spatial] [--num-envs 2] [--obs-modes state rgb]
        [--steps 40] [--chunk 8] [--repeats 3] [--image-size 128] [--vector-modes sync async] [--worker]

For each observation mode, in the same run:

- ``raw``: ``--num-envs`` LIBERO ``ControlEnv``s built as the backend builds them (same task, cameras, image size,
  soft resets), set to an initial state of the task's file and stepped one after the other in a plain loop
  (each env's GL context made current before its step, as several robosuite envs in one process need);
- ``LiberoVecEnv <mode>``: the same number of envs through ``make_vec_env`` and ``chunk_step`` (chunks of
  ``--chunk`` random actions; ``sync`` in this process, ``async`` one spawned process per env);
- ``EnvWorker`` (``--worker``): the whole embodied pipeline (Ray; env, rollout and actor workers collocated on one
  slot, one pipeline stage) on the shipped LIBERO-Spatial config of that mode with ``--num-envs`` envs; the
  figure is the runner's ``rollout/env_steps_per_s`` (policy inference included), median over the training
  steps after the first.

Random actions in ``[-1, 1]`` on one task (``--task-id``; no scene rebuilds), episodes long enough not to end in a
timed segment; construction, resets and a warm-up chunk are not timed. The machine may be shared: every timed
vector-env segment is paired with a raw segment run right before it, and the ratio reported is the median of the
paired ratios. Prints one JSON line per case, then a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


class RawEnvs:
    """``n`` raw LIBERO envs of one task, kept for the whole run; ``segment`` times ``steps`` steps of each."""

    def __init__(self, suite: str, task_id: int, n: int, obs_mode: str, image_size: int, steps: int) -> None:
        from rlinf_envs._process import libero_gl_env
        from rlinf_envs.libero import init_states, suite_tasks

        os.environ.update(libero_gl_env(os.environ))
        from libero.libero.envs.env_wrapper import ControlEnv

        task = suite_tasks(suite)[task_id]
        rgb = obs_mode == "rgb"
        t0 = time.perf_counter()
        self.envs = [
            ControlEnv(
                bddl_file_name=str(task.bddl_file),
                use_camera_obs=rgb,
                has_offscreen_renderer=rgb,
                camera_names=["agentview", "robot0_eye_in_hand"],
                camera_heights=image_size,
                camera_widths=image_size,
                hard_reset=False,
                ignore_done=True,
            )
            for _ in range(n)
        ]
        for i, env in enumerate(self.envs):
            env.reset()
            env.set_init_state(np.array(init_states(task)[i % 50]))
        self.build_s = time.perf_counter() - t0
        self.actions = np.random.default_rng(0).uniform(-1, 1, (steps, n, 7))
        self.segment()

    def segment(self) -> float:
        start = time.perf_counter()
        for step in self.actions:
            for env, a in zip(self.envs, step, strict=True):
                context = getattr(env.sim, "_render_context_offscreen", None)
                if context is not None:  # robosuite renders into the current GL context: make it this env's
                    context.gl_ctx.make_current()
                env.step(a)
        return self.actions.size / 7 / (time.perf_counter() - start)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def vec_case(raw: RawEnvs, args: argparse.Namespace, obs_mode: str, vector_mode: str) -> dict[str, Any]:
    from rlinf_envs import VecEnvConfig, make_vec_env

    cfg = VecEnvConfig(
        env_type="libero",
        env_id=args.suite,
        total_num_envs=args.num_envs,
        obs_mode=obs_mode,
        image_size=(args.image_size, args.image_size),
        task_ids=(args.task_id,),
        max_episode_steps=1_000_000,
        vector_mode=vector_mode,
    )
    t0 = time.perf_counter()
    env = make_vec_env(cfg)
    env.reset(seed=0)  # builds the scenes
    build_s = time.perf_counter() - t0
    n_chunks = max(1, args.steps // args.chunk)
    acts = np.random.default_rng(0).uniform(-1, 1, (n_chunks + 1, args.num_envs, args.chunk, 7))
    env.chunk_step(acts[0].astype(np.float32))
    rates, raw_rates = [], []
    for _ in range(args.repeats):
        raw_rates.append(raw.segment())
        start = time.perf_counter()
        for a in acts[1:]:
            env.chunk_step(a.astype(np.float32))
        rates.append(n_chunks * args.chunk * args.num_envs / (time.perf_counter() - start))
    env.close()
    return _row(f"LiberoVecEnv {vector_mode}", obs_mode, args, rates, raw_rates, build_s)


def worker_case(raw: RawEnvs, args: argparse.Namespace, obs_mode: str) -> dict[str, Any]:
    from rlinf_runners.apps import EmbodiedApp, run_app

    app = EmbodiedApp(ROOT / "apps" / "embodied")
    name = "libero_spatial_ppo_mlp" if obs_mode == "state" else "libero_spatial_ppo_cnn"
    steps_per_rollout = max(args.chunk, args.steps // args.chunk * args.chunk)
    batch = args.num_envs * steps_per_rollout // 4
    rates: list[float] = []
    raw_rates = [raw.segment()]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = app.load_config(
            app.config_dir / f"{name}.yaml",
            [
                f"runner.max_epochs={args.worker_steps}",
                "runner.val_check_interval=-1",
                "runner.save_interval=-1",
                "runner.progress_bar=false",
                "runner.logger.logger_backends=[]",
                f"runner.logger.log_path={tmp}",
                "cluster.simulated_accelerators_per_node=1",
                'cluster.component_placement={"actor,env,rollout": 0}',
                "rollout.pipeline_stage_num=1",
                f"env.train.env_id={args.suite}",
                f"env.train.task_ids=[{args.task_id}]",
                f"env.train.total_num_envs={args.num_envs}",
                f"env.train.max_steps_per_rollout_epoch={steps_per_rollout}",
                "env.train.max_episode_steps=1000000",
                f"env.train.image_size=[{args.image_size}, {args.image_size}]",
                f"env.eval.env_id={args.suite}",
                f"env.eval.task_ids=[{args.task_id}]",
                "env.eval.total_num_envs=1",
                f"env.eval.image_size=[{args.image_size}, {args.image_size}]",
                "algorithm.update_epoch=1",
                f"actor.global_batch_size={batch}",
                f"actor.micro_batch_size={batch}",
            ],
        )
        run_app(app, cfg, on_step=lambda step, rec: rates.append(rec["rollout/env_steps_per_s"]))
    raw_rates.append(raw.segment())
    timed = rates[1:] or rates
    base = statistics.median(raw_rates)
    return _row(
        "EnvWorker (Ray, collocated)", obs_mode, args, timed, [base] * len(timed), time.perf_counter() - t0
    )


def _row(
    case: str,
    obs_mode: str,
    args: argparse.Namespace,
    rates: list[float],
    raw_rates: list[float],
    build_s: float,
) -> dict[str, Any]:
    return {
        "case": case,
        "obs_mode": obs_mode,
        "num_envs": args.num_envs,
        "chunk": args.chunk,
        "env_steps_per_s": round(statistics.median(rates), 2),
        "raw_env_steps_per_s": round(statistics.median(raw_rates), 2),
        "ratio_vs_raw": round(statistics.median(r / b for r, b in zip(rates, raw_rates, strict=True)), 2),
        "build_s": round(build_s, 1),
        "loadavg": round(os.getloadavg()[0], 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--task-id", type=int, default=0)
    parser.add_argument("--num-envs", type=int, default=2)
    parser.add_argument("--obs-modes", nargs="+", default=["state", "rgb"], choices=["state", "rgb"])
    parser.add_argument("--vector-modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    parser.add_argument("--steps", type=int, default=40, help="steps per env per timed segment")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--worker", action="store_true", help="also time the full pipeline (Ray workers)")
    parser.add_argument("--worker-steps", type=int, default=3, help="training steps of the --worker run")
    args = parser.parse_args()
    head = {
        "cpus": os.cpu_count(),
        "suite": args.suite,
        "task_id": args.task_id,
        "image_size": args.image_size,
    }
    print(json.dumps({**head, "loadavg_start": round(os.getloadavg()[0], 1)}), flush=True)
    rows: list[dict[str, Any]] = []
    for obs_mode in args.obs_modes:
        raw = RawEnvs(args.suite, args.task_id, args.num_envs, obs_mode, args.image_size, args.steps)
        raw_rates = [raw.segment() for _ in range(args.repeats)]
        rows.append(_row("raw LIBERO loop", obs_mode, args, raw_rates, raw_rates, raw.build_s))
        print(json.dumps(rows[-1]), flush=True)
        for vector_mode in args.vector_modes:
            rows.append(vec_case(raw, args, obs_mode, vector_mode))
            print(json.dumps(rows[-1]), flush=True)
        if args.worker:
            rows.append(worker_case(raw, args, obs_mode))
            print(json.dumps(rows[-1]), flush=True)
        raw.close()
    cols = (
        "obs_mode",
        "case",
        "num_envs",
        "env_steps_per_s",
        "raw_env_steps_per_s",
        "ratio_vs_raw",
        "build_s",
    )
    widths = [max(len(c), *(len(str(r[c])) for r in rows)) for c in cols]
    line = " | ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))
    sys.stdout.write(f"\n{line}\n{'-' * len(line)}\n")
    for r in rows:
        sys.stdout.write(" | ".join(str(r[c]).ljust(w) for c, w in zip(cols, widths, strict=True)) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
