"""Record episodes into a LeRobot dataset: the command behind ``apps/embodied/collect.py``.

``uv run apps/embodied/collect.py [--config-name NAME | --config PATH] (--checkpoint DIR | --expert) --out DIR``
``[--episodes N] [--only-success] [--num-envs E] [--seed S] [--sample] [--action-noise STD] [--fps F]``
``[--task TEXT] key=value ...``

The actions come from (a) a policy checkpoint (``--checkpoint``: a ``global_step_<N>`` directory of any
embodied run of the config's ``actor.model``, or its ``actor/model.pt``; its mean / most likely action, or
sampled ones with ``--sample``), or (b) the scripted expert of the config's env (``--expert``; see
:data:`SCRIPTED_EXPERTS`). The envs are the config's ``env.train`` built in this process (auto-reset on),
``--num-envs`` stepped together. A policy's action chunk is executed one step at a time, so that every env
step is one frame with its own observation (LeRobot's frame = one control step). Frames hold the observation
entries (see ``rlinf_runners.apps._lerobot``), ``action``, ``next.reward`` and ``next.done``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "SCRIPTED_EXPERTS",
    "expert_env",
    "main",
    "record_episodes",
    "scripted_expert_for",
    "write_dataset",
]

DEFAULT_SEED = 8_000_000
"""Reset seed of the first recorded episodes: far from the training and evaluation seeds of the configs."""


def _maniskill_expert(env_id: str, control_mode: str | None) -> Callable[[Any], np.ndarray]:
    from rlinf_envs.maniskill import scripted_expert

    return scripted_expert(env_id, control_mode)


def _libero_expert(env_id: str, control_mode: str | None) -> Callable[[Any], np.ndarray]:
    from rlinf_envs.libero import scripted_expert

    return scripted_expert(env_id, control_mode)


SCRIPTED_EXPERTS: dict[str, Callable[[str, str | None], Callable[[Any], np.ndarray]]] = {
    "maniskill": _maniskill_expert,
    "libero": _libero_expert,
}
"""Scripted experts per ``env_type``: ``(env_id, control_mode) -> expert``; ``expert(task_env)`` is the action
of one env (read from ``env.task_envs()``) for its next step."""


def scripted_expert_for(split: Any) -> Callable[[Any], np.ndarray]:
    """The scripted expert of an env split (``env_type``, ``env_id``, ``control_mode``).

    Raises:
        ValueError: when the backend has no scripted experts (listing those that do) or the task has none.
    """
    make = SCRIPTED_EXPERTS.get(split.env_type)
    if make is None:
        raise ValueError(
            f"scripted experts drive {', '.join(SCRIPTED_EXPERTS)} tasks; env.train.env_type is {split.env_type!r}"
        )
    return make(split.env_id, split.control_mode)


def expert_env(cfg: Any, num_envs: int, *, auto_reset: bool | None = None) -> Any:
    """``cfg.env.train`` built in this process (``vector_mode: sync``), so that an expert can read its task envs."""
    import attrs
    from rlinf_envs import make_vec_env, prepare_process_env

    prepare_process_env(cfg.env)
    # Recording needs no GRPO groups: every env starts its own episodes.
    split = attrs.evolve(cfg.env.train, vector_mode="sync", group_size=1)
    if auto_reset is not None:
        split = attrs.evolve(split, auto_reset=auto_reset)
    return make_vec_env(split, num_envs)


def record_episodes(
    env: Any,
    choose: Callable[[Any], np.ndarray],
    *,
    chunks: int,
    episodes: int,
    seed: int,
    only_success: bool,
    on_episode: Callable[[int, float, bool | None], None] | None = None,
    perturb: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[list[dict[str, Any]], list[bool | None]]:
    """Step ``env`` one control step at a time until ``episodes`` episodes have ended.

    Args:
        env: an auto-resetting vectorised env (the ``VecEnv`` protocol).
        choose: observation batch → actions ``[E, chunks, ...]`` (executed one step after the other).
        chunks: actions per :func:`choose` call.
        episodes: episodes to end.
        seed: reset seed (env ``i`` starts with ``seed + i``).
        only_success: keep only the solved episodes.
        on_episode: called with ``(episodes ended, return, success)`` after each episode.
        perturb: changes the actions before the env executes them (DART's noise injection); the episodes keep
            the unperturbed ones, the labels a learner should imitate in the states the perturbation led to.

    Returns:
        The kept episodes (``obs``: the per-step observations as a list, ``action``, ``reward``, and ``task``:
        the env's task name when it reports one) and every ended episode's success (``None`` where the env
        defines none), in the order they ended.

    Raises:
        ValueError: with ``only_success``, when the env reports no success.
    """
    from rlinf_core.protocols import obs_index

    n = env.num_envs
    running: list[dict[str, list[Any]]] = [{"obs": [], "action": [], "reward": []} for _ in range(n)]
    kept: list[dict[str, Any]] = []
    outcomes: list[bool | None] = []
    obs = env.reset(seed=seed)
    plan: np.ndarray | None = None
    k = 0
    while len(outcomes) < episodes:
        if plan is None or k == chunks:
            plan, k = np.asarray(choose(obs)), 0
        actions = plan[:, k : k + 1]
        k += 1
        res = env.chunk_step(actions if perturb is None else perturb(actions))
        for i in range(n):
            running[i]["obs"].append(obs_index(obs, i))
            running[i]["action"].append(actions[i, 0])
            running[i]["reward"].append(float(res.rewards[i, 0]))
        done = np.flatnonzero(res.terminations[:, 0] | res.truncations[:, 0]).tolist()
        stats = res.episodes
        for j, i in enumerate(done):
            if len(outcomes) >= episodes:
                break
            success = bool(stats.successes[j]) if stats.successes else None
            if success is None and only_success:
                raise ValueError("--only-success: this env reports no success of its episodes")
            outcomes.append(success)
            if success or not only_success:
                kept.append({**running[i], "task": stats.tasks[j] if stats.tasks else None})
            if on_episode is not None:
                on_episode(len(outcomes), float(stats.returns[j]), success)
        for i in done:
            running[i] = {"obs": [], "action": [], "reward": []}
        if len(done):
            plan = None  # a fresh episode starts with a fresh chunk (the others re-plan with it)
        obs = res.obs
    return kept, outcomes


def write_dataset(
    root: Path, spec: Any, episodes: Sequence[Mapping[str, Any]], *, fps: int, task: str
) -> Path:
    """Write :func:`record_episodes`' episodes as a LeRobot dataset at ``root`` (replacing it); returns ``root``.

    ``task`` is the task string of episodes for which the env reported none.
    """
    from rlinf_core.data.lerobot import LeRobotFeature, LeRobotWriter
    from rlinf_core.protocols import obs_stack

    from ._lerobot import ACTION, DONE, REWARD, action_feature, observation_features

    obs_features = observation_features(spec)
    features: dict[str, LeRobotFeature] = dict(obs_features.values())
    features |= {
        ACTION: action_feature(spec),
        REWARD: LeRobotFeature("float32", (1,)),
        DONE: LeRobotFeature("bool", (1,)),
    }
    writer = LeRobotWriter(root, fps=fps, features=features)
    for episode in episodes:
        obs = obs_stack(episode["obs"])
        frames = {name: (obs[key] if key is not None else obs) for key, (name, _) in obs_features.items()}
        length = len(episode["reward"])
        frames[ACTION] = np.asarray(episode["action"]).reshape(length, -1)
        frames[REWARD] = np.asarray(episode["reward"], dtype=np.float32)
        frames[DONE] = np.arange(length) == length - 1
        writer.add_episode(frames, episode.get("task") or task)
    return writer.write()


def _policy_chooser(cfg: Any, spec: Any, checkpoint: Path, *, sample: bool) -> Callable[[Any], np.ndarray]:
    import torch
    from rlinf_core.protocols import obs_map
    from rlinf_models.policies import build_inference_policy, checkpoint_weights_file, load_policy_weights

    policy = build_inference_policy(spec, cfg.actor.model)
    loaded = load_policy_weights(
        policy, checkpoint_weights_file(checkpoint), field="--checkpoint", strict=False
    )
    print(f"policy: {loaded.summary()}")
    policy.eval()

    def choose(obs: Any) -> np.ndarray:
        out = policy.act(obs_map(torch.from_numpy, obs), deterministic=not sample)
        return out.actions.numpy()

    return choose


def _noise(spec: Any, std: float, seed: int) -> Callable[[np.ndarray], np.ndarray]:
    """Gaussian action noise of ``std``, clipped to the spec's action bounds (continuous actions only)."""
    if spec.action_low is None or spec.action_high is None:
        raise ValueError("--action-noise needs continuous actions with bounds")
    rng = np.random.default_rng(seed)
    low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)

    def perturb(actions: np.ndarray) -> np.ndarray:
        noisy = actions + rng.normal(0.0, std, actions.shape)
        return np.clip(noisy, low, high).astype(actions.dtype)

    return perturb


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="collect.py", description=__doc__.split("\n")[0])
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--config-name", default="cartpole_ppo", help="a config of apps/embodied/config")
    where.add_argument("--config", type=Path, help="a YAML config anywhere")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint", type=Path, help="policy checkpoint (global_step_<N> or its model.pt)")
    source.add_argument("--expert", action="store_true", help="the env's scripted expert")
    parser.add_argument("--out", type=Path, required=True, help="the LeRobot dataset directory to write")
    parser.add_argument("--episodes", type=int, default=20, help="episodes to run")
    parser.add_argument("--only-success", action="store_true", help="keep only the solved episodes")
    parser.add_argument("--num-envs", type=int, default=4, help="envs stepped together")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="reset seed of the first episodes")
    parser.add_argument(
        "--sample", action="store_true", help="sample the policy's actions (default: its mode)"
    )
    parser.add_argument(
        "--action-noise",
        type=float,
        default=0.0,
        help="std of Gaussian noise added to the executed actions (clipped to the action bounds); the dataset "
        "stores the actions without it (DART)",
    )
    parser.add_argument("--fps", type=int, default=10, help="frames per second stored in the dataset")
    parser.add_argument("--task", help="the task string of the episodes (default: env.train.env_id)")
    args, rest = parser.parse_known_args(argv)
    bad = [a for a in rest if "=" not in a]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)} (config overrides look like key.sub=value)")
    if args.episodes < 1 or args.num_envs < 1 or args.fps < 1:
        parser.error("--episodes, --num-envs and --fps must be >= 1")
    if args.action_noise < 0:
        parser.error("--action-noise must be >= 0")
    return args, rest


def main(argv: list[str], *, app_dir: Path) -> int:
    """Record the episodes and write the dataset; 1 when no episode was kept, 2 for bad arguments."""
    args, overrides = _parse(argv)
    from rlinf_core.config import ConfigError, load_config
    from rlinf_envs import describe_tasks

    from ._embodied import EmbodiedApp, EmbodiedConfig

    app = EmbodiedApp(app_dir)
    config = args.config or app.config_dir / f"{args.config_name.removesuffix('.yaml')}.yaml"
    try:
        cfg = load_config(EmbodiedConfig, config, overrides)
        expert = scripted_expert_for(cfg.env.train) if args.expert else None
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(e, file=sys.stderr)
        return 2
    env = expert_env(cfg, args.num_envs, auto_reset=True)
    spec = describe_tasks(env.spec, cfg.env.train)
    try:
        choose: Callable[[Any], np.ndarray]
        if expert is not None:
            chunks = 1

            def choose_expert(_obs: Any) -> np.ndarray:
                # Asked each step: a backend may build an env's task only at its first reset, or rebuild it.
                return np.stack([expert(task) for task in env.task_envs()])[:, None]

            choose = choose_expert
        else:
            chunks = cfg.actor.model.num_action_chunks
            try:
                choose = _policy_chooser(
                    cfg, spec, app.resolve_data_path(str(args.checkpoint)), sample=args.sample
                )
            except (FileNotFoundError, ValueError) as e:
                print(e, file=sys.stderr)
                return 2
        start = time.perf_counter()

        def progress(done: int, ret: float, success: bool | None) -> None:
            outcome = "" if success is None else (", success" if success else ", failure")
            print(f"episode {done}/{args.episodes}: return {ret:.1f}{outcome}", flush=True)

        kept, outcomes = record_episodes(
            env,
            choose,
            chunks=chunks,
            episodes=args.episodes,
            seed=args.seed,
            only_success=args.only_success,
            on_episode=progress,
            perturb=_noise(spec, args.action_noise, args.seed) if args.action_noise > 0 else None,
        )
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    finally:
        env.close()
    elapsed = time.perf_counter() - start
    if any(o is not None for o in outcomes):
        print(f"{sum(bool(o) for o in outcomes)} of {len(outcomes)} episodes solved in {elapsed:.1f} s")
    else:
        print(f"{len(outcomes)} episodes in {elapsed:.1f} s")
    if not kept:
        print("no episode kept: nothing written", file=sys.stderr)
        return 1
    if args.task:
        kept = [{**episode, "task": args.task} for episode in kept]
    root = write_dataset(args.out, spec, kept, fps=args.fps, task=cfg.env.train.env_id)
    print(f"wrote {len(kept)} episodes ({sum(len(e['reward']) for e in kept)} frames) to {root}")
    return 0
