"""SAC on MuJoCo HalfCheetah-v5: ``uv run apps/embodied/train.py --config-name halfcheetah_sac`` vs SB3 SAC.

    uv run --group bench python bench/halfcheetah_sac.py [--repeats 1] [--seed 0 | --seeds 0 1 2] [--full-curves]

Both sides are timed from the moment the bench spawns them, as subprocesses, alternating, to the first
evaluation whose mean return (4 deterministic episodes of 1000 steps, seeds 10000-10003) is at or above the
target, with an evaluation every 5120 env steps on both sides and a budget of 15 minutes each (the machinery
is ``bench/_sac_vs_sb3.py``):

* RLinf: ``uv run apps/embodied/train.py --config-name halfcheetah_sac`` with ``runner.val_check_interval=20``
  (20 training steps x 8 envs x 32 steps = 5120 env steps), seeds ``actor.seed=s+1 env.train.seed=s
  rollout.seed=s``.
* SB3: this file with ``--sb3`` under ``uv run --group bench``: SAC with RL-Zoo's MuJoCo settings
  (rl-baselines3-zoo ``hyperparams/sac.yml``, HalfCheetah: ``learning_starts: 10000``, everything else SB3's
  defaults: buffer 1e6, batch 256, lr 3e-4, tau 0.005, gamma 0.99, ``train_freq`` 1, ``gradient_steps`` 1,
  automatic entropy coefficient, two 256-unit layers), one torch thread.

The target is a return SB3 reaches within its 15 minutes here: each repeat runs SB3 first for its whole
budget, then ours for its whole budget; the target is the highest multiple of 250 that SB3's evaluations
reached (the lowest over repeats), and each side's time is that of its first evaluation at or above it. Every
evaluation of both sides is printed (``curve``: env steps, seconds from spawn, mean return).
"""

from __future__ import annotations

from _sac_vs_sb3 import Task, main

TASK = Task(
    script="bench/halfcheetah_sac.py",
    config="halfcheetah_sac",
    env_id="HalfCheetah-v5",
    target=None,  # the highest multiple of 250 SB3 reaches in its 15 minutes
    eval_every=5120,
    eval_episodes=4,
    sb3_kwargs={"learning_starts": 10_000},  # RL-Zoo's MuJoCo defaults; everything else SB3's defaults
    sb3_max_steps=1_000_000,
    budget_s=900.0,
    rlinf_overrides=("runner.val_check_interval=20", "runner.save_interval=-1"),
)

if __name__ == "__main__":
    raise SystemExit(main(TASK, __doc__))
