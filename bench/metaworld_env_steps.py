"""Meta-World env-steps/s: the package's own envs vs MetaWorldVecEnv (make_vec_env + chunk_step), state and rgb.

    uv run python bench/metaworld_env_steps.py [--env-id MT1/reach-v3] [--num-envs 4] [--steps 200]
        [--rgb-steps 40] [--chunk 8] [--obs-modes state rgb] [--modes sync async] [--repeats 3] [--app]

Cases, all in one run, each with ``--num-envs`` envs and uniform random actions in [-1, 1]:

- ``raw``: the envs as the package makes them, ``gym.make("Meta-World/MT1", env_name=task, seed=0, ...)`` (task
  ``i mod T`` of the benchmark for env ``i``), stepped one after the other in a Python loop, reset on truncation;
  rgb adds ``env.render()`` per step: gymnasium's MuJoCo renderer at full quality (shadows, reflections, 4x
  multisampling), the same camera and size.
- ``vec <mode>``: ``make_vec_env`` of the same benchmark, ``chunk_step`` of ``[N, chunk, 4]`` actions, in-process
  (``sync``) or one spawned process per env (``async``). rgb renders through the backend's renderer (fast mode:
  no shadows, reflections or multisampling).
- ``vec sync full-render`` (rgb only): the same with ``fast_render=False``, i.e. the raw case's picture quality.
- ``app`` (``--app``): the embodied app's training loop (Ray, EnvWorker, a rollout worker with a 16-unit MLP
  policy, collocated on one slot), ``rollout/env_steps_per_s`` (env steps of a rollout / its wall time), median
  over the training steps after the first. Includes policy inference and the env/rollout exchange.

The machine is shared: each timed segment of a case is paired with a ``raw`` segment of the same obs mode run
right before it; ``ratio_vs_raw`` is the median of the paired ratios. Construction and one warm-up chunk are not
timed. ``MUJOCO_GL`` is set to ``egl`` here when unset (the raw renderer reads it when mujoco is imported).
Prints one JSON line per case, then a table.
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

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
IMAGE = (128, 128)


class RawEnvs:
    """``num_envs`` Meta-World envs made by the package, kept for the whole run; ``segment`` times ``steps`` steps each."""

    def __init__(self, env_id: str, num_envs: int, obs_mode: str, camera: str, steps: int) -> None:
        import gymnasium as gym
        import metaworld  # noqa: F401  (registers Meta-World/MT1)
        from rlinf_envs.metaworld import benchmark_tasks

        tasks, _ = benchmark_tasks(env_id)
        render = {"render_mode": "rgb_array", "camera_name": camera, "width": IMAGE[1], "height": IMAGE[0]}
        self.rgb = obs_mode == "rgb"
        self.envs: list[Any] = [
            gym.make(
                "Meta-World/MT1",
                env_name=tasks[i % len(tasks)],
                seed=i,
                disable_env_checker=True,
                **(render if self.rgb else {}),
            )
            for i in range(num_envs)
        ]
        for i, env in enumerate(self.envs):
            env.reset(seed=i)
        self.actions = np.random.default_rng(0).uniform(-1, 1, (steps, num_envs, 4)).astype(np.float32)
        self.segment()  # warm-up (the first render creates the GL context)

    def segment(self) -> float:
        start = time.perf_counter()
        for a in self.actions:
            for i, env in enumerate(self.envs):
                _, _, term, trunc, _ = env.step(a[i])
                if self.rgb:
                    # gymnasium makes a renderer's GL context current only when it creates it: with several
                    # envs in one thread each must be made current before its frame (private, bench only).
                    env.unwrapped.mujoco_renderer._get_viewer("rgb_array").make_context_current()
                    env.render()
                if term or trunc:
                    env.reset()
        return self.actions.size / 4 / (time.perf_counter() - start)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def vec_case(
    raw: RawEnvs,
    label: str,
    env_id: str,
    num_envs: int,
    obs_mode: str,
    mode: str,
    steps: int,
    chunk: int,
    repeats: int,
    fast_render: bool = True,
) -> dict[str, Any]:
    from rlinf_envs import VecEnvConfig, make_vec_env
    from rlinf_envs.metaworld import MetaWorldVecEnv

    t0 = time.perf_counter()
    if fast_render:
        cfg = VecEnvConfig(
            env_type="metaworld",
            env_id=env_id,
            total_num_envs=num_envs,
            obs_mode=obs_mode,
            image_size=IMAGE,
            vector_mode=mode,
            reward_mode="dense",
        )
        env: Any = make_vec_env(cfg)
    else:  # not a config field: the backend's constructor argument
        env = MetaWorldVecEnv(env_id, num_envs, obs_mode=obs_mode, image_size=IMAGE, fast_render=False)
    env.reset(seed=0)
    n_chunks = max(1, steps // chunk)
    acts = np.random.default_rng(1).uniform(-1, 1, (n_chunks + 1, num_envs, chunk, 4)).astype(np.float32)
    env.chunk_step(acts[0])
    build_s = time.perf_counter() - t0
    rates, raw_rates = [], []
    for _ in range(repeats):
        raw_rates.append(raw.segment())
        start = time.perf_counter()
        for a in acts[1:]:
            env.chunk_step(a)
        rates.append(n_chunks * chunk * num_envs / (time.perf_counter() - start))
    env.close()
    return _row(label, obs_mode, num_envs, rates, raw_rates, build_s=round(build_s, 1))


def _row(
    label: str, obs_mode: str, num_envs: int, rates: list[float], raw_rates: list[float], **extra: Any
) -> dict[str, Any]:
    return {
        "case": label,
        "obs_mode": obs_mode,
        "num_envs": num_envs,
        "env_steps_per_s": round(statistics.median(rates), 1),
        "raw_env_steps_per_s": round(statistics.median(raw_rates), 1),
        "ratio_vs_raw": round(statistics.median(r / b for r, b in zip(rates, raw_rates, strict=True)), 2),
        **extra,
        "loadavg": round(os.getloadavg()[0], 1),
    }


def app_case(
    raw: RawEnvs, env_id: str, num_envs: int, obs_mode: str, steps: int, chunk: int
) -> dict[str, Any]:
    """The embodied app's PPO loop for 4 training steps; rollout/env_steps_per_s of steps 2-4."""
    from rlinf_core.metrics import read_metrics
    from rlinf_runners.apps import EmbodiedApp, run_app

    app = EmbodiedApp(ROOT / "apps" / "embodied")
    overrides = [
        "runner.max_epochs=4",
        "runner.val_check_interval=100",
        "runner.save_interval=100",
        "runner.progress_bar=false",
        "runner.logger.logger_backends=[]",
        'cluster.component_placement={"actor,env,rollout": 0}',
        "cluster.simulated_accelerators_per_node=1",
        f"env.train.env_id={env_id}",
        f"env.train.obs_mode={obs_mode}",
        f"env.train.image_size=[{IMAGE[0]}, {IMAGE[1]}]",
        f"env.train.total_num_envs={num_envs}",
        f"env.train.max_steps_per_rollout_epoch={steps // chunk * chunk}",
        f"env.eval.env_id={env_id}",
        f"env.eval.obs_mode={obs_mode}",
        f"env.eval.image_size=[{IMAGE[0]}, {IMAGE[1]}]",
        "env.eval.total_num_envs=1",
        f"env.eval.max_steps_per_rollout_epoch={chunk}",
        f"env.eval.max_episode_steps={chunk}",
        f"actor.model.num_action_chunks={chunk}",
        "actor.model.hidden_sizes=[16]",
        f"actor.global_batch_size={num_envs * (steps // chunk)}",
        f"actor.micro_batch_size={num_envs * (steps // chunk)}",
        "algorithm.update_epoch=1",
    ]
    if obs_mode == "rgb":
        overrides += ["actor.model.model_type=cnn", "actor.model.image_feature_dim=16"]
    raw_rate = raw.segment()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = app.load_config(
            ROOT / "apps" / "embodied" / "config" / "metaworld_reach_ppo.yaml",
            [*overrides, f"runner.logger.log_path={tmp}"],
        )
        result = run_app(app, cfg)
        records = [r for r in read_metrics(result.metrics_file) if "rollout/env_steps_per_s" in r]
    rates = [float(r["rollout/env_steps_per_s"]) for r in records[1:]]
    return _row("app (EnvWorker + rollout, PPO)", obs_mode, num_envs, rates, [raw_rate] * len(rates))


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--env-id", default="MT1/reach-v3")
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200, help="state: steps per env per timed segment")
    parser.add_argument("--rgb-steps", type=int, default=40, help="rgb: steps per env per timed segment")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--obs-modes", nargs="+", default=["state", "rgb"], choices=["state", "rgb"])
    parser.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--camera", default="corner4")
    parser.add_argument(
        "--app", action="store_true", help="also time the embodied app's rollout (starts Ray)"
    )
    args = parser.parse_args()
    head = {"cpus": os.cpu_count(), "env_id": args.env_id, "MUJOCO_GL": os.environ["MUJOCO_GL"]}
    print(json.dumps({**head, "loadavg_start": round(os.getloadavg()[0], 1)}), flush=True)
    rows = []
    for obs_mode in args.obs_modes:
        steps = args.steps if obs_mode == "state" else args.rgb_steps
        raw = RawEnvs(args.env_id, args.num_envs, obs_mode, args.camera, steps)
        cases = [(f"vec {m}", m, True) for m in args.modes]
        if obs_mode == "rgb":
            cases.append(("vec sync full-render", "sync", False))
        for label, mode, fast in cases:
            row = vec_case(
                raw, label, args.env_id, args.num_envs, obs_mode, mode, steps, args.chunk, args.repeats, fast
            )
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.app:
            row = app_case(raw, args.env_id, args.num_envs, obs_mode, steps, args.chunk)
            rows.append(row)
            print(json.dumps(row), flush=True)
        raw.close()
    print(
        f"\n{'obs':<6} {'case':<32} {'envs':>4} {'steps/s':>9} {'raw steps/s':>11} {'vs raw':>7}",
        file=sys.stdout,
    )
    for r in rows:
        print(
            f"{r['obs_mode']:<6} {r['case']:<32} {r['num_envs']:>4} {r['env_steps_per_s']:>9.1f} "
            f"{r['raw_env_steps_per_s']:>11.1f} {r['ratio_vs_raw']:>7.2f}"
        )


if __name__ == "__main__":
    main()
