"""ManiSkill3 on the CPU sim: env-steps/s of ManiSkillVecEnv, sync vs async vector env, for several env counts.

Baseline in the same run: one raw ManiSkill env (``gym.make(..., num_envs=1, sim_backend="physx_cpu")``)
stepped in a plain loop with torch actions, i.e. what the simulator itself delivers in one process. The
machine is shared, so every timed segment of a case is paired with a baseline segment run right before it;
the reported ratio is the median of the paired ratios (robust to slow load drift).

    eval "$(bash scripts/install_vulkan_cpu.sh)"
    uv run python bench/maniskill_cpu.py [--env-id PushCube-v1] [--num-envs 1 2 4 8] [--steps 400] [--chunk 8]
        [--repeats 3] [--torch-threads 1] [--obs-mode rgb --image-size 64 64]

With a camera ``--obs-mode`` both sides render the same camera at ``--image-size`` (the baseline gets
ManiSkill's nested observation, ours the flat dict of numpy arrays).

Random actions in [-1, 1]; construction and a warm-up chunk are not timed. Each case builds its env once and
times ``--repeats`` segments of ``--steps`` steps per env. Async workers always run torch with one thread
(ManiSkillVecEnv sets it in its own worker processes). Prints one JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

import numpy as np


class RawBaseline:
    """One raw ManiSkill env kept alive for the whole run; ``segment`` times ``steps`` steps."""

    def __init__(self, env_id: str, steps: int, obs_mode: str, image_size: tuple[int, int] | None) -> None:
        import gymnasium as gym
        import mani_skill.envs  # noqa: F401
        import torch

        kwargs: dict[str, Any] = {}
        if image_size is not None and obs_mode != "state":
            kwargs["sensor_configs"] = {"height": image_size[0], "width": image_size[1]}
        self.env: Any = gym.make(
            env_id, num_envs=1, obs_mode=obs_mode, sim_backend="physx_cpu", render_backend="cpu", **kwargs
        )
        self.env.reset(seed=0)
        dim = self.env.unwrapped.single_action_space.shape[0]
        self.actions = torch.rand((steps, 1, dim)) * 2 - 1
        self.segment()

    def segment(self) -> float:
        start = time.perf_counter()
        for a in self.actions:
            _, _, term, trunc, _ = self.env.step(a)
            if bool(term[0]) or bool(trunc[0]):
                self.env.reset()
        return len(self.actions) / (time.perf_counter() - start)


def run_case(
    base: RawBaseline,
    env_id: str,
    num_envs: int,
    mode: str,
    steps: int,
    chunk: int,
    repeats: int,
    obs: tuple[str, tuple[int, int] | None] = ("state", None),
) -> dict[str, Any]:
    from rlinf_envs.maniskill import ManiSkillVecEnv

    t0 = time.perf_counter()
    env = ManiSkillVecEnv(env_id, num_envs, vector_mode=mode, obs_mode=obs[0], image_size=obs[1])
    build_s = time.perf_counter() - t0
    n_chunks = max(1, steps // chunk)
    rng = np.random.default_rng(0)
    acts = rng.uniform(-1, 1, (n_chunks + 1, num_envs, chunk, env.spec.action_dim)).astype(np.float32)
    env.reset(seed=0)
    env.chunk_step(acts[0])
    rates, base_rates = [], []
    for _ in range(repeats):
        base_rates.append(base.segment())
        start = time.perf_counter()
        for a in acts[1:]:
            env.chunk_step(a)
        rates.append(n_chunks * chunk * num_envs / (time.perf_counter() - start))
    env.close()
    return {
        "case": f"ManiSkillVecEnv {mode}",
        "obs_mode": obs[0],
        "num_envs": num_envs,
        "chunk": chunk,
        "env_steps_per_s": round(statistics.median(rates), 1),
        "best": round(max(rates), 1),
        "raw_single_env_steps_per_s": round(statistics.median(base_rates), 1),
        "ratio_vs_raw": round(statistics.median(r / b for r, b in zip(rates, base_rates, strict=True)), 2),
        "build_s": round(build_s, 1),
        "loadavg": round(os.getloadavg()[0], 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="PushCube-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=400, help="steps per env per timed segment")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--modes", nargs="+", default=["sync", "async"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--obs-mode", default="state", help="state, rgb, rgbd, ... (ManiSkillVecEnv's obs modes)"
    )
    parser.add_argument("--image-size", type=int, nargs=2, default=None, metavar=("H", "W"))
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch.set_num_threads in this process (0: torch's default)",
    )
    args = parser.parse_args()
    if not os.environ.get("VK_ICD_FILENAMES"):
        from rlinf_envs.maniskill import find_installed_icd

        if icd := find_installed_icd():
            os.environ["VK_ICD_FILENAMES"] = str(icd)
    if args.torch_threads > 0:
        import torch

        torch.set_num_threads(args.torch_threads)
    head = {"cpus": os.cpu_count(), "torch_threads": args.torch_threads, "env_id": args.env_id}
    print(json.dumps({**head, "loadavg_start": round(os.getloadavg()[0], 1)}), flush=True)
    size = None if args.image_size is None else (args.image_size[0], args.image_size[1])
    base = RawBaseline(args.env_id, args.steps, args.obs_mode.replace("rgbd+", "rgb+depth+"), size)
    for n in args.num_envs:
        for mode in args.modes:
            row = run_case(
                base, args.env_id, n, mode, args.steps, args.chunk, args.repeats, (args.obs_mode, size)
            )
            print(json.dumps(row), flush=True)
    base.env.close()


if __name__ == "__main__":
    main()
