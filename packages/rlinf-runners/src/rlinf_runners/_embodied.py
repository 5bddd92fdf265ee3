"""The embodied training loop: weight sync, env ↔ rollout exchange, actor update, evaluation, checkpoints.

The runner drives three worker groups through their role protocols (``rlinf_core.protocols``; it imports no
env, model or rollout code):

- ``actor`` (:class:`~rlinf_core.protocols.EmbodiedActor`): ``sync_model_to_rollout``, ``recv_rollout_batch``,
  ``compute_advantages_and_returns``, ``run_training``, ``save_checkpoint``, ``load_checkpoint``;
- ``rollout`` (:class:`~rlinf_core.protocols.EmbodiedRollout`): ``sync_model_from_actor``, ``generate``,
  ``save_checkpoint``, ``load_checkpoint``;
- ``env`` (:class:`~rlinf_core.protocols.EnvRole`): ``interact`` (episode metrics), ``evaluate``,
  ``save_checkpoint``, ``load_checkpoint``;
- all three: ``pop_timings`` for the ``time/<group>/*`` metrics.
"""

from __future__ import annotations

import abc
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, TypeVar

from rlinf_core.checkpoint import atomic_write_bytes
from rlinf_core.protocols import EmbodiedActor, EmbodiedRollout, EnvRole, TimedRole, TrajectoryActor
from rlinf_scheduler import Channel, Empty, RoleCall, RoleGroup
from tqdm.auto import tqdm

from ._base import Runner, StepCallback
from ._config import RunnerConfig
from ._metrics import mean_over_ranks

__all__ = ["EmbodiedRunner", "EnvRunner", "per_task_results", "results_markdown", "rollout_metrics"]

A = TypeVar("A", bound=TrajectoryActor)
R = TypeVar("R")


def _merge_episode_stats(results: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    """Episode lists from every env rank → ``<prefix>/return_mean`` etc. weighted by episode."""
    episodes = _episode_lists(results)
    returns, lengths = episodes["returns"], episodes["lengths"]
    out: dict[str, float] = {f"{prefix}/num_episodes": float(len(returns))}
    if returns:
        out[f"{prefix}/return_mean"] = sum(returns) / len(returns)
        out[f"{prefix}/return_max"] = max(returns)
        out[f"{prefix}/return_min"] = min(returns)
        out[f"{prefix}/episode_len_mean"] = sum(lengths) / len(lengths)
    # Only envs that define success report it (not CartPole or Pendulum): success_rate is RLinf's success_once.
    for key, name in (("successes", "success_rate"), ("successes_at_end", "success_at_end")):
        if episodes[key]:
            out[f"{prefix}/{name}"] = sum(episodes[key]) / len(episodes[key])
    return out


def _episode_lists(results: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The env ranks' episode lists concatenated (rank order)."""
    keys = ("returns", "lengths", "successes", "successes_at_end", "tasks", "videos")
    out: dict[str, list[Any]] = {k: [] for k in keys}
    for r in results:
        for k in keys:
            out[k] += list(r.get(k, []))
    return out


def per_task_results(results: Sequence[Mapping[str, Any]], default_task: str) -> dict[str, Any]:
    """An evaluation's episodes grouped by task: what ``eval/results.json`` holds.

    Args:
        results: the env ranks' ``evaluate`` results.
        default_task: the task name of episodes whose env reports none (single-task envs: the env id).

    Returns:
        ``{"tasks": [{"task", "episodes", "success_rate", "success_at_end", "return_mean"}, ...], "episodes",
        "success_rate", "return_mean", "videos"}``; success entries are ``None`` for tasks without success.
    """
    ep = _episode_lists(results)
    n = len(ep["returns"])
    tasks = ep["tasks"] if len(ep["tasks"]) == n else [default_task] * n
    rows = []
    for task in dict.fromkeys(tasks):
        idx = [i for i, t in enumerate(tasks) if t == task]
        rows.append(
            {
                "task": task,
                "episodes": len(idx),
                "success_rate": _mean([ep["successes"][i] for i in idx if i < len(ep["successes"])]),
                "success_at_end": _mean(
                    [ep["successes_at_end"][i] for i in idx if i < len(ep["successes_at_end"])]
                ),
                "return_mean": _mean([ep["returns"][i] for i in idx]),
            }
        )
    return {
        "tasks": rows,
        "episodes": n,
        "success_rate": _mean(ep["successes"]),
        "return_mean": _mean(ep["returns"]),
        "videos": ep["videos"],
    }


def _mean(values: Sequence[float]) -> float | None:
    return float(sum(values) / len(values)) if values else None


def results_markdown(table: Mapping[str, Any], title: str) -> str:
    """The per-task table of :func:`per_task_results` as Markdown."""

    def fmt(x: float | None) -> str:
        return "-" if x is None else f"{x:.3f}"

    lines = [
        f"# {title}",
        "",
        "| task | episodes | success rate | success at end | mean return |",
        "|---|---:|---:|---:|---:|",
    ]
    for row in table["tasks"]:
        lines.append(
            f"| {row['task']} | {row['episodes']} | {fmt(row['success_rate'])} | {fmt(row['success_at_end'])} "
            f"| {fmt(row['return_mean'])} |"
        )
    lines += ["", f"All: {table['episodes']} episodes, success rate {fmt(table['success_rate'])}."]
    if table["videos"]:
        lines += ["", "Videos: " + ", ".join(Path(v).name for v in table["videos"])]
    return "\n".join(lines) + "\n"


def rollout_metrics(env_results: Sequence[Mapping[str, Any]], seconds: float) -> dict[str, float]:
    """The metrics of one rollout batch's env results, collected in ``seconds``.

    ``env/*`` episode statistics, ``env/steps``, ``time/rollout_s`` (``seconds``) and
    ``rollout/env_steps_per_s``.
    """
    metrics = _merge_episode_stats(env_results, "env")
    steps = sum(float(r.get("env_steps", 0)) for r in env_results)
    metrics["env/steps"] = steps
    metrics["time/rollout_s"] = seconds
    metrics["rollout/env_steps_per_s"] = steps / max(seconds, 1e-9)
    return metrics


class EnvRunner(Runner, Generic[A]):
    """What every embodied runner shares over actor, rollout and env groups.

    The env ↔ rollout exchange into the actor's channel, weight sync, evaluation, timings, checkpoints of the
    three groups and the stop target. A subclass implements :meth:`train_step` (with :meth:`collect` for the rollout
    phase) and :meth:`update` (what the asynchronous runners call after each received batch).

    Args:
        cfg: the ``runner`` config.
        actor: the actor group (a ``TrajectoryActor`` role: it takes trajectories from the channel).
        rollout: the rollout group.
        env: the env group.
        rollout_epoch: rollouts per training step (``algorithm.rollout_epoch``); each env rank puts one
            trajectory per rollout epoch on the actor channel.
        random_warmup_steps: the first rollout batches, whose actions are uniform over the action bounds (the
            off-policy warm-up, ``algorithm.random_warmup_steps``; the policy must offer random actions).
        run_config: the resolved configuration, stored with W&B / SwanLab runs and in checkpoints.
        on_step: called with ``(global_step, record)`` after each logged step (e.g. tests, benchmarks).
        channel: the env → actor channel to use (default: a fresh ``Channel`` created on the first step and
            shut down at the end of :meth:`run`).
    """

    progress_keys: ClassVar[Sequence[tuple[str, str]]] = (
        ("env/return_mean", "ret"),
        ("eval/return_mean", "eval"),
        ("eval/success_rate", "succ"),
        ("train/actor/total_loss", "loss"),
        ("time/step_s", "s/step"),
    )

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        actor: RoleGroup[A],
        rollout: RoleGroup[EmbodiedRollout],
        env: RoleGroup[EnvRole],
        rollout_epoch: int = 1,
        random_warmup_steps: int = 0,
        run_config: Mapping[str, Any] | None = None,
        on_step: StepCallback | None = None,
        channel: Any = None,
        eval_task_name: str = "eval",
        video_dir: str | None = None,
    ) -> None:
        super().__init__(cfg, run_config=run_config, on_step=on_step)
        self.eval_task_name = eval_task_name
        """Task name in ``eval/results.json`` for envs that report none (the eval env id)."""
        self.video_dir = video_dir
        """Where evaluation videos go (``None``: ``<log_path>/eval/global_step_<N>/videos``)."""
        self.actor = actor
        self.rollout = rollout
        self.env = env
        self.rollout_epoch = rollout_epoch
        self.random_warmup_steps = random_warmup_steps
        self._channel: Any = channel
        self._owns_channel = channel is None
        self._eval_count = 0  # keys each evaluation's progress reports apart on the channel

    # ------------------------------------------------------------------------------------------ helpers

    def _channel_for_actor(self) -> Any:
        if self._channel is None:
            self._channel = Channel.create(f"{self.env.name}-to-{self.actor.name}-{id(self):x}")
        return self._channel

    def _timings(self) -> dict[str, float]:
        out: dict[str, float] = {}
        groups: tuple[RoleGroup[TimedRole], ...] = (self.actor, self.rollout, self.env)
        calls = [group.call(TimedRole.pop_timings) for group in groups]  # all in flight at once
        for group, call in zip(groups, calls, strict=True):
            per_rank = self.result(call)
            names: dict[str, None] = {}
            for r in per_rank:
                names.update(dict.fromkeys(r))
            for name in names:
                key = name if name.startswith(f"{group.name}/") else f"{group.name}/{name}"
                out[f"time/{key}"] = max(float(r.get(name, 0.0)) for r in per_rank)
        return out

    def result(self, call: RoleCall[R]) -> list[R]:
        """The per-rank results of ``call`` (:meth:`wait`; the asynchronous runner keeps producing meanwhile)."""
        return self.wait(call)

    @property
    def num_messages(self) -> int:
        """Trajectory messages of one rollout batch per actor rank: env ranks x ``rollout_epoch``."""
        return self.env.world_size * self.rollout_epoch

    def generate_options(self) -> dict[str, Any]:
        """Extra keywords of ``EmbodiedRollout.generate`` (none here; the weights channel when asynchronous)."""
        return {}

    def rollout_mode(self, batch: int) -> Literal["train", "random"]:
        """How the rollout acts in rollout batch ``batch``: ``random`` during the warm-up, then ``train``."""
        return "random" if batch < self.random_warmup_steps else "train"

    @abc.abstractmethod
    def update(self) -> dict[str, float]:
        """The actor's update after a rollout batch was received: its metrics and ``time/train_s``."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------------- the phases
    def sync_weights(self) -> None:
        """Send the actor's weights to every rollout rank (versioned)."""
        send = self.actor.call(TrajectoryActor.sync_model_to_rollout, self.rollout.name)
        recv = self.rollout.call(EmbodiedRollout.sync_model_from_actor, self.actor.name)
        self.wait(send)
        self.wait(recv)

    def evaluate(self) -> dict[str, float]:
        """Run the evaluation envs with deterministic actions; returns ``eval/*`` metrics."""
        start = time.perf_counter()
        out_dir = self.log_path / "eval" / f"global_step_{self.global_step}"
        video_dir = self.video_dir or str(out_dir / "videos")
        serve = self.rollout.call(EmbodiedRollout.generate, self.env.name, "eval", **self.generate_options())
        progress = self._channel_for_actor() if self.cfg.progress_bar else None
        self._eval_count += 1
        key = f"eval_progress_{self._eval_count}"
        results = self._wait_showing_progress(
            self.env.call(EnvRole.evaluate, self.rollout.name, video_dir, progress, key), progress, key
        )
        self.wait(serve)
        metrics = self.record_eval(_merge_episode_stats(results, "eval"), start)
        self._write_results(results, out_dir)
        return metrics

    def _wait_showing_progress(
        self, call: RoleCall[dict[str, Any]], channel: Channel | None, key: str
    ) -> list[dict[str, Any]]:
        """:meth:`wait` for an evaluation, meanwhile showing the env ranks' progress reports as a tqdm bar.

        The bar counts chunk steps of the slowest rank over all evaluation rounds, with the episodes finished
        so far; it is removed when the evaluation ends.
        """
        if channel is None:
            return self.wait(call)
        limit = self.cfg.step_timeout_s
        deadline = None if limit is None else time.monotonic() + limit
        done: dict[int, int] = {}
        episodes: dict[int, int] = {}
        bar = None
        try:
            while not call.done() and (deadline is None or time.monotonic() < deadline):
                try:
                    msg = channel.get(key=key, timeout=0.5)
                except Empty:
                    continue
                done[msg["rank"]], episodes[msg["rank"]] = msg["done"], msg["episodes"]
                if bar is None:
                    bar = tqdm(total=msg["total"], desc="eval", unit="chunk", leave=False, dynamic_ncols=True)
                bar.n = min(done.values()) if len(done) == self.env.world_size else 0
                bar.set_postfix(episodes=sum(episodes.values()), refresh=False)
                bar.refresh()
        finally:
            if bar is not None:
                bar.close()
        results = self.wait(call)  # raises, naming the call, when the deadline passed
        while True:  # reports that arrived after the last read
            try:
                channel.get_nowait(key=key)
            except Empty:
                break
        return results

    def _write_results(self, results: Sequence[Mapping[str, Any]], out_dir: Path) -> None:
        """``results.json`` / ``results.md`` (per task) in ``out_dir`` and, as the latest, in ``<log_path>/eval``."""
        table = per_task_results(results, self.eval_task_name) | {"global_step": self.global_step}
        text = json.dumps(table, indent=2)
        md = results_markdown(table, f"Evaluation at step {self.global_step}")
        for where in (out_dir, self.log_path / "eval"):
            atomic_write_bytes(where / "results.json", text.encode())
            atomic_write_bytes(where / "results.md", md.encode())

    def collect(self, mode: Literal["train", "random"] = "train") -> dict[str, float]:
        """One rollout phase: the envs step with the rollout's actions, trajectories reach the actor ranks.

        Args:
            mode: ``train`` samples the policy, ``random`` draws uniform actions (off-policy warm-up).

        Returns:
            ``env/*`` episode statistics and ``env/steps``, ``time/rollout_s``, ``rollout/env_steps_per_s``.
        """
        t0 = time.perf_counter()
        channel = self._channel_for_actor()
        gather = self.actor.call(
            TrajectoryActor.recv_rollout_batch, channel, self.num_messages, self.cfg.step_timeout_s
        )
        serve = self.rollout.call(EmbodiedRollout.generate, self.env.name, mode)
        env_results = self.wait(
            self.env.call(EnvRole.interact, self.rollout.name, channel, self.actor.world_size)
        )
        self.wait(serve)
        self.wait(gather)
        return rollout_metrics(env_results, time.perf_counter() - t0)

    # ------------------------------------------------------------------------------------ checkpointing
    def save_worker_state(self, staging: Path) -> None:
        """The actor's weights and optimizer, the rollout's sampling RNGs, the envs' episodes in progress."""
        calls = [  # all in flight at once: each group writes its own subdirectory
            self.actor.call(TrajectoryActor.save_checkpoint, str(staging)),
            self.rollout.call(EmbodiedRollout.save_checkpoint, str(staging)),
            self.env.call(EnvRole.save_checkpoint, str(staging)),
        ]
        for call in calls:
            self.wait(call)

    def load_worker_state(self, path: Path) -> None:
        """Restore what :meth:`save_worker_state` wrote: the next rollout continues the saved episodes."""
        calls = [
            self.actor.call(TrajectoryActor.load_checkpoint, str(path)),
            self.rollout.call(EmbodiedRollout.load_checkpoint, str(path)),
            self.env.call(EnvRole.load_checkpoint, str(path)),
        ]
        for call in calls:
            self.wait(call)

    # ------------------------------------------------------------------------------------- run hooks
    def reached_target(self) -> bool:
        """Whether ``eval/return_mean`` reached ``runner.stop_eval_return``."""
        target = self.cfg.stop_eval_return
        ret = self.last_eval.get("eval/return_mean")
        return target is not None and ret is not None and ret >= target

    def worker_groups(self) -> Sequence[RoleGroup[Any]]:
        """Actor, rollout and env (what ``runner.profile`` traces)."""
        return (self.actor, self.rollout, self.env)

    def release(self) -> None:
        """Shut the env → actor channel down if the runner created it."""
        if self._owns_channel and self._channel is not None:
            self._channel.shutdown()
            self._channel = None


class EmbodiedRunner(EnvRunner[EmbodiedActor]):
    """Runs embodied (on-policy) RL training over actor, rollout and env worker groups.

    One step: :meth:`collect`, advantages and the PPO-family update on the actor (an ``EmbodiedActor``); the
    rest is :class:`EnvRunner`'s. The arguments are :class:`EnvRunner`'s.
    """

    def collect_and_train(self) -> dict[str, float]:
        """One training step: rollout through the channels, advantages, actor update; returns its metrics."""
        metrics = self.collect()
        metrics.update(self.update())
        return metrics

    def update(self) -> dict[str, float]:
        """Advantages and the actor update on the received batch: their metrics and ``time/train_s``."""
        t1 = time.perf_counter()
        adv = self.result(self.actor.call(EmbodiedActor.compute_advantages_and_returns))
        train = mean_over_ranks(self.result(self.actor.call(EmbodiedActor.run_training)))
        metrics = {"time/train_s": time.perf_counter() - t1}
        if adv and isinstance(adv[0], Mapping):
            metrics.update({k: float(v) for k, v in adv[0].items()})
        for key, value in train.items():
            metrics[key if key.startswith(("train/", "time/")) else f"train/{key}"] = value
        return metrics

    def train_step(self) -> dict[str, float]:
        """:meth:`collect_and_train` plus every group's phase timings (``time/<group>/*``)."""
        record = self.collect_and_train()
        record.update(self._timings())
        return record
