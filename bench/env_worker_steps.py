"""Env-steps/s through RLinf's ``EnvWorker`` vs the raw simulator, measured in the same run.

    eval "$(bash scripts/install_vulkan_cpu.sh)"    # ManiSkill only
    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/env_worker_steps.py --env-type maniskill \
        --env-id PushCube-v1 --obs-mode rgb --image-size 64 64 [--num-envs 4] [--steps 100] [--repeats 3]

Raw: ``--num-envs`` simulator instances made with the simulator's own API, stepped one after another in a plain
loop in this process with random actions (what the simulator delivers on one core, no RLinf code).

Through the worker: one ``EnvWorker`` rank (a Ray actor) with the same number of envs, stepped by
``EnvWorker.interact`` for ``--steps`` steps per env: every chunk it sends the observations (images included) to
a stand-in rollout rank, which answers random actions at once (no policy: what is timed is the env worker and
its transport, not inference), records the trajectory and builds it as tensors. The ratio is worker / raw,
median over ``--repeats`` paired segments (a raw segment right before each worker segment, so that load
drift on the shared machine hits both).

Prints one JSON line per configuration; ``--obs-mode`` is the backend's (ManiSkill: ``state``, ``rgb``, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("MUJOCO_GL", "egl")  # headless MuJoCo rendering (the raw Meta-World rgb case)


# --------------------------------------------------------------------------------------------- raw loops
def raw_maniskill(env_id: str, n: int, obs_mode: str, size: tuple[int, int] | None) -> Callable[[int], float]:
    """``n`` single-env ManiSkill CPU sims; returns ``segment(steps) -> env-steps/s``."""
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the tasks)
    import torch

    kwargs: dict[str, Any] = {}
    if size is not None and obs_mode != "state":
        kwargs["sensor_configs"] = {"height": size[0], "width": size[1]}
    mode = obs_mode.replace("rgbd+", "rgb+depth+")
    envs = [
        gym.make(env_id, num_envs=1, obs_mode=mode, sim_backend="physx_cpu", render_backend="cpu", **kwargs)
        for _ in range(n)
    ]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    dim = envs[0].unwrapped.single_action_space.shape[0]

    def segment(steps: int) -> float:
        actions = torch.rand((steps, n, 1, dim)) * 2 - 1
        start = time.perf_counter()
        for t in range(steps):
            for i, e in enumerate(envs):
                _, _, term, trunc, _ = e.step(actions[t, i])
                if bool(term[0]) or bool(trunc[0]):
                    e.reset()
        return steps * n / (time.perf_counter() - start)

    return segment


def _bench_module(name: str) -> Any:
    import importlib

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return importlib.import_module(name)


def raw_libero(env_id: str, n: int, obs_mode: str, size: tuple[int, int] | None) -> Callable[[int], float]:
    """``n`` LIBERO ``ControlEnv`` s of task 0 of suite ``env_id`` (``bench/libero_env_steps.py``'s raw case)."""
    mod = _bench_module("libero_env_steps")
    cache: dict[int, Any] = {}

    def segment(steps: int) -> float:
        if steps not in cache:  # the raw envs pre-draw their actions for a segment length
            cache[steps] = mod.RawEnvs(env_id, 0, n, obs_mode, (size or (128, 128))[0], steps)
        rate: float = cache[steps].segment()
        return rate

    return segment


class _RawMetaWorldFastRender:
    """``n`` Meta-World envs made by the package, each drawn by MuJoCo's own ``mujoco.Renderer`` at the env
    backend's picture quality (no shadows, reflections or multisampling), the camera the backend defaults to."""

    def __init__(self, env_id: str, n: int, size: tuple[int, int], camera: str) -> None:
        import gymnasium as gym
        import metaworld  # noqa: F401  (registers Meta-World/MT1)
        import mujoco
        from rlinf_envs.metaworld import benchmark_tasks

        tasks, _ = benchmark_tasks(env_id)
        self.envs: list[Any] = []
        self.renderers: list[Any] = []
        for i in range(n):
            env = gym.make("Meta-World/MT1", env_name=tasks[i % len(tasks)], seed=i, disable_env_checker=True)
            env.reset(seed=i)
            model = env.unwrapped.model
            model.vis.quality.offsamples = 0
            model.vis.global_.offwidth = max(int(model.vis.global_.offwidth), size[1])
            model.vis.global_.offheight = max(int(model.vis.global_.offheight), size[0])
            renderer = mujoco.Renderer(model, size[0], size[1])
            renderer.scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
            self.envs.append(env)
            self.renderers.append(renderer)
        self.camera = camera

    def segment(self, steps: int) -> float:
        actions = np.random.default_rng(0).uniform(-1, 1, (steps, len(self.envs), 4)).astype(np.float32)
        start = time.perf_counter()
        for a in actions:
            for i, env in enumerate(self.envs):
                _, _, term, trunc, _ = env.step(a[i])
                renderer = self.renderers[i]
                renderer.update_scene(env.unwrapped.data, camera=self.camera)
                renderer.render()
                if term or trunc:
                    env.reset()
        return actions.size / 4 / (time.perf_counter() - start)


def raw_metaworld(env_id: str, n: int, obs_mode: str, size: tuple[int, int] | None) -> Callable[[int], float]:
    """``n`` Meta-World envs made by the package: state, or rgb drawn at the backend's picture quality by
    ``mujoco.Renderer`` (``RLINF_BENCH_RAW_RENDER=full``: gymnasium's full-quality ``render()`` instead, the
    raw case of ``bench/metaworld_env_steps.py``)."""
    if obs_mode == "rgb" and size is not None and os.environ.get("RLINF_BENCH_RAW_RENDER", "fast") == "fast":
        fast = _RawMetaWorldFastRender(env_id, n, size, "corner4")  # the backend's default camera
        return fast.segment
    mod = _bench_module("metaworld_env_steps")
    cache: dict[int, Any] = {}

    def segment(steps: int) -> float:
        if steps not in cache:
            cache[steps] = mod.RawEnvs(env_id, n, obs_mode, "corner4", steps)
        rate: float = cache[steps].segment()
        return rate

    return segment


RAW: dict[str, Callable[[str, int, str, tuple[int, int] | None], Callable[[int], float]]] = {
    "maniskill": raw_maniskill,
    "libero": raw_libero,
    "metaworld": raw_metaworld,
}


# ------------------------------------------------------------------------------------- through the worker
def _random_server() -> type:
    from rlinf_scheduler import Worker

    class RandomServer(Worker):
        """The rollout side of the env worker's protocol, answering uniform random actions at once."""

        def __init__(self, action_dim: int, chunks: int) -> None:
            self.dim, self.chunks = action_dim, chunks
            self.rng = np.random.default_rng(0)

        def serve(self, env_group: str, stages: int) -> int:
            served, ended = 0, 0
            while True:
                msg = self.recv(env_group, 0, timeout=600)
                if msg.get("end"):
                    ended += 1
                    if ended == stages:
                        return served
                    continue
                obs = msg["obs"]
                n = len(next(iter(obs.values()))) if isinstance(obs, dict) else len(obs)
                zeros = np.zeros((n, 1), np.float32)
                self.send(
                    {
                        "stage": msg["stage"],
                        "actions": self.rng.uniform(-1, 1, (n, self.chunks, self.dim)).astype(np.float32),
                        "logprobs": np.zeros((n, self.chunks * self.dim), np.float32),
                        "values": zeros,
                        "versions": np.zeros(n, np.int64),
                        "final_values": None if msg.get("final_obs") is None else zeros,
                    },
                    env_group,
                    0,
                )
                served += 1

    return RandomServer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-type", default="maniskill")
    parser.add_argument("--env-id", default="PushCube-v1")
    parser.add_argument("--obs-mode", nargs="+", default=["state", "rgb"])
    parser.add_argument("--image-size", type=int, nargs=2, default=[64, 64], metavar=("H", "W"))
    parser.add_argument("--num-envs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100, help="steps per env per timed segment")
    parser.add_argument("--chunk", type=int, default=1)
    parser.add_argument(
        "--stages",
        type=int,
        default=1,
        help="pipeline stages of the env worker (rollout.pipeline_stage_num): with 2, one half of the envs steps "
        "while the other half's observations are with the rollout",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--timings",
        action="store_true",
        help="print the env worker's phase timers per segment (share of its time)",
    )
    parser.add_argument("--env-kwargs", default="{}", help="JSON: extra VecEnvConfig fields (e.g. task ids)")
    args = parser.parse_args()
    if args.env_type == "maniskill" and not os.environ.get("VK_ICD_FILENAMES"):
        from rlinf_envs.maniskill import find_installed_icd

        if icd := find_installed_icd():
            os.environ["VK_ICD_FILENAMES"] = str(icd)
    import torch
    from rlinf_core.config import AlgorithmConfig
    from rlinf_envs import EnvConfig, EnvWorker, VecEnvConfig, prepare_process_env
    from rlinf_scheduler import Cluster, PackedPlacementStrategy

    torch.set_num_threads(1)
    size = (args.image_size[0], args.image_size[1])
    extra = {k: tuple(v) if isinstance(v, list) else v for k, v in json.loads(args.env_kwargs).items()}
    print(json.dumps({"cpus": os.cpu_count(), "loadavg_start": round(os.getloadavg()[0], 1), **vars(args)}))
    cluster = Cluster(
        num_nodes=1,
        simulated_accelerators_per_node=2,
        ray_address="local",
        num_cpus=2,
        interrupt_main_on_failure=False,
    )
    try:
        for mode in args.obs_mode:
            split = VecEnvConfig(
                env_type=args.env_type,
                env_id=args.env_id,
                total_num_envs=args.num_envs,
                max_steps_per_rollout_epoch=args.steps,
                obs_mode=mode,
                image_size=None if mode == "state" else size,
                **extra,
            )
            cfg = EnvConfig(train=split, eval=split)
            prepare_process_env(cfg)
            raw = RAW[args.env_type](args.env_id, args.num_envs, mode, None if mode == "state" else size)
            raw(5)  # warm-up (first renders compile shaders)
            tag = mode.replace("+", "_")
            env = EnvWorker.create_group(
                cfg, AlgorithmConfig(), args.stages, num_action_chunks=args.chunk
            ).launch(cluster, PackedPlacementStrategy(0, 0), name=f"env_{tag}")
            spec = env.get_spec().wait(timeout=600)[0]
            server = (
                _random_server()
                .create_group(spec.action_dim, args.chunk)
                .launch(cluster, PackedPlacementStrategy(1, 1), name=f"srv_{tag}")
            )
            worker_rates: list[float] = []
            raw_rates: list[float] = []
            for rep in range(args.repeats + 1):  # the first worker segment warms up and is not counted
                base = raw(args.steps)
                serve = server.serve(f"env_{tag}", args.stages)
                start = time.perf_counter()
                env.interact(f"srv_{tag}", None, 0).wait(timeout=3600)
                elapsed = time.perf_counter() - start
                serve.wait(timeout=60)
                timings = env.pop_timings().wait(timeout=60)[0]
                if rep:
                    raw_rates.append(base)
                    worker_rates.append(args.steps * args.num_envs / elapsed)
                    if args.timings:
                        shares = {k: round(v / elapsed, 3) for k, v in sorted(timings.items())}
                        print(json.dumps({"segment_s": round(elapsed, 3), "share_of_segment": shares}))
            env.close().wait(timeout=60)
            row = {
                "env": f"{args.env_type}:{args.env_id}",
                "obs_mode": mode,
                "num_envs": args.num_envs,
                "chunk": args.chunk,
                "stages": args.stages,
                "raw_env_steps_per_s": round(statistics.median(raw_rates), 1),
                "worker_env_steps_per_s": round(statistics.median(worker_rates), 1),
                "ratio": round(
                    statistics.median(w / r for w, r in zip(worker_rates, raw_rates, strict=True)), 3
                ),
                "loadavg": round(os.getloadavg()[0], 1),
            }
            print(json.dumps(row), flush=True)
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
