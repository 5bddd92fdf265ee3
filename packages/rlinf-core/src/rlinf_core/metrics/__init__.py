"""Metric logging (metrics.jsonl, TensorBoard, W&B, SwanLab) and learning-curve plots."""

from ._logger import BACKENDS, MetricLogger, read_metrics, seconds_since_process_start
from ._plot import plot_run

__all__ = ["BACKENDS", "MetricLogger", "plot_run", "read_metrics", "seconds_since_process_start"]
