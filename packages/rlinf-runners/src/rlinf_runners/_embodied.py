"""The embodied training loop: weight sync, env ↔ rollout exchange, actor update, evaluation, checkpoints.

The runner drives three worker groups by method name only (it imports no env, model or rollout code):

- ``actor``: ``sync_model_to_rollout(rollout_group)``, ``recv_rollout_batch(channel, num_messages, timeout)``,
  ``compute_advantages_and_returns()``, ``run_training() -> dict``, ``save_checkpoint(dir)``,
  ``load_checkpoint(dir)``, ``get_model_version()``;
- ``rollout``: ``sync_model_from_actor(actor_group)``, ``generate(env_group, mode)``;
- ``env``: ``interact(rollout_group, actor_channel, actor_world_size) -> dict`` (episode metrics) and
  ``evaluate(rollout_group) -> dict``.
"""

from __future__ import annotations

import math
import pickle
import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rlinf_core.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    checkpoint_step,
    resolve_resume_dir,
    restore_rng_state,
)
from rlinf_core.metrics import MetricLogger
from rlinf_scheduler import Channel
from tqdm.auto import tqdm

from ._config import RunnerConfig
from ._progress import log_step

__all__ = ["EmbodiedRunner", "GroupLike", "RunResult"]

_EMBODIED_SHOWN = (
    ("env/return_mean", "ret"),
    ("eval/return_mean", "eval"),
    ("eval/success_rate", "succ"),
    ("train/actor/total_loss", "loss"),
    ("time/step_s", "s/step"),
)

RUNNER_STATE_FILE = "runner_state.pkl"


class _CallLike(Protocol):
    def wait(self, timeout: float | None = None) -> list[Any]: ...


class GroupLike(Protocol):
    """What the runner needs of a worker group (``rlinf_scheduler.WorkerGroup`` fits)."""

    @property
    def name(self) -> str: ...

    @property
    def world_size(self) -> int: ...

    def call(self, method: str, *args: Any, **kwargs: Any) -> _CallLike: ...


class RunResult:
    """What a finished run leaves behind.

    Attributes:
        log_path: the run directory.
        metrics_file: its ``metrics.jsonl``.
        last_checkpoint: the newest complete checkpoint, or ``None``.
        global_step: training steps done.
        last_eval: the metrics of the last evaluation (empty if none ran).
    """

    def __init__(
        self,
        log_path: Path,
        metrics_file: Path,
        last_checkpoint: Path | None,
        global_step: int,
        last_eval: dict[str, float],
    ) -> None:
        self.log_path = log_path
        self.metrics_file = metrics_file
        self.last_checkpoint = last_checkpoint
        self.global_step = global_step
        self.last_eval = last_eval

    def __repr__(self) -> str:
        return (
            f"RunResult(log_path={str(self.log_path)!r}, global_step={self.global_step}, "
            f"last_checkpoint={str(self.last_checkpoint) if self.last_checkpoint else None!r})"
        )


def _mean_over_ranks(results: Sequence[Mapping[str, float]]) -> dict[str, float]:
    keys: dict[str, None] = {}
    for r in results:
        keys.update(dict.fromkeys(r))
    out = {}
    for k in keys:
        vals = [float(r[k]) for r in results if k in r and not math.isnan(float(r[k]))]
        out[k] = sum(vals) / len(vals) if vals else math.nan
    return out


def _merge_episode_stats(results: Sequence[Mapping[str, Any]], prefix: str) -> dict[str, float]:
    """Episode lists from every env rank → ``<prefix>/return_mean`` etc. weighted by episode."""
    returns: list[float] = []
    lengths: list[float] = []
    successes: list[float] = []
    for r in results:
        returns += list(r.get("returns", []))
        lengths += list(r.get("lengths", []))
        successes += list(r.get("successes", []))
    out: dict[str, float] = {f"{prefix}/num_episodes": float(len(returns))}
    if returns:
        out[f"{prefix}/return_mean"] = sum(returns) / len(returns)
        out[f"{prefix}/return_max"] = max(returns)
        out[f"{prefix}/return_min"] = min(returns)
        out[f"{prefix}/episode_len_mean"] = sum(lengths) / len(lengths)
        out[f"{prefix}/success_rate"] = sum(successes) / len(successes)
    return out


class EmbodiedRunner:
    """Runs embodied RL training over actor, rollout and env worker groups.

    Args:
        cfg: the ``runner`` config.
        actor: the actor group (see the module docstring for the methods it must have).
        rollout: the rollout group.
        env: the env group.
        rollout_epoch: rollouts per training step (``algorithm.rollout_epoch``); each env rank puts one
            trajectory per rollout epoch on the actor channel.
        run_config: the resolved configuration, stored with W&B / SwanLab runs and in checkpoints.
        on_step: called with ``(global_step, record)`` after each logged step (e.g. tests, benchmarks).
        channel: the env → actor channel to use (default: a fresh ``Channel`` created on the first step and
            shut down at the end of :meth:`run`).
    """

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        actor: GroupLike,
        rollout: GroupLike,
        env: GroupLike,
        rollout_epoch: int = 1,
        run_config: Mapping[str, Any] | None = None,
        on_step: Callable[[int, dict[str, float]], None] | None = None,
        channel: Any = None,
    ) -> None:
        self.cfg = cfg
        self.actor = actor
        self.rollout = rollout
        self.env = env
        self.rollout_epoch = rollout_epoch
        self.run_config = dict(run_config or {})
        self.on_step = on_step
        self.log_path = Path(cfg.logger.log_path)
        self.checkpoints = CheckpointManager(self.log_path, max_to_keep=cfg.max_checkpoints_to_keep)
        self.global_step = 0
        self.last_eval: dict[str, float] = {}
        self._channel: Any = channel
        self._owns_channel = channel is None
        self._eval_time_s = 0.0
        self._last_eval_step = -1

    # ------------------------------------------------------------------------------------------ helpers
    def _wait(self, call: _CallLike, what: str) -> list[Any]:
        del what  # the scheduler's timeout error already names the call
        return call.wait(timeout=self.cfg.step_timeout_s)

    def _channel_for_actor(self) -> Any:
        if self._channel is None:
            self._channel = Channel.create(f"{self.env.name}-to-{self.actor.name}-{id(self):x}")
        return self._channel

    def _timings(self) -> dict[str, float]:
        out: dict[str, float] = {}
        groups = (self.actor, self.rollout, self.env)
        calls = [group.call("pop_timings") for group in groups]  # all in flight at once
        for group, call in zip(groups, calls, strict=True):
            per_rank = self._wait(call, "pop_timings")
            names: dict[str, None] = {}
            for r in per_rank:
                names.update(dict.fromkeys(r))
            for name in names:
                key = name if name.startswith(f"{group.name}/") else f"{group.name}/{name}"
                out[f"time/{key}"] = max(float(r.get(name, 0.0)) for r in per_rank)
        return out

    # ---------------------------------------------------------------------------------------- the phases
    def sync_weights(self) -> None:
        """Send the actor's weights to every rollout rank (versioned)."""
        send = self.actor.call("sync_model_to_rollout", self.rollout.name)
        recv = self.rollout.call("sync_model_from_actor", self.actor.name)
        self._wait(send, "actor.sync_model_to_rollout")
        self._wait(recv, "rollout.sync_model_from_actor")

    def evaluate(self) -> dict[str, float]:
        """Run the evaluation envs with deterministic actions; returns ``eval/*`` metrics."""
        start = time.perf_counter()
        serve = self.rollout.call("generate", self.env.name, "eval")
        results = self._wait(self.env.call("evaluate", self.rollout.name), "env.evaluate")
        self._wait(serve, "rollout.generate")
        metrics = _merge_episode_stats(results, "eval")
        self._eval_time_s += time.perf_counter() - start
        metrics["time/eval_s"] = time.perf_counter() - start
        self.last_eval = metrics
        self._last_eval_step = self.global_step
        return metrics

    def collect_and_train(self) -> dict[str, float]:
        """One training step: rollout through the channels, advantages, actor update; returns its metrics."""
        t0 = time.perf_counter()
        channel = self._channel_for_actor()
        num_messages = self.env.world_size * self.rollout_epoch
        gather = self.actor.call("recv_rollout_batch", channel, num_messages, self.cfg.step_timeout_s)
        serve = self.rollout.call("generate", self.env.name, "train")
        env_results = self._wait(
            self.env.call("interact", self.rollout.name, channel, self.actor.world_size), "env.interact"
        )
        self._wait(serve, "rollout.generate")
        self._wait(gather, "actor.recv_rollout_batch")
        t1 = time.perf_counter()
        adv = self._wait(
            self.actor.call("compute_advantages_and_returns"), "actor.compute_advantages_and_returns"
        )
        train = _mean_over_ranks(self._wait(self.actor.call("run_training"), "actor.run_training"))
        t2 = time.perf_counter()
        metrics: dict[str, float] = {}
        if adv and isinstance(adv[0], Mapping):
            metrics.update({k: float(v) for k, v in adv[0].items()})
        for key, value in train.items():
            metrics[key if key.startswith(("train/", "time/")) else f"train/{key}"] = value
        metrics.update(_merge_episode_stats(env_results, "env"))
        steps = sum(float(r.get("env_steps", 0)) for r in env_results)
        metrics["env/steps"] = steps
        metrics["time/rollout_s"] = t1 - t0
        metrics["time/train_s"] = t2 - t1
        metrics["rollout/env_steps_per_s"] = steps / max(t1 - t0, 1e-9)
        return metrics

    # ------------------------------------------------------------------------------------ checkpointing
    def save_checkpoint(self) -> Path:
        """Write ``global_step_<N>`` atomically: the actor's state, then the runner's, then commit."""
        staging = self.checkpoints.begin(self.global_step)
        try:
            self._wait(self.actor.call("save_checkpoint", str(staging)), "actor.save_checkpoint")
            state = {
                "global_step": self.global_step,
                "rng": capture_rng_state(),
                "last_eval": self.last_eval,
            }
            (staging / RUNNER_STATE_FILE).write_bytes(pickle.dumps(state))
        except BaseException:
            self.checkpoints.abort(staging)
            if staging.exists():
                # A worker that failed mid-save may still be writing for a moment; the next run's
                # clean_stale() removes whatever remains (a hidden staging directory is never loaded).
                time.sleep(1.0)
                self.checkpoints.abort(staging)
            raise
        return self.checkpoints.commit(self.global_step, staging, {"global_step": self.global_step})

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the actor and the runner from a checkpoint directory (the next step is N + 1)."""
        path = Path(path)
        self._wait(self.actor.call("load_checkpoint", str(path)), "actor.load_checkpoint")
        runner_state = path / RUNNER_STATE_FILE
        if runner_state.is_file():
            state = pickle.loads(runner_state.read_bytes())
            self.global_step = int(state["global_step"])
            restore_rng_state(state["rng"])
            self.last_eval = dict(state.get("last_eval", {}))
        else:
            self.global_step = checkpoint_step(path)

    def evaluate_checkpoint(self, path: str | Path) -> dict[str, float]:
        """Load a checkpoint into the actor, sync it to the rollout and run one evaluation.

        Args:
            path: a ``global_step_<N>`` directory, or ``auto`` for the latest one in ``logger.log_path``.
        """
        resolved = resolve_resume_dir(str(path), self.log_path)
        if resolved is None:
            raise ValueError(
                f"no complete checkpoint under {self.log_path / 'checkpoints'} (path={str(path)!r})"
            )
        self.load_checkpoint(resolved)
        self.sync_weights()
        metrics = self.evaluate()
        metrics["eval/checkpoint_step"] = float(self.global_step)
        return metrics

    # ------------------------------------------------------------------------------------------- the loop
    def run(self) -> RunResult:
        """Train for ``runner.total_steps`` steps (resuming first if ``runner.resume_dir`` says so)."""
        cfg = self.cfg
        random.seed(cfg.seed)
        self.checkpoints.clean_stale()
        resume = resolve_resume_dir(cfg.resume_dir, self.log_path)
        if resume is not None:
            self.load_checkpoint(resume)
        total = cfg.total_steps
        val = cfg.val_check_interval
        bar = None
        if cfg.progress_bar:
            bar = tqdm(total=total, initial=self.global_step, desc="train", unit="step", dynamic_ncols=True)
        logger = MetricLogger(
            self.log_path,
            cfg.logger.logger_backends,
            project=cfg.logger.project_name,
            experiment=cfg.logger.experiment_name,
            config=self.run_config,
        )
        train_start = time.perf_counter()
        self._eval_time_s = 0.0
        try:
            while self.global_step < total:
                step = self.global_step
                record: dict[str, float] = {}
                self.sync_weights()
                if val > 0 and step % val == 0:
                    evaluation = self.evaluate()
                    evaluation["time/train_wall_s"] = time.perf_counter() - train_start - self._eval_time_s
                    self._log(logger, evaluation, bar, advance=False)
                    if self._reached_target():
                        break
                record.update(self.collect_and_train())
                record.update(self._timings())
                self.global_step = step + 1
                record["time/step_s"] = record.get("time/rollout_s", 0.0) + record.get("time/train_s", 0.0)
                record["time/train_wall_s"] = time.perf_counter() - train_start - self._eval_time_s
                self._log(logger, record, bar)
                if cfg.save_interval > 0 and self.global_step % cfg.save_interval == 0:
                    self.save_checkpoint()
            final: dict[str, float] = {}
            if val > 0 and self._last_eval_step != self.global_step:
                self.sync_weights()
                final.update(self.evaluate())
                final["time/train_wall_s"] = time.perf_counter() - train_start - self._eval_time_s
                self._log(logger, final, bar, advance=False)
            if cfg.save_interval >= 0 and self.checkpoints.latest() != self.checkpoints.path_for(
                self.global_step
            ):
                self.save_checkpoint()
        finally:
            if bar is not None:
                bar.close()
            logger.close()
            if self._owns_channel and self._channel is not None:
                self._channel.shutdown()
                self._channel = None
        return RunResult(
            self.log_path,
            self.log_path / "metrics.jsonl",
            self.checkpoints.latest(),
            self.global_step,
            self.last_eval,
        )

    def _reached_target(self) -> bool:
        target = self.cfg.stop_eval_return
        ret = self.last_eval.get("eval/return_mean")
        return target is not None and ret is not None and ret >= target

    def _log(self, logger: MetricLogger, record: dict[str, float], bar: Any, *, advance: bool = True) -> None:
        log_step(
            logger,
            self.global_step,
            record,
            bar,
            on_step=self.on_step,
            last_eval=self.last_eval,
            shown=_EMBODIED_SHOWN,
            advance=advance,
        )
