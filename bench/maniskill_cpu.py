"""ManiSkill3 on the CPU sim: env-steps/s of ManiSkillVecEnv, sync vs async vector env, for several env counts.

Baseline in the same run: one raw ManiSkill env (``gym.make(..., num_envs=1, sim_backend="physx_cpu")``)
stepped in a plain loop with torch actions, i.e. what the simulator itself delivers per process.

    eval "$(bash scripts/install_vulkan_cpu.sh)"
    uv run python bench/maniskill_cpu.py [--env-id PushCube-v1] [--num-envs 1 2 4 8] [--steps 400] [--chunk 8]
        [--repeats 3] [--torch-threads 1]

Async workers always run torch with one thread (ManiSkillVecEnv sets it in its own worker processes).

Random actions in [-1, 1]; construction and a first warm-up chunk are not timed. Each case builds its env once
and times ``--repeats`` segments of ``--steps`` steps per env; the median (and best) rate is reported.
Prints one JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np


def raw_baseline(env_id: str, steps: int, repeats: int) -> list[float]:
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401
    import torch

    env = gym.make(env_id, num_envs=1, obs_mode="state", sim_backend="physx_cpu", render_backend="cpu")
    env.reset(seed=0)
    actions = torch.rand((steps, 1, env.unwrapped.single_action_space.shape[0])) * 2 - 1
    for a in actions[:20]:
        env.step(a)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for a in actions:
            _, _, term, trunc, _ = env.step(a)
            if bool(term[0]) or bool(trunc[0]):
                env.reset()
        rates.append(steps / (time.perf_counter() - start))
    env.close()
    return rates


def vec_rate(
    env_id: str, num_envs: int, mode: str, steps: int, chunk: int, repeats: int
) -> tuple[list[float], float]:
    from rlinf_envs.maniskill import ManiSkillVecEnv

    t0 = time.perf_counter()
    env = ManiSkillVecEnv(env_id, num_envs, vector_mode=mode)
    build_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    n_chunks = max(1, steps // chunk)
    acts = rng.uniform(-1, 1, (n_chunks + 1, num_envs, chunk, env.spec.action_dim)).astype(np.float32)
    env.reset(seed=0)
    env.chunk_step(acts[0])
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for a in acts[1:]:
            env.chunk_step(a)
        rates.append(n_chunks * chunk * num_envs / (time.perf_counter() - start))
    env.close()
    return rates, build_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-id", default="PushCube-v1")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=400, help="steps per env per case")
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--modes", nargs="+", default=["sync", "async"])
    parser.add_argument("--repeats", type=int, default=3)
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
    info = {
        "cpus": os.cpu_count(),
        "torch_threads": args.torch_threads,
        "loadavg_start": os.getloadavg()[0],
        "env_id": args.env_id,
    }
    base_rates = raw_baseline(args.env_id, args.steps, args.repeats)
    base = statistics.median(base_rates)
    row = {"case": "raw ManiSkill single env loop", "env_steps_per_s": round(base, 1)}
    print(json.dumps({**info, **row, "best": round(max(base_rates), 1)}), flush=True)
    for n in args.num_envs:
        for mode in args.modes:
            rates, build_s = vec_rate(args.env_id, n, mode, args.steps, args.chunk, args.repeats)
            rate = statistics.median(rates)
            row = {
                "case": f"ManiSkillVecEnv {mode}",
                "num_envs": n,
                "chunk": args.chunk,
                "env_steps_per_s": round(rate, 1),
                "best": round(max(rates), 1),
                "ratio_vs_raw": round(rate / base, 2),
                "build_s": round(build_s, 1),
                "loadavg": round(os.getloadavg()[0], 1),
            }
            print(json.dumps(row), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
