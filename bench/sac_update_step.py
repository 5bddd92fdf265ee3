"""Milliseconds per off-policy SAC gradient step, in process (no Ray), with a breakdown of where they go.

Run: ``uv run python bench/sac_update_step.py [--config apps/embodied/config/halfcheetah_sac.yaml]
[--threads 1] [--steps 500] [--warmup 50] [--rounds 3] [--json out.json]``

Builds the :class:`rlinf_models.offpolicy.SACTrainer` exactly as the off-policy actor worker does for the
config (``torch.manual_seed(actor.seed)``, ``build_offpolicy_policy``, the trainer from ``actor`` and
``algorithm``) for HalfCheetah-v5's spec (17 observation and 6 action dimensions in ``[-1, 1]``), fills the
replay buffer with ``--fill`` random transitions, and after ``--warmup`` steps times ``--steps`` gradient steps
per round:

- ``total``: ``SACTrainer._step`` as :meth:`SACTrainer.update` calls it (no timers inside);
- the breakdown, a second pass calling the step's parts in ``_step``'s order with a clock between them:
  ``sample`` (buffer draw and this rank's rows), ``critic`` (target, loss, backward, optimizer),
  ``actor`` (policy loss through the frozen critics, backward, optimizer), ``alpha`` (temperature step),
  ``target`` (Polyak update of the target critics).

The two alternate per round; figures are medians over rounds of the per-round means. ``--threads`` sets
``torch.set_num_threads``: the default 1 is what the actor worker runs with in ``halfcheetah_sac`` (it leaves
``actor.torch_num_threads`` null and Ray starts the worker, created with ``num_cpus=0``, with
``OMP_NUM_THREADS=1``).

``--baseline`` times the step as it was before the step was made faster, on the same build: torch's default
(for-loop) AdamW instead of the fused one and the target update pair by pair instead of over all parameters
at once (the policy's distribution stays unvalidated; the Q heads are looped either way).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from rlinf_algos.offpolicy import soft_target_update
from rlinf_core.config import load_config
from rlinf_core.protocols import EnvSpec
from rlinf_models.actor import adamw
from rlinf_models.offpolicy import SACTrainer
from rlinf_models.policies import build_offpolicy_policy
from rlinf_runners.apps._embodied import EmbodiedConfig

ROOT = Path(__file__).resolve().parents[1]
OBS_DIM, ACTION_DIM = 17, 6
"""HalfCheetah-v5's observation and action sizes."""
PARTS = ("sample", "critic", "actor", "alpha", "target")


def build(config: Path, overrides: list[str], *, baseline: bool) -> SACTrainer:
    """The trainer the off-policy actor worker builds for ``config`` (one rank, CPU)."""
    cfg = load_config(EmbodiedConfig, config, overrides)
    spec = EnvSpec((OBS_DIM,), "continuous", ACTION_DIM, action_low=(-1.0,) * 6, action_high=(1.0,) * 6)
    torch.manual_seed(cfg.actor.seed)
    policy = build_offpolicy_policy(spec, cfg.actor.model)
    trainer = SACTrainer(policy, spec, cfg.actor, cfg.algorithm)
    if baseline:
        optim = cfg.actor.optim
        trainer.actor_optimizer = adamw(trainer.policy.parameters(), optim)
        trainer.critic_optimizer = adamw(trainer.critic.parameters(), optim, lr=optim.value_lr or optim.lr)
        for critic in (trainer.critic, trainer.target_critic):
            if critic is not None:
                critic.batched_heads = False
        target = trainer.target_critic

        def pairwise_target_update() -> None:
            assert target is not None
            for t, s in zip(target.parameters(), trainer.critic.parameters(), strict=True):
                soft_target_update([t], [s], tau=cfg.algorithm.tau)

        trainer._target_update = pairwise_target_update  # type: ignore[method-assign]
    return trainer


def fill(trainer: SACTrainer, n: int, *, envs: int = 8, seed: int = 0) -> None:
    """``n`` random transitions (``n / envs`` steps of ``envs`` envs) into the replay buffer."""
    g = torch.Generator().manual_seed(seed)
    steps = max(1, n // envs)
    chunks = trainer.policy.chunks
    trainer.add_trajectory(
        {
            "obs": torch.randn(steps, envs, OBS_DIM, generator=g),
            "next_obs": torch.randn(steps, envs, OBS_DIM, generator=g),
            "actions": torch.rand(steps, envs, chunks, ACTION_DIM, generator=g) * 2 - 1,
            "rewards": torch.randn(steps, envs, chunks, generator=g),
            "terminations": torch.rand(steps, envs, chunks, generator=g) < 0.001,
        }
    )


def split_step(trainer: SACTrainer, clock: dict[str, float]) -> None:
    """One ``SACTrainer._step``, its parts called in the same order, each part's seconds added to ``clock``."""
    alg = trainer.algorithm
    t0 = time.perf_counter()
    batch = trainer._sample()
    t1 = time.perf_counter()
    trainer._critic_step(batch)
    trainer.update_steps += 1
    t2 = time.perf_counter()
    clock["sample"] += t1 - t0
    clock["critic"] += t2 - t1
    if trainer.update_steps % alg.critic_actor_ratio == 0:
        _, logp = trainer._actor_step(batch["obs"])
        t3 = time.perf_counter()
        trainer._alpha_step(logp)
        t4 = time.perf_counter()
        clock["actor"] += t3 - t2
        clock["alpha"] += t4 - t3
    if trainer.target_critic is not None and trainer.update_steps % alg.target_update_freq == 0:
        t5 = time.perf_counter()
        trainer._target_update()
        clock["target"] += time.perf_counter() - t5


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=ROOT / "apps/embodied/config/halfcheetah_sac.yaml")
    parser.add_argument("overrides", nargs="*", help="config overrides, e.g. actor.global_batch_size=512")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the actor worker runs with 1)")
    parser.add_argument("--steps", type=int, default=500, help="gradient steps timed per round and pass")
    parser.add_argument("--warmup", type=int, default=50, help="untimed gradient steps first")
    parser.add_argument("--rounds", type=int, default=3, help="rounds (figures are medians over them)")
    parser.add_argument("--fill", type=int, default=50_000, help="random transitions in the replay buffer")
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="the step before it was made faster: for-loop AdamW, pairwise target update",
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    args = parser.parse_args()
    if args.threads < 1 or args.steps < 1 or args.rounds < 1 or args.warmup < 0 or args.fill < 1:
        parser.error("--threads, --steps, --rounds and --fill must be >= 1, --warmup >= 0")
    torch.set_num_threads(args.threads)
    trainer = build(args.config, args.overrides, baseline=args.baseline)
    fill(trainer, max(args.fill, trainer.buffer.min_size))
    if not trainer.sampler.ready():
        raise SystemExit(f"the buffer holds {len(trainer.buffer)} transitions, below its min_buffer_size")
    for _ in range(args.warmup):
        trainer._step()
    totals: list[float] = []
    parts: dict[str, list[float]] = {k: [] for k in PARTS}
    for _ in range(args.rounds):
        start = time.perf_counter()
        for _ in range(args.steps):
            trainer._step()
        totals.append((time.perf_counter() - start) / args.steps * 1e3)
        clock = dict.fromkeys(PARTS, 0.0)
        for _ in range(args.steps):
            split_step(trainer, clock)
        for k in PARTS:
            parts[k].append(clock[k] / args.steps * 1e3)
    result = {
        "config": str(args.config),
        "overrides": args.overrides,
        "baseline": args.baseline,
        "threads": args.threads,
        "torch": torch.__version__,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
        "load_avg_1min": os.getloadavg()[0],
        "ms_per_step": statistics.median(totals),
        "ms_per_step_rounds": totals,
        "ms_breakdown": {k: statistics.median(v) for k, v in parts.items()},
    }
    label = "baseline (before)" if args.baseline else "current"
    print(
        f"{label}: {result['ms_per_step']:.3f} ms per gradient step "
        f"(rounds {', '.join(f'{t:.3f}' for t in totals)}; {args.threads} thread(s), "
        f"load avg {result['load_avg_1min']:.2f})"
    )
    for k, v in result["ms_breakdown"].items():
        print(f"  {k:<7} {v:7.3f} ms")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
