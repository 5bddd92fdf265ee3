"""``runner:`` — the training loop settings (key names follow the original RLinf ``runner`` section)."""

from __future__ import annotations

from typing import Literal

import attrs
from attrs import validators as v
from rlinf_core.metrics import BACKENDS

__all__ = ["RUNNER_MODES", "EmbodiedRunnerConfig", "LoggerConfig", "RunnerConfig"]

RUNNER_MODES = ("sync", "async")
"""Values of ``runner.mode`` (embodied app)."""


def _backends(_inst: object, attr: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    unknown = [b for b in value if b not in BACKENDS]
    if unknown:
        raise ValueError(f"unknown logger backend(s) {unknown}; allowed: {', '.join(BACKENDS)}")


@attrs.frozen(kw_only=True)
class LoggerConfig:
    """Where and how metrics are written (config ``runner.logger``)."""

    log_path: str = "runs/embodied"
    """Run directory: ``metrics.jsonl``, ``checkpoints/``, ``tensorboard/``, ``plots/``, ``samples/``."""
    logger_backends: tuple[str, ...] = attrs.field(default=("tensorboard",), validator=_backends)
    """Backends besides the always-written ``metrics.jsonl``: tensorboard, wandb, swanlab."""
    project_name: str = "rlinf"
    """Project name for W&B / SwanLab."""
    experiment_name: str = "embodied"
    """Run name for W&B / SwanLab."""


@attrs.frozen(kw_only=True)
class RunnerConfig:
    """The training loop (config ``runner``)."""

    max_epochs: int = attrs.field(default=100, validator=v.ge(1))
    """Training steps (one rollout + one update each) at most."""
    max_steps: int = attrs.field(default=-1, validator=v.ge(-1))
    """Training steps at most; ``-1``: ``max_epochs`` decides (as in RLinf)."""
    val_check_interval: int = attrs.field(default=5, validator=v.ge(-1))
    """Evaluate every N training steps (before the step, and once at the end); ``-1``/``0``: never."""
    save_interval: int = attrs.field(default=10, validator=v.ge(-1))
    """Checkpoint every N training steps and after the last one; ``0``: only after the last; ``-1``: never."""
    resume_dir: str | None = None
    """A ``global_step_<N>`` checkpoint directory to continue from, or ``auto`` (latest complete one in
    ``logger.log_path``, or a fresh start when there is none)."""
    seed: int = 0
    """Seed of the driver's RNGs (components have their own seeds)."""
    max_checkpoints_to_keep: int | None = attrs.field(default=None)
    """Keep only the newest N checkpoints (``null``: keep all)."""
    stop_eval_return: float | None = None
    """Stop early once ``eval/return_mean`` reaches this value (``null``: run every step)."""
    step_timeout_s: float = attrs.field(default=600.0, validator=v.gt(0.0))
    """Longest a phase of one step (rollout, update, evaluation, checkpoint) may take before the run fails."""
    progress_bar: bool = True
    """Show a tqdm progress bar with the key figures on stderr."""
    profile: bool = False
    """Record the run's timeline: every worker's and the driver's phases go to ``<log_path>/trace.json``
    (Chrome trace event format: open it in https://ui.perfetto.dev or ``chrome://tracing``) and each step's
    busy / wait / idle seconds per group to the metrics (``profile/<group>/*``)."""
    dynamic_scaling: bool = False
    """Reasoning and agent runs with a disaggregated placement: the actor's data-parallel world grows onto the
    rollout's devices once a step's generation is done and shrinks back before the next one. The actor group gets
    one more rank per rollout device (its *elastic* ranks); the rollout releases its devices after generating
    (``offload``: vLLM / SGLang sleep), the elastic ranks bring their shard of the model and optimizer state onto
    them (``onload``) and train with the others, then give the devices back (``offload``) before the rollout
    reloads. Step time drops by the share of the training the extra ranks take; the update is the same."""
    pipeline: bool | None = None
    """Reasoning runs: overlap generation, reward and training within each step (RLinf's pipelined mode).
    Finished rollouts stream through a channel into the actor's micro-batches while the rollout generates the
    next ones; the step still ends with one on-policy optimizer step. ``null``: on when actor and rollout are
    disaggregated (on disjoint devices, RLinf's rule) and the run allows it (GRPO without batch-wide
    normalisation, one optimizer step per RL step, FSDP actor, no dynamic scaling), else off; ``true``: on, or
    an error naming what prevents it; ``false``: generation, reward and training one after another."""
    pipeline_chunk_prompts: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Pipelined mode: prompts per generation request (each with ``algorithm.group_size`` samples); ``null``:
    just enough to fill one actor micro-batch on every actor rank. Smaller chunks start training sooner,
    larger ones keep the generation batch wider."""
    logger: LoggerConfig = attrs.field(factory=LoggerConfig)

    @max_checkpoints_to_keep.validator
    def _check_keep(self, _attr: attrs.Attribute[int | None], value: int | None) -> None:
        if value is not None and value < 1:
            raise ValueError(f"'max_checkpoints_to_keep' must be >= 1 or null: {value}")

    @property
    def total_steps(self) -> int:
        """Training steps of the run: ``min(max_steps, max_epochs)`` (``max_epochs`` when ``max_steps`` is -1)."""
        return self.max_epochs if self.max_steps < 0 else min(self.max_steps, self.max_epochs)


@attrs.frozen(kw_only=True)
class EmbodiedRunnerConfig(RunnerConfig):
    """The embodied training loop (config ``runner`` of the embodied app)."""

    mode: Literal["sync", "async"] = "sync"
    """``sync``: collect a rollout batch, train on it, sync the weights, repeat (``EmbodiedRunner``).
    ``async``: env and rollout keep producing batches while the actor trains, up to
    ``algorithm.staleness_threshold`` versions behind (``AsyncEmbodiedRunner`` with decoupled PPO;
    ``AsyncOffPolicyRunner`` for off-policy losses, the transitions going into the replay buffer)."""
