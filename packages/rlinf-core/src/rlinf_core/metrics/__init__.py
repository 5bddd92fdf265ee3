"""Metric logging (metrics.jsonl, TensorBoard, W&B, SwanLab) and learning-curve plots."""

from ._logger import (
    BACKENDS,
    SAMPLES_SHOWN,
    MetricLogger,
    read_metrics,
    samples_markdown,
    seconds_since_process_start,
    write_samples,
)
from ._plot import plot_run
from ._timeline import plot_timeline

__all__ = [
    "BACKENDS",
    "SAMPLES_SHOWN",
    "MetricLogger",
    "plot_run",
    "plot_timeline",
    "read_metrics",
    "samples_markdown",
    "seconds_since_process_start",
    "write_samples",
]
