"""Metric logging: ``metrics.jsonl`` always, TensorBoard, and optional W&B / SwanLab backends."""

from __future__ import annotations

import functools
import json
import math
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from rlinf_core.checkpoint import atomic_write_bytes

__all__ = ["BACKENDS", "SAMPLES_SHOWN", "MetricLogger", "read_metrics", "samples_markdown", "write_samples"]

BACKENDS = ("tensorboard", "wandb", "swanlab")
"""Backends a run can add to the always-on ``metrics.jsonl`` (config ``runner.logger.logger_backends``)."""

_START = time.monotonic()


@functools.cache
def _process_start_boottime() -> float | None:
    """When this process was created, in ``CLOCK_BOOTTIME`` seconds (Linux ``/proc``; ``None`` elsewhere)."""
    try:
        stat = Path("/proc/self/stat").read_text()
        # Field 22 (starttime, clock ticks since boot); fields after the ")" closing the command name start at 3.
        ticks = int(stat[stat.rindex(")") + 2 :].split()[19])
        return ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def seconds_since_process_start() -> float:
    """Seconds since the operating system created this process (interpreter start and imports included).

    Read from ``/proc`` on Linux (10 ms resolution); elsewhere, seconds since ``rlinf_core.metrics`` was
    imported.
    """
    start = _process_start_boottime()
    if start is None or not hasattr(time, "CLOCK_BOOTTIME"):
        return time.monotonic() - _START
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start


class _Backend(Protocol):
    def log(self, metrics: Mapping[str, float], step: int) -> None: ...
    def close(self) -> None: ...


class _JsonlBackend:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = path.open("a", buffering=1)  # line-buffered: a crash loses at most the current line

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._file.write(json.dumps({"step": step, **metrics}, allow_nan=True) + "\n")

    def close(self) -> None:
        self._file.close()


class _TensorBoardBackend:
    def __init__(self, log_dir: Path) -> None:
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(logdir=str(log_dir))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def log_text(self, key: str, text: str, step: int) -> None:
        self._writer.add_text(key, text, global_step=step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class _WandbBackend:
    def __init__(
        self, log_dir: Path, project: str, experiment: str, config: Mapping[str, Any] | None
    ) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ImportError('logger backend "wandb" needs: pip install "rlinf-core[wandb]"') from e
        self._run = wandb.init(project=project, name=experiment, dir=str(log_dir), config=dict(config or {}))

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


class _SwanlabBackend:
    def __init__(
        self, log_dir: Path, project: str, experiment: str, config: Mapping[str, Any] | None
    ) -> None:
        try:
            import swanlab
        except ImportError as e:
            raise ImportError('logger backend "swanlab" needs: pip install "rlinf-core[swanlab]"') from e
        self._swanlab = swanlab
        swanlab.init(
            project=project, experiment_name=experiment, logdir=str(log_dir), config=dict(config or {})
        )

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._swanlab.log(dict(metrics), step=step)

    def close(self) -> None:
        self._swanlab.finish()


def _scalar(value: Any) -> float | None:
    """A plain float from a Python number, numpy scalar or 0-d tensor; None for anything else."""
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "ndim", 0) == 0:
        try:
            return float(item())
        except (TypeError, ValueError):
            return None
    return None


SAMPLES_SHOWN = 8
"""Samples shown in TensorBoard per evaluation (the JSONL file has them all)."""


class MetricLogger:
    """Logs scalar metrics per step to ``<log_path>/metrics.jsonl`` and the configured backends.

    Every record carries ``step``, ``time/wall_s`` (seconds since ``rlinf_core.metrics`` was imported) and
    ``time/since_process_start_s`` (seconds since the process was created, see
    :func:`seconds_since_process_start`: what a user waits for, start-up included). Keys use the
    namespaces ``train/``, ``eval/``, ``env/``, ``rollout/``, ``time/``.

    Args:
        log_path: the run directory (created if missing).
        backends: any of :data:`BACKENDS`; ``metrics.jsonl`` is always written.
        project: project name for W&B / SwanLab.
        experiment: run name for W&B / SwanLab.
        config: the resolved run configuration, stored with W&B / SwanLab runs.
    """

    def __init__(
        self,
        log_path: str | Path,
        backends: Sequence[str] = ("tensorboard",),
        *,
        project: str = "rlinf",
        experiment: str = "default",
        config: Mapping[str, Any] | None = None,
    ) -> None:
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise ValueError(f"logger_backends: unknown {unknown}; allowed: {', '.join(BACKENDS)}")
        self.log_path = Path(log_path)
        self.log_path.mkdir(parents=True, exist_ok=True)
        self._backends: list[_Backend] = [_JsonlBackend(self.log_path / "metrics.jsonl")]
        for name in dict.fromkeys(backends):
            if name == "tensorboard":
                self._backends.append(_TensorBoardBackend(self.log_path / "tensorboard"))
            elif name == "wandb":
                self._backends.append(_WandbBackend(self.log_path, project, experiment, config))
            else:
                self._backends.append(_SwanlabBackend(self.log_path, project, experiment, config))

    @property
    def metrics_file(self) -> Path:
        """Path of the ``metrics.jsonl`` file."""
        return self.log_path / "metrics.jsonl"

    def log(self, metrics: Mapping[str, Any], step: int) -> dict[str, float]:
        """Log ``metrics`` (numbers, numpy scalars, 0-d tensors; others dropped) at ``step``; returns the record."""
        record = {k: v for k, v in ((k, _scalar(v)) for k, v in metrics.items()) if v is not None}
        record["time/wall_s"] = time.monotonic() - _START
        record["time/since_process_start_s"] = seconds_since_process_start()
        for backend in self._backends:
            backend.log(record, step)
        return record

    def log_samples(
        self, name: str, rows: Sequence[Mapping[str, Any]], step: int, *, shown: int = SAMPLES_SHOWN
    ) -> Path:
        """Write ``rows`` (one dict per sample, e.g. prompt, response, reward) to a JSONL file; show a few.

        The file is ``<log_path>/samples/<name>_step<step>.jsonl`` (see :func:`write_samples`); TensorBoard
        gets the first ``shown`` rows as a table under the text tab (tag ``samples/<name>``).

        Returns:
            The path of the JSONL file.
        """
        path = write_samples(self.log_path, name, rows, step)
        table = samples_markdown(rows[:shown])
        for backend in self._backends:
            log_text = getattr(backend, "log_text", None)
            if log_text is not None and table:
                log_text(f"samples/{name}", table, step)
        return path

    def close(self) -> None:
        """Flush and close every backend."""
        for backend in self._backends:
            backend.close()
        self._backends.clear()

    def __enter__(self) -> MetricLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_samples(log_path: str | Path, name: str, rows: Sequence[Mapping[str, Any]], step: int) -> Path:
    """Write ``rows`` to ``<log_path>/samples/<name>_step<step>.jsonl``, one JSON object per line (atomically).

    Returns:
        The path written.
    """
    out = Path(log_path) / "samples" / f"{name}_step{step}.jsonl"
    text = "".join(json.dumps({"step": step, **row}, default=str, ensure_ascii=False) + "\n" for row in rows)
    atomic_write_bytes(out, text.encode("utf-8"))
    return out


def samples_markdown(rows: Sequence[Mapping[str, Any]], *, max_chars: int = 600) -> str:
    """A markdown table of ``rows`` (columns: the union of their keys, in first-seen order; long cells cut)."""
    if not rows:
        return ""
    columns = list(dict.fromkeys(k for row in rows for k in row))

    def cell(value: Any) -> str:
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        if len(text) > max_chars:
            text = text[:max_chars] + " ..."
        return text.replace("|", "\\|").replace("\n", "<br>")

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in rows]
    return "\n".join(lines)


def read_metrics(path: str | Path) -> list[dict[str, float]]:
    """Read a ``metrics.jsonl`` file (or a run directory containing one) into a list of records.

    A truncated last line (a crash mid-write) is skipped.
    """
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    records = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        records.append({k: (float(v) if v is not None else math.nan) for k, v in rec.items()})
    return records
