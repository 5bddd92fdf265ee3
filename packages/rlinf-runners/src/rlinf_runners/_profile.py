"""``runner.profile``: the run's timeline (``<log_path>/trace.json``) and each step's busy / idle time per group.

While a profiled run trains, every worker and the driver record their phases as spans
(:mod:`rlinf_scheduler._trace`). After each training step the runner collects the spans of every group, adds
``profile/<group>/{busy_s,wait_s,idle_s,busy_frac}`` for the step's window to the step's metrics and rewrites
the trace file, so a run that crashes leaves the timeline of its last complete step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rlinf_core.protocols import TracedRole
from rlinf_scheduler import DRIVER, RoleGroup, Timeline, enable_tracing, take_trace

__all__ = ["TRACE_FILE", "StepProfiler"]

TRACE_FILE = "trace.json"
"""The timeline of a profiled run, in its ``logger.log_path``."""


class StepProfiler:
    """Collects a run's spans into one :class:`~rlinf_scheduler.Timeline` and sums each step's usage.

    Args:
        log_path: the run directory (the trace goes to ``<log_path>/trace.json``).
        groups: the run's worker groups.
        timeout: seconds to wait for the workers' answers.
        metadata: stored under ``otherData`` in the trace (e.g. the placement).
    """

    def __init__(
        self,
        log_path: Path,
        groups: Sequence[RoleGroup[Any]],
        timeout: float,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.path = log_path / TRACE_FILE
        self.groups = tuple(groups)
        self.timeout = timeout
        self.metadata = dict(metadata or {})
        self.timeline = Timeline()
        self._busy: dict[str, list[float]] = {}
        self._last_write = -math.inf
        self._write_s = 0.0

    def start(self) -> None:
        """Turn the span recorders on, the driver's and every worker's."""
        enable_tracing(True)
        calls = [g.call(TracedRole.set_tracing, True) for g in self.groups]
        for call in calls:
            call.wait(timeout=self.timeout)

    def collect(self, *, workers: bool = True) -> None:
        """Add the spans recorded since the last call (``workers=False``: the driver's only)."""
        if workers:
            calls = [g.call(TracedRole.pop_trace) for g in self.groups]  # all in flight at once
            for call in calls:
                for trace in call.wait(timeout=self.timeout):
                    self.timeline.add(trace)
        self.timeline.add(take_trace(DRIVER))

    def step_metrics(self, start_us: float, end_us: float) -> dict[str, float]:
        """``profile/<group>/*`` of the window ``[start_us, end_us]`` (call after :meth:`collect`)."""
        out: dict[str, float] = {}
        for group, usage in self.timeline.usage(start_us, end_us).items():
            out[f"profile/{group}/busy_s"] = usage.busy_s
            out[f"profile/{group}/wait_s"] = usage.wait_s
            out[f"profile/{group}/idle_s"] = usage.idle_s
            out[f"profile/{group}/busy_frac"] = usage.busy_frac
            self._busy.setdefault(group, []).append(usage.busy_frac)
        return out

    def write(self) -> Path:
        """Rewrite the trace file with every span so far."""
        start = time.perf_counter()
        path = self.timeline.write(self.path, self.metadata)
        self._last_write = time.perf_counter()
        self._write_s = self._last_write - start
        return path

    def maybe_write(self) -> None:
        """:meth:`write` unless the last write was recent: rewriting costs at most ~5% of the run's time."""
        if time.perf_counter() - self._last_write >= 20 * self._write_s:
            self.write()

    def mean_busy(self) -> dict[str, float]:
        """Per group, the mean busy fraction over the profiled steps."""
        return {g: math.fsum(v) / len(v) for g, v in self._busy.items() if v}

    def finish(self, *, workers: bool) -> Path:
        """Collect what is left (from the workers too when ``workers``), write the trace, stop recording."""
        try:
            self.collect(workers=workers)
            if workers:
                calls = [g.call(TracedRole.set_tracing, False) for g in self.groups]
                for call in calls:
                    call.wait(timeout=self.timeout)
        finally:
            enable_tracing(False)
            path = self.write()
        return path
