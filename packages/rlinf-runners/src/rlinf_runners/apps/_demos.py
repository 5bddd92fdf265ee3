"""RLPD demonstrations from a scripted expert: the command behind ``apps/embodied/make_demos.py``.

Options: ``--episodes N`` (default 100), ``--out PATH`` (default: the config's ``algorithm.demo_buffer.load_path``,
relative paths under the app directory), ``--num-envs E`` (default 8), ``--seed S``, ``--keep-failed``, and
``key=value`` config overrides.

The expert (``rlinf_envs.maniskill.scripted_expert`` of ``env.train.env_id`` and ``control_mode``) drives the
config's own training env, built by ``make_vec_env`` from ``env.train`` exactly as the env workers build it, so
the stored transitions are those the online replay buffer receives: ``obs``, ``actions [C, D]`` in the env's
action units (chunks of ``actor.model.num_action_chunks``; the expert's action for the chunk's first step is
held for the rest of it), ``rewards [C]`` in the config's ``reward_mode``, ``terminations [C]`` (as
``ignore_terminations`` makes them) and ``next_obs`` (the episode's last observation where it ended). Only the
episodes the expert solves are kept (``--keep-failed`` keeps all), as RLPD's offline data for this kind of
task holds successful demonstrations; a chunk that crosses an episode's end belongs to the episode it began
in. The file is a ``ReplayBuffer.save`` file, which ``algorithm.demo_buffer`` loads.

The demonstration episodes start from ``--seed`` (default far from the training and evaluation seeds of the
shipped configs), so that they do not replay the training or evaluation envs' initial states.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_SEED = 7_000_000


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="make_demos.py", description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--config-name", default="maniskill_pickcube_rlpd", help="a config of apps/embodied/config"
    )
    where.add_argument("--config", type=Path, help="a YAML config anywhere")
    parser.add_argument(
        "--episodes", type=int, default=100, help="expert episodes to run (successes are kept)"
    )
    parser.add_argument("--out", type=Path, help="the buffer file (default: algorithm.demo_buffer.load_path)")
    parser.add_argument("--num-envs", type=int, default=8, help="envs stepped together")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="reset seed of the first episodes")
    parser.add_argument("--keep-failed", action="store_true", help="keep the episodes the expert fails too")
    args, rest = parser.parse_known_args(argv)
    bad = [a for a in rest if "=" not in a]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (config overrides look like key.sub=value)")
    if args.episodes < 1 or args.num_envs < 1:
        parser.error("--episodes and --num-envs must be >= 1")
    return args, rest


def collect(
    cfg: Any, *, episodes: int, num_envs: int, seed: int, keep_failed: bool = False
) -> tuple[dict[str, Any], list[bool]]:
    """Roll the scripted expert through ``cfg.env.train``'s env until ``episodes`` episodes have ended.

    Args:
        cfg: an ``EmbodiedConfig`` (its ``env.train`` and ``actor.model.num_action_chunks``).
        episodes: episodes to run.
        num_envs: envs stepped together.
        seed: reset seed (env ``i`` starts with ``seed + i``).
        keep_failed: keep the transitions of failed episodes too.

    Returns:
        The kept transitions (``obs``, ``actions``, ``rewards``, ``terminations``, ``next_obs`` as tensors with a
        leading transition dimension) and each episode's success, in the order they ended.
    """
    import numpy as np
    import torch
    from rlinf_core.protocols import obs_index, obs_map, obs_stack
    from rlinf_models.offpolicy import TRANSITION_KEYS

    from ._collect import expert_env, scripted_expert_for

    expert = scripted_expert_for(cfg.env.train)
    # In-process envs: the expert reads each task env's state between steps.
    env = expert_env(cfg, num_envs)
    chunks = cfg.actor.model.num_action_chunks
    running: list[list[dict[str, Any]]] = [[] for _ in range(num_envs)]
    kept: list[dict[str, Any]] = []
    successes: list[bool] = []
    try:
        tasks = env.task_envs()
        obs = env.reset(seed=seed)
        while len(successes) < episodes:
            first = np.stack([expert(task) for task in tasks])
            actions = np.repeat(first[:, None], chunks, axis=1)
            res = env.chunk_step(actions)
            for i in range(num_envs):
                running[i].append(
                    {
                        "obs": obs_index(obs, i),
                        "actions": actions[i],
                        "rewards": res.rewards[i],
                        "terminations": res.terminations[i],
                        "next_obs": obs_index(res.final_obs, i),
                    }
                )
            # The ended episodes, in the order chunk_step reports them: by step of the chunk, then by env.
            done = res.terminations | res.truncations
            ended = [int(i) for k in range(chunks) for i in np.flatnonzero(done[:, k])]
            for i, success in zip(ended, res.episodes.successes, strict=True):
                if len(successes) < episodes:
                    successes.append(bool(success))
                    if success or keep_failed:
                        kept += running[i]
                running[i] = []
            obs = res.obs
    finally:
        env.close()
    if not kept:
        return {}, successes
    out = {k: obs_map(torch.from_numpy, obs_stack([t[k] for t in kept])) for k in TRANSITION_KEYS}
    out["rewards"] = out["rewards"].float()
    out["terminations"] = out["terminations"].bool()
    return out, successes


def main(argv: list[str], *, app_dir: Path) -> int:
    """Generate and write the demonstrations; 1 when the expert solved no episode, 2 for bad arguments.

    Args:
        argv: the command line after the program name.
        app_dir: the embodied app directory (its ``config/`` and the base of relative output paths).
    """
    args, overrides = _parse(argv)
    from rlinf_core.config import ConfigError, load_config
    from rlinf_models.offpolicy import ReplayBuffer

    from ._embodied import EmbodiedConfig

    config = args.config or app_dir / "config" / f"{args.config_name.removesuffix('.yaml')}.yaml"
    try:
        # Not the app's own checks: they refuse a config whose demo file does not exist yet.
        cfg = load_config(EmbodiedConfig, config, overrides)
    except (ConfigError, FileNotFoundError) as e:
        print(e, file=sys.stderr)
        return 2
    out = args.out
    if out is None:
        if cfg.algorithm.demo_buffer is None:
            print(f"{config} has no algorithm.demo_buffer: pass --out PATH", file=sys.stderr)
            return 2
        out = Path(cfg.algorithm.demo_buffer.load_path).expanduser()
        out = out if out.is_absolute() else app_dir / out
    start = time.perf_counter()
    transitions, successes = collect(
        cfg, episodes=args.episodes, num_envs=args.num_envs, seed=args.seed, keep_failed=args.keep_failed
    )
    solved = sum(successes)
    print(
        f"expert on {cfg.env.train.env_id} ({cfg.env.train.control_mode}): {solved} of {len(successes)} episodes "
        f"solved ({solved / len(successes):.0%}) in {time.perf_counter() - start:.1f} s"
    )
    if not transitions:
        print("no episode kept: nothing written", file=sys.stderr)
        return 1
    n = int(transitions["rewards"].shape[0])
    buffer = ReplayBuffer(n)
    buffer.add(transitions)
    out.parent.mkdir(parents=True, exist_ok=True)
    buffer.save(out)
    print(f"wrote {n} transitions of {len(successes) if args.keep_failed else solved} episodes to {out}")
    return 0
