"""Timeline spans of a run, written in Chrome's trace event format (Perfetto, ``chrome://tracing``).

Every process (the driver and each worker) has one span recorder, off until :func:`enable_tracing` (a worker:
``Worker.set_tracing``). While it is on, ``Worker.timer`` sections, blocking channel ``put``/``get`` and
point-to-point ``send``/``recv`` record a :class:`Span` each: a name, a category (:data:`COMPUTE` or
:data:`WAIT`), a wall-clock start, a duration and the CPU time the process used meanwhile (in the event's
``args.cpu_ms``). Starts come from one monotonic clock per process shifted to
the epoch once, so spans of processes on one node line up to the microsecond; across nodes they are as close
as the nodes' clocks.

The driver gathers each worker's spans (``Worker.pop_trace`` returns a :class:`ProcessTrace`) into a
:class:`Timeline`, which writes the trace file and :meth:`Timeline.usage` sums, per group, the time its ranks
computed, waited and stood idle in a window (a training step). :func:`load_trace` reads a trace file back and
checks it against the format.

Format reference: the "Trace Event Format" document of the Chromium project (JSON object format: a
``traceEvents`` list; complete events ``ph: "X"`` with ``ts``/``dur`` in microseconds; metadata events
``ph: "M"`` naming processes and threads).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

__all__ = [
    "CATEGORIES",
    "COMPUTE",
    "DRIVER",
    "WAIT",
    "GroupUsage",
    "ProcessTrace",
    "Span",
    "Timeline",
    "enable_tracing",
    "load_trace",
    "now_us",
    "take_trace",
    "trace_span",
    "tracing_enabled",
]

COMPUTE = "compute"
"""Category of a span doing the component's own work (a simulator step, inference, a training update)."""
WAIT = "wait"
"""Category of a span blocked on another component (channel ``get``/``put``, ``recv``/``send``, waiting for
the env or the rollout). A wait inside a compute span counts as waiting."""
CATEGORIES = (COMPUTE, WAIT)

DRIVER = "driver"
"""The process label of the driver (the runner) in a :class:`Timeline`."""

MAX_SPANS = 1_000_000
"""Spans a process keeps between two :func:`take_trace` calls; later ones are counted as dropped."""


@attrs.frozen
class Span:
    """One timed section of one thread."""

    name: str
    cat: str
    """:data:`COMPUTE` or :data:`WAIT`."""
    start_us: float
    """Wall-clock start, microseconds since the epoch."""
    dur_us: float
    thread: str
    """Name of the thread that ran it."""
    cpu_us: float = -1.0
    """CPU time the whole process used meanwhile (all its threads), microseconds; ``-1``: not measured."""

    @property
    def end_us(self) -> float:
        """Wall-clock end, microseconds since the epoch."""
        return self.start_us + self.dur_us


@attrs.frozen
class ProcessTrace:
    """The spans one process recorded since it was last asked (``Worker.pop_trace``)."""

    label: str
    """``group:rank`` for a worker, :data:`DRIVER` for the driver."""
    node: str
    """Host name of the process's node."""
    os_pid: int
    spans: tuple[Span, ...]
    dropped: int = 0
    """Spans not kept because more than :data:`MAX_SPANS` were waiting."""


class _Recorder:
    """The span buffer of this process."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.enabled = False
        self.spans: list[Span] = []
        self.dropped = 0
        # one monotonic clock, shifted to the epoch once: spans never go backwards when the wall clock is set
        self.epoch_offset_ns = time.time_ns() - time.perf_counter_ns()

    def record(self, name: str, cat: str, start_ns: int, end_ns: int, cpu_ns: int = -1000) -> None:
        span = Span(
            name,
            cat,
            (start_ns + self.epoch_offset_ns) / 1000.0,
            (end_ns - start_ns) / 1000.0,
            threading.current_thread().name,
            cpu_ns / 1000.0,
        )
        with self.lock:
            if len(self.spans) < MAX_SPANS:
                self.spans.append(span)
            else:
                self.dropped += 1


_RECORDER = _Recorder()


def enable_tracing(enabled: bool) -> None:
    """Turn this process's span recorder on or off (spans recorded so far are kept until taken)."""
    _RECORDER.enabled = bool(enabled)


def tracing_enabled() -> bool:
    """Whether this process records spans."""
    return _RECORDER.enabled


def now_us() -> float:
    """The recorder's clock: wall-clock microseconds since the epoch (comparable with :attr:`Span.start_us`)."""
    return (time.perf_counter_ns() + _RECORDER.epoch_offset_ns) / 1000.0


@contextlib.contextmanager
def trace_span(name: str, cat: str = COMPUTE) -> Iterator[None]:
    """Record the block as a span of this process when tracing is on (nothing otherwise).

    Example:
        >>> with trace_span("score", WAIT):
        ...     pass
    """
    if not _RECORDER.enabled:
        yield
        return
    start, cpu = time.perf_counter_ns(), time.process_time_ns()
    try:
        yield
    finally:
        _RECORDER.record(name, cat, start, time.perf_counter_ns(), time.process_time_ns() - cpu)


NO_SPAN: contextlib.nullcontext[None] = contextlib.nullcontext()
"""What hot paths enter instead of :func:`trace_span` when tracing is off (no span name is even formatted):
``with trace_span(f"get {name}", WAIT) if tracing_enabled() else NO_SPAN:``."""


def record_span(name: str, cat: str, start_ns: int, end_ns: int, cpu_ns: int = -1000) -> None:
    """Record a span measured with ``time.perf_counter_ns`` (``Worker.timer`` times itself once for both).

    ``cpu_ns``: the process CPU time (``time.process_time_ns``) it used, when measured.
    """
    if _RECORDER.enabled:
        _RECORDER.record(name, cat, start_ns, end_ns, cpu_ns)


def take_trace(label: str) -> ProcessTrace:
    """This process's spans since the last call, labelled ``label`` (they are removed from the buffer)."""
    with _RECORDER.lock:
        spans, _RECORDER.spans = _RECORDER.spans, []
        dropped, _RECORDER.dropped = _RECORDER.dropped, 0
    return ProcessTrace(label, socket.gethostname(), os.getpid(), tuple(spans), dropped)


# ------------------------------------------------------------------------------------------------ timeline
@attrs.frozen
class GroupUsage:
    """How a group's ranks spent a window, averaged over its ranks (seconds)."""

    busy_s: float
    """In compute spans, not counting waits nested in them."""
    wait_s: float
    """In wait spans."""
    idle_s: float
    """Not computing: the window minus :attr:`busy_s` (waits and untraced time)."""
    window_s: float

    @property
    def busy_frac(self) -> float:
        """:attr:`busy_s` over the window."""
        return self.busy_s / self.window_s if self.window_s > 0 else 0.0


def group_of(label: str) -> str:
    """The group of a process label (``"actor:1"`` → ``"actor"``; the driver is its own group)."""
    return label.rsplit(":", 1)[0] if ":" in label else label


class Timeline:
    """The spans of every process of a run, in Chrome's trace event format.

    :meth:`add` the :class:`ProcessTrace` of each process (the same label again appends), :meth:`write` the
    trace file (atomically: a reader never sees half a file), :meth:`usage` for the busy / wait / idle sums of
    each group in a window.
    """

    def __init__(self) -> None:
        self._pids: dict[str, int] = {}
        self._spans: dict[str, list[Span]] = {}
        self._nodes: dict[str, str] = {}
        self._os_pids: dict[str, int] = {}
        self._dropped: dict[str, int] = {}

    @classmethod
    def load(cls, path: str | Path) -> tuple[Timeline, dict[str, Any]]:
        """Read a trace file this class wrote: the timeline and the file's ``otherData``.

        Raises:
            ValueError: the file breaks the trace format, or names no process (not written by a Timeline).
        """
        events = load_trace(path)
        doc = json.loads(Path(path).read_text())
        other = doc.get("otherData", {}) if isinstance(doc, dict) else {}
        labels: dict[Any, tuple[str, str, int]] = {}
        threads: dict[tuple[Any, Any], str] = {}
        for e in events:
            if e["ph"] == "M" and e["name"] == "process_name":
                label, _, rest = str(e["args"].get("name", "")).partition(" (")
                node, _, pid = rest.rstrip(")").partition(", pid ")
                labels[e["pid"]] = (label, node, int(pid) if pid.isdigit() else 0)
            elif e["ph"] == "M" and e["name"] == "thread_name":
                threads[(e["pid"], e["tid"])] = str(e["args"].get("name", e["tid"]))
        if not labels:
            raise ValueError(f"{path}: no process_name metadata (not a trace written by rlinf)")
        spans: dict[Any, list[Span]] = {pid: [] for pid in labels}
        for e in events:
            if e["ph"] == "X" and e["pid"] in spans:
                thread = threads.get((e["pid"], e["tid"]), str(e["tid"]))
                cpu_ms = e.get("args", {}).get("cpu_ms")
                cpu_us = float(cpu_ms) * 1000.0 if isinstance(cpu_ms, (int, float)) else -1.0
                spans[e["pid"]].append(
                    Span(e["name"], e.get("cat", COMPUTE), float(e["ts"]), float(e["dur"]), thread, cpu_us)
                )
        timeline = cls()
        for pid, (label, node, os_pid) in labels.items():
            timeline.add(ProcessTrace(label, node, os_pid, tuple(spans[pid])))
        return timeline, dict(other)

    @property
    def labels(self) -> tuple[str, ...]:
        """Process labels in the order they were first added."""
        return tuple(self._pids)

    def node(self, label: str) -> str:
        """The node process ``label`` ran on (empty for an unknown label)."""
        return self._nodes.get(label, "")

    def spans(self, label: str) -> tuple[Span, ...]:
        """All spans of process ``label`` (empty for an unknown label)."""
        return tuple(self._spans.get(label, ()))

    def busy_intervals(self, label: str) -> list[tuple[float, float]]:
        """When process ``label`` computed: sorted disjoint ``(start_us, end_us)`` intervals.

        Its compute spans minus its wait spans, several threads counted once.
        """
        spans = self._spans.get(label, [])
        compute = _union((s.start_us, s.end_us) for s in spans if s.cat != WAIT)
        wait = _union((s.start_us, s.end_us) for s in spans if s.cat == WAIT)
        return _subtract(compute, wait)

    def add(self, trace: ProcessTrace) -> None:
        """Append one process's spans (a process seen for the first time gets the next trace ``pid``)."""
        label = trace.label
        if label not in self._pids:
            self._pids[label] = len(self._pids) + 1
            self._spans[label] = []
            self._dropped[label] = 0
        self._nodes[label] = trace.node
        self._os_pids[label] = trace.os_pid
        self._spans[label].extend(trace.spans)
        self._dropped[label] += trace.dropped

    def events(self) -> list[dict[str, Any]]:
        """The trace events: metadata naming each process and thread, then one complete event per span."""
        out: list[dict[str, Any]] = []
        for label, pid in self._pids.items():
            name = f"{label} ({self._nodes[label]}, pid {self._os_pids[label]})"
            args: dict[str, Any] = {"name": name}
            out.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": args})
            out.append(
                {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}}
            )
            tids: dict[str, int] = {}
            for span in self._spans[label]:
                if span.thread not in tids:
                    tids[span.thread] = len(tids) + 1
                    out.append(
                        {
                            "ph": "M",
                            "name": "thread_name",
                            "pid": pid,
                            "tid": tids[span.thread],
                            "args": {"name": span.thread},
                        }
                    )
            for span in self._spans[label]:
                event: dict[str, Any] = {
                    "ph": "X",
                    "name": span.name,
                    "cat": span.cat,
                    "ts": round(span.start_us, 3),
                    "dur": round(span.dur_us, 3),
                    "pid": pid,
                    "tid": tids[span.thread],
                }
                if span.cpu_us >= 0:
                    event["args"] = {"cpu_ms": round(span.cpu_us / 1000.0, 3)}
                out.append(event)
        return out

    def write(self, path: str | Path, metadata: Mapping[str, Any] | None = None) -> Path:
        """Write the trace file ``path`` (JSON object format) atomically; returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        other: dict[str, Any] = dict(metadata or {})
        dropped = {k: v for k, v in self._dropped.items() if v}
        if dropped:
            other["dropped_spans"] = dropped
        doc = {"traceEvents": self.events(), "displayTimeUnit": "ms", "otherData": other}
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(doc, separators=(",", ":")))
        os.replace(tmp, path)
        return path

    def usage(self, start_us: float, end_us: float) -> dict[str, GroupUsage]:
        """Per group (workers and the driver): busy, wait and idle seconds in ``[start_us, end_us]``.

        A rank's busy time is the union of its compute spans minus the union of its wait spans (several
        threads of one rank count once); each figure is the mean over the group's ranks seen so far, a rank
        without spans in the window counting as idle.
        """
        window = max(end_us - start_us, 0.0)
        per_group: dict[str, list[tuple[float, float]]] = {}
        for label in self._pids:
            compute: list[tuple[float, float]] = []
            wait: list[tuple[float, float]] = []
            for span in self._spans[label]:
                lo, hi = max(span.start_us, start_us), min(span.end_us, end_us)
                if hi > lo:
                    (wait if span.cat == WAIT else compute).append((lo, hi))
            compute_u, wait_u = _union(compute), _union(wait)
            busy = _length(compute_u) - _overlap(compute_u, wait_u)
            per_group.setdefault(group_of(label), []).append((busy, _length(wait_u)))
        out: dict[str, GroupUsage] = {}
        for group, rows in per_group.items():
            busy = sum(b for b, _ in rows) / len(rows) / 1e6
            waited = sum(w for _, w in rows) / len(rows) / 1e6
            out[group] = GroupUsage(busy, waited, window / 1e6 - busy, window / 1e6)
        return out


def _union(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for lo, hi in sorted(intervals):
        if merged and lo <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], hi))
        else:
            merged.append((lo, hi))
    return merged


def _subtract(
    a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]
) -> list[tuple[float, float]]:
    """``a`` without ``b`` (both sorted and disjoint)."""
    out = []
    j = 0
    for lo, hi in a:
        cur = lo
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < hi:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < hi:
            out.append((cur, hi))
    return out


def _length(intervals: Sequence[tuple[float, float]]) -> float:
    return sum(hi - lo for lo, hi in intervals)


def _overlap(a: Sequence[tuple[float, float]], b: Sequence[tuple[float, float]]) -> float:
    """Total length of the intersection of two sorted disjoint interval lists."""
    total, i, j = 0.0, 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


# ------------------------------------------------------------------------------------------------- reading
_PHASES = frozenset("BEXiIMCbneSTFsftPONDcR(),")
_METADATA = frozenset(
    ("process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index")
)


def load_trace(path: str | Path) -> list[dict[str, Any]]:
    """Read a trace file and check it against the trace event format; returns its events.

    Accepts the JSON object format (``{"traceEvents": [...]}``) and the array format (a bare list).

    Raises:
        ValueError: the file is not JSON, or an event breaks the format (the message names the event index
            and the field).
    """
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not JSON ({e})") from None
    if isinstance(doc, dict):
        if "traceEvents" not in doc:
            raise ValueError(f"{path}: a JSON object trace needs a 'traceEvents' list")
        events = doc["traceEvents"]
        unit = doc.get("displayTimeUnit", "ms")
        if unit not in ("ms", "ns"):
            raise ValueError(f"{path}: displayTimeUnit must be 'ms' or 'ns', got {unit!r}")
    else:
        events = doc
    if not isinstance(events, list):
        raise ValueError(f"{path}: traceEvents must be a list, got {type(events).__name__}")
    for i, event in enumerate(events):
        _check_event(event, f"{path}: event {i}")
    return events


def _check_event(event: Any, where: str) -> None:
    if not isinstance(event, dict):
        raise ValueError(f"{where}: an event is an object, got {type(event).__name__}")
    ph = event.get("ph")
    if not isinstance(ph, str) or ph not in _PHASES:
        raise ValueError(f"{where}: 'ph' must be one of {''.join(sorted(_PHASES))!r}, got {ph!r}")
    for key in ("pid", "tid"):
        if key in event and not isinstance(event[key], (int, str)):
            raise ValueError(f"{where}: {key!r} must be an integer or string, got {event[key]!r}")
    if "name" in event and not isinstance(event["name"], str):
        raise ValueError(f"{where}: 'name' must be a string, got {event['name']!r}")
    if "args" in event and not isinstance(event["args"], dict):
        raise ValueError(f"{where}: 'args' must be an object, got {event['args']!r}")
    if ph == "M":
        if event.get("name") not in _METADATA:
            raise ValueError(f"{where}: a metadata event's name must be one of {sorted(_METADATA)}")
        if "pid" not in event or not isinstance(event.get("args"), dict):
            raise ValueError(f"{where}: a metadata event needs 'pid' and 'args'")
        return
    ts = event.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)):
        raise ValueError(f"{where}: 'ts' (microseconds) must be a number, got {ts!r}")
    if ph == "X":
        dur = event.get("dur")
        if isinstance(dur, bool) or not isinstance(dur, (int, float)) or dur < 0:
            raise ValueError(f"{where}: a complete event needs 'dur' >= 0 (microseconds), got {dur!r}")
        for key in ("name", "pid", "tid"):
            if key not in event:
                raise ValueError(f"{where}: a complete event needs {key!r}")
