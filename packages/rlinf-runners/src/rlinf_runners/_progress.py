"""Logging one runner step: metrics to the logger, the step callback, and the progress bar's summary."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlinf_core.metrics import MetricLogger

__all__ = ["log_step"]


def log_step(
    logger: MetricLogger,
    step: int,
    record: dict[str, float],
    bar: Any,
    *,
    on_step: Callable[[int, dict[str, float]], None] | None,
    last_eval: Mapping[str, float],
    shown: Sequence[tuple[str, str]],
    advance: bool,
) -> None:
    """Log ``record`` at ``step``, call ``on_step``, and show the ``(key, short name)`` pairs on ``bar``.

    Evaluation keys missing from ``record`` are shown from ``last_eval``.
    """
    logged = logger.log(record, step)
    if on_step is not None:
        on_step(step, logged)
    if bar is None:
        return
    if advance:
        bar.update(1)
    postfix = {}
    for key, short in shown:
        value = record.get(key, last_eval.get(key) if key.startswith("eval/") else None)
        if value is not None and not math.isnan(value):
            postfix[short] = f"{value:.3g}"
    bar.set_postfix(postfix, refresh=False)
