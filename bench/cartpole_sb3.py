"""Baseline for the embodied target: Stable-Baselines3 PPO on CartPole-v1 with rl-zoo's tuned settings.

Measures the training wall-clock until the deterministic evaluation return reaches the target (475 by
default), evaluation time excluded, so it can be compared with RLinf's run on the same machine.

    uv run --group bench python bench/cartpole_sb3.py [--seeds 0 1 2] [--target 475]

rl-zoo hyperparameters (rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1): n_envs 8, n_steps 32,
batch_size 256, gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0.0, learning_rate lin_0.001,
clip_range lin_0.2, 1e5 timesteps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env


def linear(start: float):
    return lambda progress_remaining: progress_remaining * start


def evaluate(model: PPO, episodes: int, seed: int) -> float:
    env = gym.make("CartPole-v1")
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=seed + 1000 + ep)
        done, total = False, 0.0
        while not done:
            action, _ = model.predict(obs, deterministic=True)
            obs, r, term, trunc, _ = env.step(int(action))
            total += float(r)
            done = term or trunc
        returns.append(total)
    return float(np.mean(returns))


class TimeToTarget(BaseCallback):
    def __init__(self, target: float, eval_every: int, episodes: int, seed: int) -> None:
        super().__init__()
        self.target, self.eval_every, self.episodes, self.seed = target, eval_every, episodes, seed
        self.train_time = 0.0
        self._t0 = 0.0
        self._next = eval_every
        self.reached_at: tuple[float, int] | None = None
        self.curve: list[tuple[int, float, float]] = []

    def _on_training_start(self) -> None:
        self._t0 = time.perf_counter()

    def _on_step(self) -> bool:
        if self.num_timesteps < self._next:
            return True
        self._next += self.eval_every
        self.train_time += time.perf_counter() - self._t0
        ret = evaluate(self.model, self.episodes, self.seed)
        self.curve.append((self.num_timesteps, self.train_time, ret))
        sys.stderr.write(
            f"  steps={self.num_timesteps:6d} train_s={self.train_time:6.1f} eval_return={ret:6.1f}\n"
        )
        if ret >= self.target:
            self.reached_at = (self.train_time, self.num_timesteps)
            return False
        self._t0 = time.perf_counter()
        return True


def run(seed: int, target: float, eval_every: int, episodes: int, max_steps: int) -> dict:
    torch.manual_seed(seed)
    env = make_vec_env("CartPole-v1", n_envs=8, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=32,
        batch_size=256,
        gae_lambda=0.8,
        gamma=0.98,
        n_epochs=20,
        ent_coef=0.0,
        learning_rate=linear(1e-3),
        clip_range=linear(0.2),
        seed=seed,
        device="cpu",
        verbose=0,
    )
    cb = TimeToTarget(target, eval_every, episodes, seed)
    model.learn(total_timesteps=max_steps, callback=cb)
    reached = cb.reached_at
    return {
        "seed": seed,
        "reached": reached is not None,
        "train_seconds_to_target": reached[0] if reached else None,
        "env_steps_to_target": reached[1] if reached else None,
        "final_eval_return": cb.curve[-1][2] if cb.curve else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--target", type=float, default=475.0)
    parser.add_argument("--eval-every", type=int, default=2048, help="env steps between evaluations")
    parser.add_argument("--episodes", type=int, default=10, help="evaluation episodes")
    parser.add_argument("--max-steps", type=int, default=100_000, help="rl-zoo budget is 1e5")
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    for seed in args.seeds:
        sys.stderr.write(f"seed {seed}\n")
        results.append(run(seed, args.target, args.eval_every, args.episodes, args.max_steps))
    times = [r["train_seconds_to_target"] for r in results if r["reached"]]
    summary = {
        "baseline": "stable-baselines3 PPO, rl-zoo CartPole-v1 settings",
        "target": args.target,
        "runs": results,
        "median_train_seconds_to_target": statistics.median(times) if times else None,
        "reached": f"{len(times)}/{len(results)}",
    }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
