"""SAC on Pendulum-v1: ``uv run apps/embodied/train.py --config-name pendulum_sac`` vs Stable-Baselines3 SAC.

    uv run --group bench python bench/pendulum_sac.py [--repeats 3] [--seed 0 | --seeds 0 1 2]

Both are timed from the moment the bench spawns them, as subprocesses, alternating, ``--repeats`` times, to the
first evaluation whose mean return is >= -200 (the machinery is ``bench/_sac_vs_sb3.py``):

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

from _sac_vs_sb3 import Task, main

TASK = Task(
    script="bench/pendulum_sac.py",
    config="pendulum_sac",
    env_id="Pendulum-v1",
    target=-200.0,
    eval_every=320,
    eval_episodes=4,
    sb3_kwargs={"learning_rate": 1e-3},  # RL-Zoo's Pendulum-v1; everything else SB3's defaults
    sb3_max_steps=20_000,  # RL-Zoo's budget
)

if __name__ == "__main__":
    raise SystemExit(main(TASK, __doc__))
