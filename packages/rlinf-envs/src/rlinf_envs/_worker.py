"""``EnvWorker``: pipelined simulation, exchanging observations and actions with the rollout ranks.

Each env rank holds ``pipeline_stage_num`` independent env sets (stages). Per chunk step and stage, it sends the
stage's observations to the rollout rank(s) owning its slice of the stage batch (``peer_slices``), receives the
actions, and steps the stage; with two stages, simulating one overlaps the rollout's inference of the other.
Messages are point-to-point (``Worker.send`` / ``recv``); finished trajectories go on the actor's ``Channel``.

Messages to a rollout rank, per stage and step: ``{"stage", "obs" [n, *obs], "deterministic",
"final_obs" [n, *obs] or None, "new_episode" [n] bool or None}`` (``final_obs`` asks for ``V(final obs)`` of rows
whose chunk ended in a truncation, for bootstrapping; ``new_episode``, in training rollouts, marks observations
that start an episode), or ``{"stage", "end": True}`` when the rank stops sending for that stage. The reply:
``{"actions", "logprobs" [n, C*D], "values" [n, 1], "final_values" [n, 1] or None}`` and, from HG-DAgger's
gate, ``"interventions"`` [n] bool and ``"discrepancy"`` [n].
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rlinf_algos import compute_loss_mask
from rlinf_core.checkpoint import atomic_write_bytes, capture_rng_state, restore_rng_state
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import (
    ChunkStepResult,
    EnvSpec,
    EpisodeStats,
    NpObs,
    VecEnv,
    obs_concat,
    obs_index,
    obs_map,
    obs_stack,
)
from rlinf_scheduler import Channel, Worker, peer_slices

from ._config import EnvConfig, VecEnvConfig
from ._factory import describe_tasks, make_vec_env
from ._video import EpisodeVideos, frames_of

__all__ = ["CHECKPOINT_SUBDIR", "EnvWorker"]

CHECKPOINT_SUBDIR = "env"
"""Where :meth:`EnvWorker.save_checkpoint` writes inside a checkpoint directory (one file per rank)."""


def split_envs(cfg: VecEnvConfig, world_size: int, stages: int, what: str) -> int:
    """Envs per (rank, stage); raises a ``ValueError`` naming ``what`` when they do not divide evenly."""
    unit = world_size * stages * cfg.group_size
    if cfg.total_num_envs % unit:
        raise ValueError(
            f"{what}.total_num_envs ({cfg.total_num_envs}) must be a multiple of env ranks ({world_size}) x "
            f"pipeline stages ({stages}) x group_size ({cfg.group_size}) = {unit}"
        )
    return cfg.total_num_envs // (world_size * stages)


def check_state_layout(state: dict[str, Any], world_size: int, seeds: list[int]) -> None:
    """Raise a ``ValueError`` naming both layouts unless ``state`` was saved by env ranks laid out like these."""
    layout = (state["world_size"], len(state["stages"]), [st["seed"] for st in state["stages"]])
    mine = (world_size, len(seeds), seeds)
    if layout != mine:
        raise ValueError(
            f"env state saved with (env ranks, pipeline stages, stage seeds)={layout} cannot be loaded into "
            f"{mine}: resume with the env.train.total_num_envs, env.train.seed, env ranks and "
            f"rollout.pipeline_stage_num the checkpoint was written with"
        )


class _Stage:
    """One env set of this rank and its running state."""

    def __init__(self, env: VecEnv, seed: int, chunks: int) -> None:
        self.env = env
        self.seed = seed
        self.obs = env.reset(seed=seed)
        self.dones = np.zeros((env.num_envs, chunks), dtype=bool)


class EnvWorker(Worker):
    """Simulates ``env.train`` (and ``env.eval``) and exchanges observations/actions with the rollout group.

    Args:
        cfg: the ``env`` config.
        algorithm: the ``algorithm`` config (``gamma``, ``bootstrap_type``, ``rollout_epoch``).
        pipeline_stage_num: env sets per rank stepped in turn (``rollout.pipeline_stage_num``).
        num_action_chunks: actions per policy call (``actor.model.num_action_chunks``).
        rollout_world_size: ranks of the rollout group (for the batch split).
        collect_transitions: off-policy training: trajectories also carry ``next_obs [T, E, *obs]`` (the
            observation after each chunk, the episode's last one where it ended) and ``terminations [T, E, C]``,
            and no reward is bootstrapped (the critic bootstraps from ``next_obs`` itself).
    """

    def __init__(
        self,
        cfg: EnvConfig,
        algorithm: AlgorithmConfig,
        pipeline_stage_num: int = 1,
        *,
        num_action_chunks: int = 1,
        rollout_world_size: int = 1,
        collect_transitions: bool = False,
    ) -> None:
        torch.set_num_threads(cfg.torch_num_threads)
        self.collect_transitions = collect_transitions
        self.cfg = cfg
        self.algorithm = algorithm
        self.stages = pipeline_stage_num
        self.chunks = num_action_chunks
        self.rollout_world_size = rollout_world_size
        for name, split in (("env.train", cfg.train), ("env.eval", cfg.eval)):
            if split.max_steps_per_rollout_epoch % num_action_chunks:
                raise ValueError(
                    f"{name}.max_steps_per_rollout_epoch ({split.max_steps_per_rollout_epoch}) must be a multiple "
                    f"of actor.model.num_action_chunks ({num_action_chunks})"
                )
        self.n_train = split_envs(cfg.train, self.world_size, self.stages, "env.train")
        self.n_eval = split_envs(cfg.eval, self.world_size, self.stages, "env.eval")
        self._train = [
            _Stage(
                make_vec_env(cfg.train, self.n_train, hardware=self._hardware(cfg.train, s, self.n_train)),
                self._seed(cfg.train, s, self.n_train),
                self.chunks,
            )
            for s in range(self.stages)
        ]
        self._eval: list[VecEnv] | None = None
        self._resets = 0
        self.spec: EnvSpec = describe_tasks(self._train[0].env.spec, cfg.train)

    def _seed(self, split: VecEnvConfig, stage: int, n: int) -> int:
        # Global index of this (stage, rank) slice's first env, counted in groups (env i: seed + i // group).
        first = stage * n * self.world_size + self.rank * n
        return split.seed + first // split.group_size

    def _hardware(self, split: VecEnvConfig, stage: int, n: int) -> tuple[dict[str, Any], ...]:
        """The robots the ``n`` envs of pipeline stage ``stage`` drive (none for simulators).

        This worker's hardware units in order, ``n`` per stage, from its node group's ``hardware.configs``.
        """
        if split.env_type != "realworld":
            return ()
        return self.placement.hardware_configs[stage * n : (stage + 1) * n]

    def _peers(self, n: int) -> list[tuple[int, int, int]]:
        return peer_slices(n * self.world_size, self.rank, self.world_size, self.rollout_world_size)

    # --------------------------------------------------------------------------------------- public API
    def get_spec(self) -> EnvSpec:
        """Observation/action description of the training envs."""
        return self.spec

    def interact(
        self,
        rollout_group: str,
        actor_channel: Channel,
        actor_world_size: int = 1,
        *,
        batch: int | None = None,
    ) -> dict[str, Any]:
        """Run ``algorithm.rollout_epoch`` rollouts and put each trajectory on ``actor_channel``.

        Each trajectory (stages concatenated along E) is put once under each key ``0..actor_world_size-1``
        (one per actor rank; ``(batch, rank)`` when ``batch`` is given), with ``env_offset`` (global index of
        its first env) and ``rollout_epoch``. Layout: ``obs [T, E, *obs]``, ``actions [T, E, C(, D)]``,
        ``rewards [T, E, C]``, ``dones [T+1, E, C]`` (row 0: before the first step), ``prev_logprobs
        [T, E, C*D]``, ``prev_values [T+1, E, 1]`` (row T: value of the final observation), ``versions [T, E]``
        (int64: the version of the weights that chose each chunk's actions) and, when the rollout's replies carry
        them, ``forward_inputs`` (a dict of ``[T, E, ...]`` tensors for the policy's training forward).
        HG-DAgger: ``interventions [T, E, C]`` (bool: the expert, or a human the env reports, executed that
        step; ``actions`` then holds what was executed) and, from the rollout's gate, ``discrepancy [T, E]``.

        Returns:
            Episode statistics of the episodes that ended (:meth:`EpisodeStats.as_dict`) and ``env_steps`` (env
            steps simulated by this rank).
        """
        stats = EpisodeStats()
        steps = 0
        t_chunks = self.cfg.train.max_steps_per_rollout_epoch // self.chunks
        peers = self._peers(self.n_train)
        for epoch in range(self.algorithm.rollout_epoch):
            traj: dict[str, Any] = self._rollout_epoch(rollout_group, peers, t_chunks, stats)
            # Lets every actor rank order the messages of a rollout the same way (global env index, epoch).
            traj["env_offset"] = self.rank * self.n_train * self.stages
            traj["rollout_epoch"] = epoch
            steps += t_chunks * self.chunks * self.n_train * self.stages
            with self.timer("put_trajectory"):
                for key in range(actor_world_size):
                    actor_channel.put(traj, key=key if batch is None else (batch, key))
        self._send_end(rollout_group, peers)
        return stats.as_dict() | {"env_steps": steps}

    def evaluate(
        self,
        rollout_group: str,
        video_dir: str | None = None,
        progress: Channel | None = None,
        progress_key: str = "eval_progress",
    ) -> dict[str, Any]:
        """``algorithm.eval_rollout_epoch`` rounds of ``env.eval`` envs from fixed seeds, deterministic actions.

        Each round resets every env and runs until every env's episode ended or
        ``env.eval.max_steps_per_rollout_epoch`` steps passed. Round ``k`` resets from the seeds after those of
        round ``k - 1`` (``env.eval.seed + k * total_num_envs / group_size`` for the first group), so rounds see
        new initial states: with LIBERO's ``init_state_sampling: sequential`` they walk through the
        (task, initial state) pairs in order.

        Args:
            rollout_group: the rollout group answering the observations.
            video_dir: with ``env.eval.video_cfg.save_video``: where this rank writes the MP4 files of its first
                ``video_cfg.num_envs`` envs (first stage), one per episode, in every round.
            progress: a channel for progress reports: at most every ``PROGRESS_EVERY_S`` seconds and at the end
                of each round this rank puts ``{"rank", "done", "total", "episodes"}`` under ``progress_key``
                (chunk steps done and planned over all rounds, episodes finished so far).
            progress_key: the channel key of this evaluation's reports.

        Returns:
            The finished episodes' ``returns``, ``lengths``, ``successes``, ``successes_at_end``, ``tasks``
            (see :class:`~rlinf_core.protocols.EpisodeStats`) and ``videos`` (the files written).
        """
        cfg = self.cfg.eval
        if self._eval is None:
            self._eval = [
                make_vec_env(cfg, self.n_eval, hardware=self._hardware(cfg, s, self.n_eval))
                for s in range(self.stages)
            ]
        peers = self._peers(self.n_eval)
        stats = EpisodeStats()
        files: list[str] = []
        report = None
        if progress is not None:
            report = _ProgressReport(
                progress,
                progress_key,
                self.rank,
                self.algorithm.eval_rollout_epoch * (cfg.max_steps_per_rollout_epoch // self.chunks),
            )
        for round_ in range(self.algorithm.eval_rollout_epoch):
            files += self._eval_round(rollout_group, peers, round_, stats, video_dir, report)
        self._send_end(rollout_group, peers)
        return stats.as_dict() | {"videos": files}

    def _eval_round(
        self,
        rollout_group: str,
        peers: list[tuple[int, int, int]],
        round_: int,
        stats: EpisodeStats,
        video_dir: str | None,
        report: _ProgressReport | None = None,
    ) -> list[str]:
        cfg = self.cfg.eval
        assert self._eval is not None
        offset = round_ * (cfg.total_num_envs // cfg.group_size)
        obs = [env.reset(seed=self._seed(cfg, s, self.n_eval) + offset) for s, env in enumerate(self._eval)]
        finished = [np.zeros(self.n_eval, dtype=bool) for _ in range(self.stages)]
        videos = self._videos(video_dir, obs[0], round_)
        for s in range(self.stages):
            self._send_obs(rollout_group, peers, s, obs[s], None, deterministic=True)
        t_chunks = cfg.max_steps_per_rollout_epoch // self.chunks
        for t in range(t_chunks):
            for s, env in enumerate(self._eval):
                reply = self._recv_reply(rollout_group, peers, s)
                with self.timer("eval_env_step"):
                    res = env.chunk_step(self._actions(reply["actions"]))
                stats.extend(res.episodes)
                ended = res.dones.any(axis=1) & ~finished[s]
                finished[s] |= ended
                obs[s] = res.obs
                if s == 0 and videos is not None:
                    self._record(videos, env, res, ended)
            if t == t_chunks - 1 or all(f.all() for f in finished):
                break
            if report is not None:
                report.step(round_ * t_chunks + t + 1, len(stats.returns))
            for s in range(self.stages):
                self._send_obs(rollout_group, peers, s, obs[s], None, deterministic=True)
        if report is not None:
            report.step((round_ + 1) * t_chunks, len(stats.returns), force=True)
        if videos is None:
            return []
        videos.close()
        return list(videos.files)

    def _videos(self, video_dir: str | None, obs: NpObs, round_: int) -> EpisodeVideos | None:
        video = self.cfg.eval.video_cfg
        if not video.save_video or video_dir is None:
            return None
        assert self._eval is not None
        count = min(video.num_envs, self.n_eval)
        prefix = f"rank{self.rank}" if round_ == 0 else f"rank{self.rank}_round{round_}"
        videos = EpisodeVideos(video, video_dir, prefix, count)
        with self.timer("video_frames"):
            videos.add(frames_of(self._eval[0], obs, video.source, count))
        return videos

    def _record(self, videos: EpisodeVideos, env: VecEnv, res: ChunkStepResult, ended: np.ndarray) -> None:
        """One frame per recorded env; an env whose episode ended gets its last frame and its file."""
        video = self.cfg.eval.video_cfg
        count = len(videos.open)
        with self.timer("video_frames"):
            frames = frames_of(env, res.final_obs if video.source == "obs" else res.obs, video.source, count)
        videos.add(frames)
        # The episodes that ended in this chunk, in the order EpisodeStats lists them (by step, then env).
        order = [int(i) for k in range(res.dones.shape[1]) for i in np.flatnonzero(res.dones[:, k] & ended)]
        ep = res.episodes
        for j, i in enumerate(dict.fromkeys(order)):
            success = ep.successes[j] if j < len(ep.successes) else None
            task = ep.tasks[j] if j < len(ep.tasks) else None
            videos.finish(i, success=success, task=task)

    # ------------------------------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """This rank's training envs mid-episode, picklable.

        Every stage's env state, observation and done flags, the reset counter that seeds the next rollout's
        episodes (``auto_reset`` off) and the process RNGs. The evaluation envs hold no state between evaluations (each starts from a fixed seed).
        """
        return {
            "world_size": self.world_size,
            "resets": self._resets,
            "stages": [
                {
                    "seed": st.seed,
                    "env": st.env.get_state(),
                    "obs": obs_map(np.copy, st.obs),
                    "dones": st.dones.copy(),
                }
                for st in self._train
            ],
            "rng": capture_rng_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; raises ``ValueError`` if it was saved with another env layout."""
        check_state_layout(state, self.world_size, [st.seed for st in self._train])
        for st, saved in zip(self._train, state["stages"], strict=True):
            st.env.set_state(saved["env"])
            st.obs = obs_map(lambda x: np.asarray(x).copy(), saved["obs"])
            st.dones = np.asarray(saved["dones"]).copy()
        self._resets = int(state["resets"])
        restore_rng_state(state["rng"])

    def save_checkpoint(self, path: str) -> None:
        """Write :meth:`state_dict` to ``<path>/env/rank<R>.pkl`` (atomically; call it on every rank)."""
        atomic_write_bytes(self._state_file(path), pickle.dumps(self.state_dict()))

    def load_checkpoint(self, path: str) -> None:
        """Restore what :meth:`save_checkpoint` wrote under ``path``; call it on every rank.

        A checkpoint without env state (written before env state was checkpointed) leaves the envs as they
        are, with a warning: the run continues, but not exactly as an uninterrupted one would.
        """
        file = self._state_file(path)
        if not file.is_file():
            if not file.parent.exists():
                self.log_warning("no env state in %s: the envs start fresh episodes", path)
                return
            raise FileNotFoundError(
                f"{file} is missing: the checkpoint holds env state for another number of env ranks"
            )
        self.load_state_dict(pickle.loads(file.read_bytes()))

    def _state_file(self, path: str) -> Path:
        return Path(path) / CHECKPOINT_SUBDIR / f"rank{self.rank}.pkl"

    # ------------------------------------------------------------------------------------------ internals
    def _rollout_epoch(
        self, rollout_group: str, peers: list[tuple[int, int, int]], t_chunks: int, stats: EpisodeStats
    ) -> dict[str, torch.Tensor]:
        alg = self.algorithm
        rec: list[dict[str, list[Any]]] = [
            {
                k: []
                for k in (
                    "obs",
                    "actions",
                    "rewards",
                    "dones",
                    "logprobs",
                    "values",
                    "versions",
                    "forward_inputs",
                    "next_obs",
                    "terms",
                    "interventions",
                    "discrepancy",
                )
            }
            for _ in range(self.stages)
        ]
        boot: list[np.ndarray | None] = [None] * self.stages
        if not self.cfg.train.auto_reset:
            # One episode per env and rollout (GRPO-style): fresh initial states, shared within each group.
            self._resets += 1
            for stage in self._train:
                stage.obs = stage.env.reset(seed=stage.seed + self._resets * _RESEED_STRIDE)
                stage.dones[:] = False
        for s, stage in enumerate(self._train):
            rec[s]["dones"].append(stage.dones.copy())
            start = np.asarray(stage.dones.any(axis=1) | (not self.cfg.train.auto_reset), dtype=bool)
            self._send_obs(rollout_group, peers, s, stage.obs, None, deterministic=False, new_episode=start)
        for t in range(t_chunks + 1):
            for s, stage in enumerate(self._train):
                reply = self._recv_reply(rollout_group, peers, s)
                mask = boot[s]
                if mask is not None:
                    # γ·V(final obs) for chunks cut by truncation (RLinf's bootstrap on the last reward).
                    fv = np.asarray(reply["final_values"], dtype=np.float32).reshape(-1)
                    rec[s]["rewards"][-1][:, -1] += alg.gamma * fv * mask
                    boot[s] = None
                values = np.asarray(reply["values"], dtype=np.float32).reshape(-1, 1)
                rec[s]["values"].append(values)
                if t == t_chunks:
                    continue
                actions = self._actions(reply["actions"])
                rec[s]["obs"].append(stage.obs)
                rec[s]["logprobs"].append(np.asarray(reply["logprobs"], dtype=np.float32))
                rec[s]["versions"].append(np.asarray(reply["versions"], dtype=np.int64).reshape(-1))
                if reply.get("forward_inputs") is not None:
                    rec[s]["forward_inputs"].append(reply["forward_inputs"])
                if reply.get("discrepancy") is not None:
                    rec[s]["discrepancy"].append(np.asarray(reply["discrepancy"], dtype=np.float32))
                with self.timer("env_step"):
                    res = stage.env.chunk_step(actions)
                executed, flags = _executed(np.asarray(reply["actions"]), reply.get("interventions"), res)
                rec[s]["actions"].append(executed)
                if flags is not None:
                    rec[s]["interventions"].append(flags)
                stats.extend(res.episodes)
                rec[s]["rewards"].append(res.rewards.astype(np.float32, copy=True))
                dones = res.dones
                rec[s]["dones"].append(dones)
                stage.dones = dones
                stage.obs = res.obs
                if self.collect_transitions:
                    rec[s]["next_obs"].append(res.final_obs)
                    rec[s]["terms"].append(res.terminations)
                    start = np.asarray(dones.any(axis=1), dtype=bool)
                    self._send_obs(
                        rollout_group, peers, s, stage.obs, None, deterministic=False, new_episode=start
                    )
                    continue
                if alg.bootstrap_type == "always":
                    need = dones[:, -1]
                else:
                    need = res.truncations[:, -1] & ~res.terminations[:, -1]
                final_obs = None
                if need.any():
                    boot[s] = need.astype(np.float32)
                    final_obs = res.final_obs
                start = np.asarray(dones.any(axis=1), dtype=bool)
                self._send_obs(
                    rollout_group, peers, s, stage.obs, final_obs, deterministic=False, new_episode=start
                )
        parts = [_stack_record(r, transitions=self.collect_transitions) for r in rec]
        traj = {k: obs_concat([p[k] for p in parts], axis=1) for k in parts[0]}
        if not self.cfg.train.auto_reset:
            # Steps after an env's episode ended are padding: mask them out of the loss (RLinf compute_loss_mask).
            traj["loss_mask"], traj["loss_mask_sum"] = compute_loss_mask(traj["dones"])
        return traj

    def _actions(self, actions: Any) -> np.ndarray:
        return np.asarray(actions)

    def _send_obs(
        self,
        rollout_group: str,
        peers: list[tuple[int, int, int]],
        stage: int,
        obs: NpObs,
        final_obs: NpObs | None,
        *,
        deterministic: bool,
        new_episode: np.ndarray | None = None,
    ) -> None:
        with self.timer("send_obs"):
            for peer, lo, hi in peers:
                msg = {
                    "stage": stage,
                    "obs": obs_index(obs, slice(lo, hi)),
                    "final_obs": None if final_obs is None else obs_index(final_obs, slice(lo, hi)),
                    "deterministic": deterministic,
                    "new_episode": None if new_episode is None else new_episode[lo:hi],
                }
                self.send(msg, rollout_group, peer)

    def _recv_reply(
        self, rollout_group: str, peers: list[tuple[int, int, int]], stage: int
    ) -> dict[str, Any]:
        with self.timer("wait_rollout", wait=True):
            replies: list[dict[str, Any]] = [
                self.recv(rollout_group, peer, timeout=_TIMEOUT_S) for peer, _, _ in peers
            ]
        for r in replies:
            if r.get("stage") != stage:
                raise RuntimeError(
                    f"env rank {self.rank}: expected a reply for stage {stage}, got {r.get('stage')}"
                )
        if len(replies) == 1:
            return replies[0]
        out: dict[str, Any] = {}
        for key in (
            "actions",
            "logprobs",
            "values",
            "versions",
            "final_values",
            "interventions",
            "discrepancy",
        ):
            vals = [r.get(key) for r in replies]
            out[key] = None if any(v is None for v in vals) else np.concatenate([np.asarray(v) for v in vals])
        extras = [r.get("forward_inputs") for r in replies]
        out["forward_inputs"] = None if any(v is None for v in extras) else obs_concat(extras)
        return out

    def _send_end(self, rollout_group: str, peers: list[tuple[int, int, int]]) -> None:
        for s in range(self.stages):
            for peer, _, _ in peers:
                self.send({"stage": s, "end": True}, rollout_group, peer)

    def close(self) -> None:
        """Close every simulator."""
        for stage in self._train:
            stage.env.close()
        for env in self._eval or []:
            env.close()


def _stack_record(r: dict[str, list[Any]], *, transitions: bool) -> dict[str, Any]:
    """One stage's recorded steps as ``[T, E_stage, ...]`` tensors, in the trajectory's key names."""
    part: dict[str, Any] = {
        "obs": obs_map(torch.from_numpy, obs_stack(r["obs"])),
        "actions": torch.from_numpy(np.stack(r["actions"])),
        "rewards": torch.from_numpy(np.stack(r["rewards"])),
        "dones": torch.from_numpy(np.stack(r["dones"])),
        "prev_logprobs": torch.from_numpy(np.stack(r["logprobs"])),
        "prev_values": torch.from_numpy(np.stack(r["values"])),
        "versions": torch.from_numpy(np.stack(r["versions"])),
    }
    if r["forward_inputs"]:
        part["forward_inputs"] = obs_map(torch.from_numpy, obs_stack(r["forward_inputs"]))
    if transitions:
        part["next_obs"] = obs_map(torch.from_numpy, obs_stack(r["next_obs"]))
        part["terminations"] = torch.from_numpy(np.stack(r["terms"]))
    for key in ("interventions", "discrepancy"):  # HG-DAgger, when every chunk reported them
        if r[key] and len(r[key]) == len(r["actions"]):
            part[key] = torch.from_numpy(np.stack(r[key]))
    return part


def _executed(actions: np.ndarray, gated: Any, res: ChunkStepResult) -> tuple[np.ndarray, np.ndarray | None]:
    """The actions a chunk executed ``[n, C(, D)]`` and who controlled each step ``[n, C]`` (``None``: nobody said).

    ``gated`` ``[n]``: the rollout's HG-DAgger gate sent the expert's chunk; ``res.interventions``: the env's
    human took over those steps, executing ``res.intervention_actions``.
    """
    n, c = actions.shape[:2]
    flags = None if gated is None else np.repeat(np.asarray(gated, dtype=bool).reshape(n, 1), c, axis=1)
    if res.interventions is None:
        return actions, flags
    human = np.asarray(res.interventions, dtype=bool)
    if res.intervention_actions is not None:
        mask = human.reshape(n, c, *([1] * (actions.ndim - 2)))
        actions = np.where(mask, np.asarray(res.intervention_actions).reshape(actions.shape), actions)
    return actions, human if flags is None else flags | human


_RESEED_STRIDE = 1_000_003
"""Seed offset between successive resets of the training envs when ``auto_reset`` is off."""

_TIMEOUT_S = 600.0
"""Longest wait for a rollout reply (a dead rollout ends the run much sooner through the failure monitor)."""


PROGRESS_EVERY_S = 1.0
"""Least interval between two progress reports of an evaluating env rank (the end of a round always reports)."""


class _ProgressReport:
    """Throttled ``{"rank", "done", "total", "episodes"}`` reports of one evaluation on a channel."""

    def __init__(self, channel: Channel, key: str, rank: int, total: int) -> None:
        self.channel, self.key, self.rank, self.total = channel, key, rank, total
        self.last = float("-inf")

    def step(self, done: int, episodes: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last < PROGRESS_EVERY_S:
            return
        self.last = now
        msg = {"rank": self.rank, "done": min(done, self.total), "total": self.total, "episodes": episodes}
        self.channel.put_nowait(msg, key=self.key)
