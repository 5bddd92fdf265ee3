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

__all__ = [
    "BACKENDS",
    "SAMPLES_SHOWN",
    "MetricLogger",
    "plot_run",
    "read_metrics",
    "samples_markdown",
    "seconds_since_process_start",
    "write_samples",
]
