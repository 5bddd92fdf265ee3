"""The runner framework: one training loop (``Runner.run``) that every domain's runner fills in through hooks.

:class:`Runner` owns what every run does the same way: seeding the driver, resuming from a checkpoint, the
metric logger and progress bar, the evaluation and checkpoint cadence, the final evaluation and checkpoint,
atomic checkpoints (worker state and runner state staged, then committed), :meth:`Runner.evaluate_checkpoint`
and the :class:`RunResult`. A subclass implements one training step, one evaluation, the weight sync and what
its checkpoints hold; the hooks are listed on :class:`Runner`.
"""

from __future__ import annotations

import abc
import os
import pickle
import random
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from rlinf_core.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    checkpoint_step,
    resolve_resume_dir,
    restore_rng_state,
)
from rlinf_core.metrics import MetricLogger, write_samples
from rlinf_scheduler import RoleCall, RoleGroup, now_us, trace_span
from tqdm.auto import tqdm

from ._config import RunnerConfig
from ._profile import StepProfiler
from ._progress import log_step

__all__ = ["RUNNER_STATE_FILE", "RunResult", "Runner", "StepCallback"]

RUNNER_STATE_FILE = "runner_state.pkl"
"""The runner's own state in a checkpoint directory (next to what the workers save)."""

R = TypeVar("R")

StepCallback = Callable[[int, dict[str, float]], None]
"""``on_step(global_step, record)``: called after each logged record with what the logger wrote."""


class RunResult:
    """What a finished run leaves behind.

    Attributes:
        log_path: the run directory.
        metrics_file: its ``metrics.jsonl``.
        last_checkpoint: the newest complete checkpoint, or ``None``.
        global_step: training steps done.
        last_eval: the metrics of the last evaluation (empty if none ran).
        trace_file: the run's timeline (``runner.profile``), or ``None``.
        busy: with ``runner.profile``, each group's mean busy fraction per training step.
    """

    def __init__(
        self,
        log_path: Path,
        metrics_file: Path,
        last_checkpoint: Path | None,
        global_step: int,
        last_eval: dict[str, float],
        trace_file: Path | None = None,
        busy: dict[str, float] | None = None,
    ) -> None:
        self.log_path = log_path
        self.metrics_file = metrics_file
        self.last_checkpoint = last_checkpoint
        self.global_step = global_step
        self.last_eval = last_eval
        self.trace_file = trace_file
        self.busy = dict(busy or {})

    def __repr__(self) -> str:
        return (
            f"RunResult(log_path={str(self.log_path)!r}, global_step={self.global_step}, "
            f"last_checkpoint={str(self.last_checkpoint) if self.last_checkpoint else None!r})"
        )


class Runner(abc.ABC):
    """The training loop shared by every runner (template method :meth:`run`).

    One run: seed the driver's RNG, remove stale checkpoint staging, resume from ``runner.resume_dir``,
    :meth:`before_training`, then ``runner.total_steps`` times: :meth:`sync_weights`, an evaluation every
    ``runner.val_check_interval`` steps (before the step; the run stops early when :meth:`reached_target`),
    :meth:`train_step`, log, and a checkpoint every ``runner.save_interval`` steps. At the end: one more
    evaluation unless the last step was just evaluated, and a checkpoint of the final step.

    Hooks a subclass implements:

    - :meth:`train_step` ``-> dict``: one training step's metrics (``time/rollout_s`` and ``time/train_s``
      add up to the logged ``time/step_s``);
    - :meth:`evaluate` ``-> dict``: one evaluation's ``eval/*`` metrics, recorded with :meth:`record_eval`
      (an empty dict: nothing to evaluate);
    - :meth:`sync_weights`: bring the rollout's weights up to the actor's;
    - :meth:`save_worker_state` / :meth:`load_worker_state`: the workers' part of a checkpoint;

    and may override :meth:`runner_state` / :meth:`load_runner_state` (more driver state in
    ``runner_state.pkl``), :meth:`before_training` (e.g. a warm-up), :meth:`has_evaluation`,
    :meth:`reached_target`, :meth:`worker_groups` (what ``runner.profile`` traces) and :meth:`release` (free
    what the run created). :attr:`progress_keys` are the
    metrics shown on the progress bar.

    Args:
        cfg: the ``runner`` config.
        run_config: the resolved configuration, stored with W&B / SwanLab runs.
        on_step: called with ``(global_step, record)`` after each logged record (e.g. tests, benchmarks).
    """

    progress_keys: ClassVar[Sequence[tuple[str, str]]] = (("time/step_s", "s/step"),)
    """``(metric, short name)`` pairs shown on the progress bar (evaluation keys from the last evaluation)."""

    def __init__(
        self,
        cfg: RunnerConfig,
        *,
        run_config: Mapping[str, Any] | None = None,
        on_step: StepCallback | None = None,
    ) -> None:
        self.cfg = cfg
        self.run_config = dict(run_config or {})
        self.on_step = on_step
        self.log_path = Path(cfg.logger.log_path)
        self.checkpoints = CheckpointManager(self.log_path, max_to_keep=cfg.max_checkpoints_to_keep)
        self.global_step = 0
        self.last_eval: dict[str, float] = {}
        self._last_eval_step = -1
        self._eval_time_s = 0.0
        self._train_start = time.perf_counter()
        self._samples: list[tuple[str, list[dict[str, Any]]]] = []
        self._profiler: StepProfiler | None = None

    # ---------------------------------------------------------------------------------------------- hooks
    @abc.abstractmethod
    def train_step(self) -> dict[str, float]:
        """One training step (rollout, advantages, update); returns its metrics."""

    @abc.abstractmethod
    def evaluate(self) -> dict[str, float]:
        """One evaluation; returns its ``eval/*`` metrics (empty: nothing to evaluate)."""

    @abc.abstractmethod
    def sync_weights(self) -> None:
        """Send the actor's weights to the rollout."""

    @abc.abstractmethod
    def save_worker_state(self, staging: Path) -> None:
        """Write the workers' part of a checkpoint into the staging directory ``staging``."""

    @abc.abstractmethod
    def load_worker_state(self, path: Path) -> None:
        """Restore the workers from the checkpoint directory ``path``."""

    def runner_state(self) -> dict[str, Any]:
        """Driver state to checkpoint besides the step, the RNG state and the last evaluation."""
        return {}

    def load_runner_state(self, state: Mapping[str, Any] | None) -> None:
        """Restore :meth:`runner_state` (``None``: the checkpoint has no runner state, only its step)."""
        del state  # nothing beyond what run() restores itself

    def before_training(self, logger: MetricLogger) -> None:
        """Runs once before the first training step of :meth:`run` (after any resume)."""
        del logger  # no warm-up by default

    def has_evaluation(self) -> bool:
        """Whether :meth:`evaluate` has anything to evaluate (the final evaluation is skipped otherwise)."""
        return True

    def reached_target(self) -> bool:
        """Whether the last evaluation reached the run's target (then :meth:`run` stops early)."""
        return False

    def release(self) -> None:
        """Free what the run created (called at the end of :meth:`run`, also after an error)."""
        return None  # nothing by default

    def worker_groups(self) -> Sequence[RoleGroup[Any]]:
        """The run's worker groups: ``runner.profile`` records their spans (none: the driver's only)."""
        return ()

    # ------------------------------------------------------------------------------------------ helpers
    def wait(self, call: RoleCall[R]) -> list[R]:
        """The per-rank results of a group call, waiting at most ``runner.step_timeout_s``."""
        return call.wait(timeout=self.cfg.step_timeout_s)

    def record_eval(self, metrics: dict[str, float], start: float, *, main: bool = True) -> dict[str, float]:
        """Finish an evaluation that began at ``perf_counter()`` time ``start``: add ``time/eval_s``.

        The time is kept out of ``time/train_wall_s``. With ``main`` the metrics become :attr:`last_eval`
        (the evaluation of the current step).
        """
        elapsed = time.perf_counter() - start
        self._eval_time_s += elapsed
        metrics["time/eval_s"] = elapsed
        if main:
            self.last_eval = metrics
            self._last_eval_step = self.global_step
        return metrics

    def log(self, logger: MetricLogger, record: dict[str, float], bar: Any, *, advance: bool = False) -> None:
        """Log ``record`` at the current step, call ``on_step`` and update ``bar`` (a tqdm bar or ``None``)."""
        if not record:
            return
        log_step(
            logger,
            self.global_step,
            record,
            bar,
            on_step=self.on_step,
            last_eval=self.last_eval,
            shown=self.progress_keys,
            advance=advance,
        )

    def _train_wall_s(self) -> float:
        return time.perf_counter() - self._train_start - self._eval_time_s

    # ------------------------------------------------------------------------------------ checkpointing
    def save_checkpoint(self) -> Path:
        """Write ``global_step_<N>`` atomically: the workers' state, then the runner's, then commit."""
        staging = self.checkpoints.begin(self.global_step)
        try:
            self.save_worker_state(staging)
            state = {
                "global_step": self.global_step,
                "total_steps": self.cfg.total_steps,
                **self.runner_state(),
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
        # the run's config goes with it, so a resume with another model shape is refused before Ray starts
        meta = {"global_step": self.global_step, "config": self.run_config}
        return self.checkpoints.commit(self.global_step, staging, meta)

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore the workers and the runner from a checkpoint directory (the next step is N + 1)."""
        path = Path(path)
        self.load_worker_state(path)
        runner_state = path / RUNNER_STATE_FILE
        if runner_state.is_file():
            state = pickle.loads(runner_state.read_bytes())
            self.global_step = int(state["global_step"])
            self._check_budget(path, state.get("total_steps"))
            self.load_runner_state(state)
            restore_rng_state(state["rng"])
            self.last_eval = dict(state.get("last_eval", {}))
        else:
            self.global_step = checkpoint_step(path)
            self.load_runner_state(None)

    def _check_budget(self, path: Path, saved: int | None) -> None:
        """Say so when a resume changes the run's step budget (the actor keeps its schedule's total)."""
        if saved is not None and saved != self.cfg.total_steps:
            warnings.warn(
                f"resuming {path} of a run of {saved} training steps with a budget of {self.cfg.total_steps} "
                f"(runner.max_steps / max_epochs): the learning-rate schedule keeps its total of {saved} steps "
                f"unless actor.optim.reset_lr_schedule_on_resume is true",
                UserWarning,
                stacklevel=3,
            )

    def evaluate_checkpoint(self, path: str | Path) -> dict[str, float]:
        """Load a checkpoint into the workers, sync it to the rollout and run one evaluation.

        Args:
            path: a ``global_step_<N>`` directory, or ``auto`` for the latest one in ``logger.log_path``.

        Raises:
            ValueError: if there is no such checkpoint.
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
        for name, rows in self._take_samples():
            write_samples(self.log_path, name, rows, self.global_step)
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
        logger = MetricLogger(
            self.log_path,
            cfg.logger.logger_backends,
            project=cfg.logger.project_name,
            experiment=cfg.logger.experiment_name,
            config=self.run_config,
        )
        bar = None
        self._train_start = time.perf_counter()
        self._eval_time_s = 0.0
        self._profiler = None
        if cfg.profile:
            groups = self.worker_groups()
            rollout = self.run_config.get("rollout")
            metadata = {  # what rlinf-autoplace needs to read the trace back
                "cluster": self.run_config.get("cluster"),
                "pipeline_stage_num": rollout.get("pipeline_stage_num")
                if isinstance(rollout, dict)
                else None,
                "world_sizes": {g.name: g.world_size for g in groups},
                "driver_cpu_count": os.cpu_count(),
            }
            self._profiler = StepProfiler(self.log_path, groups, cfg.step_timeout_s, metadata)
            self._profiler.start()
        finished = False
        try:
            self.before_training(logger)
            if cfg.progress_bar:
                bar = tqdm(
                    total=cfg.total_steps,
                    initial=self.global_step,
                    desc="train",
                    unit="step",
                    dynamic_ncols=True,
                )
            self._loop(logger, bar)
            if (
                self._last_eval_step != self.global_step
                and cfg.val_check_interval > 0
                and self.has_evaluation()
            ):
                with trace_span("sync_weights"):
                    self.sync_weights()
                self._evaluate_and_log(logger, bar)
            if cfg.save_interval >= 0 and self.checkpoints.latest() != self.checkpoints.path_for(
                self.global_step
            ):
                with trace_span("save_checkpoint"):
                    self.save_checkpoint()
            finished = True
        finally:
            if bar is not None:
                bar.close()
            logger.close()
            trace_file = None
            if self._profiler is not None:
                # after an error the workers may be gone: keep what was collected and the driver's spans
                trace_file = self._profiler.finish(workers=finished)
            self.release()
        return RunResult(
            self.log_path,
            self.log_path / "metrics.jsonl",
            self.checkpoints.latest(),
            self.global_step,
            self.last_eval,
            trace_file,
            self._profiler.mean_busy() if self._profiler is not None else None,
        )

    def _loop(self, logger: MetricLogger, bar: Any) -> None:
        cfg = self.cfg
        val = cfg.val_check_interval
        while self.global_step < cfg.total_steps:
            step = self.global_step
            with trace_span("sync_weights"):
                self.sync_weights()
            if val > 0 and step % val == 0:
                self._evaluate_and_log(logger, bar)
                if self.reached_target():
                    return
            start_us = now_us()
            with trace_span(f"train_step {step + 1}"):
                record = self.train_step()
            end_us = now_us()
            self.global_step = step + 1
            record["time/step_s"] = record.get("time/rollout_s", 0.0) + record.get("time/train_s", 0.0)
            record["time/train_wall_s"] = self._train_wall_s()
            if self._profiler is not None:
                self._profiler.collect()
                record.update(self._profiler.step_metrics(start_us, end_us))
                self._profiler.maybe_write()
            self.log(logger, record, bar, advance=True)
            if cfg.save_interval > 0 and self.global_step % cfg.save_interval == 0:
                with trace_span("save_checkpoint"):
                    self.save_checkpoint()

    def _evaluate_and_log(self, logger: MetricLogger, bar: Any) -> None:
        with trace_span("evaluate"):
            evaluation = self.evaluate()
        if evaluation:
            evaluation["time/train_wall_s"] = self._train_wall_s()
        self.log(logger, evaluation, bar)
        self.flush_samples(logger)

    def add_samples(self, name: str, rows: Sequence[Mapping[str, Any]]) -> None:
        """Keep an evaluation's samples (one dict each: prompt, response, reward, ...) for the run's logs.

        They are written to ``<log_path>/samples/<name>_step<N>.jsonl`` and shown in TensorBoard after the
        evaluation is logged (:meth:`rlinf_core.metrics.MetricLogger.log_samples`); a standalone evaluation
        of a checkpoint writes the JSONL file only.
        """
        self._samples.append((name, [dict(r) for r in rows]))

    def flush_samples(self, logger: MetricLogger) -> None:
        """Log the samples kept since the last call at the current step (see :meth:`add_samples`)."""
        for name, rows in self._take_samples():
            logger.log_samples(name, rows, self.global_step)

    def _take_samples(self) -> list[tuple[str, list[dict[str, Any]]]]:
        samples, self._samples = self._samples, []
        return samples
