"""A vector env's ``chunk_step`` back to back on the main thread vs on a pool thread, in one plain process.

    uv run python bench/env_step_thread.py [--env-type metaworld --env-id MT1/reach-v3] [--num-envs 16]
        [--steps 300] [--pairs 8]

Scheduler workers run their methods on a pool of threads (threaded Ray actors) while a raw simulator loop runs
on the main thread; this times the same env both ways, alternating which goes first in each pair, with random
actions (chunk 1, state observations, one torch thread), and prints env-steps/s of each segment and the median
ratio thread / main.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env-type", default="metaworld")
    parser.add_argument("--env-id", default="MT1/reach-v3")
    parser.add_argument("--num-envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    import torch
    from rlinf_envs import VecEnvConfig
    from rlinf_envs._factory import make_vec_env

    torch.set_num_threads(1)
    cfg = VecEnvConfig(
        env_type=args.env_type,
        env_id=args.env_id,
        total_num_envs=args.num_envs,
        max_steps_per_rollout_epoch=args.steps,
        obs_mode="state",
    )
    env = make_vec_env(cfg)
    env.reset(seed=0)
    dim = env.spec.action_dim
    rng = np.random.default_rng(0)

    def segment() -> float:
        actions = rng.uniform(-1, 1, (args.steps, args.num_envs, 1, dim)).astype(np.float32)
        start = time.perf_counter()
        for a in actions:
            env.chunk_step(a)
        return args.steps * args.num_envs / (time.perf_counter() - start)

    pool = ThreadPoolExecutor(1)
    segment()  # warm-up on both
    pool.submit(segment).result()
    main_rates, thread_rates = [], []
    for pair in range(args.pairs):
        if pair % 2:
            thread_rates.append(pool.submit(segment).result())
            main_rates.append(segment())
        else:
            main_rates.append(segment())
            thread_rates.append(pool.submit(segment).result())
    env.close()
    print(
        json.dumps(
            {
                **vars(args),
                "loadavg": round(os.getloadavg()[0], 1),
                "main_env_steps_per_s": [round(r) for r in main_rates],
                "thread_env_steps_per_s": [round(r) for r in thread_rates],
                "ratio_thread_over_main": round(
                    statistics.median(t / m for t, m in zip(thread_rates, main_rates, strict=True)), 3
                ),
            }
        )
    )


if __name__ == "__main__":
    main()
