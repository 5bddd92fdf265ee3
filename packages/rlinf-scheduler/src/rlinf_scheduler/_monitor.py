"""Failure monitor: learns in the driver, within about a second, that any worker of the run raised or died.

Each worker actor keeps one call pending, ``_rlinf_watch()``, which returns when the worker records a failure and
errors when its process dies. A driver thread waits on all of them; on the first failure it tears every worker
group down, so that whatever the driver is blocked on (a ``wait()`` on another group, a ``recv``) ends at once
and raises :class:`~rlinf_scheduler.WorkerFailedError` with the original cause.
"""

from __future__ import annotations

import logging
import signal
import threading
from typing import TYPE_CHECKING, Any

import attrs
import ray

from ._errors import WorkerFailure
from ._group import FAILURE_GRACE_S, teardown_workers

if TYPE_CHECKING:
    from ._cluster import Cluster
    from ._group import WorkerGroup

__all__ = ["FailureMonitor"]

_logger = logging.getLogger("rlinf_scheduler.cluster")
_POLL_S = 0.25


class FailureMonitor:
    """Watches every worker actor of a cluster from a daemon thread of the driver."""

    def __init__(self, cluster: Cluster, *, interrupt_main: bool, grace_s: float) -> None:
        self._cluster = cluster
        self._interrupt_main = interrupt_main
        self._grace_s = grace_s
        self._lock = threading.Lock()
        self._watches: dict[Any, tuple[WorkerGroup, int]] = {}
        self._failure: WorkerFailure | None = None
        self._delivered = threading.Event()
        self._stop = threading.Event()
        self._changed = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def failure(self) -> WorkerFailure | None:
        """The first failure seen, or ``None``."""
        return self._failure

    def watch(self, group: WorkerGroup, rank: int, handle: Any) -> None:
        """Start watching one worker actor."""
        ref = handle._rlinf_watch.remote()
        with self._lock:
            self._watches[ref] = (group, rank)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rlinf-failure-monitor", daemon=True)
                self._thread.start()
        self._changed.set()

    def unwatch(self, group: WorkerGroup) -> None:
        """Stop watching a group (before it is shut down on purpose)."""
        with self._lock:
            for ref in [r for r, (g, _) in self._watches.items() if g is group]:
                del self._watches[ref]

    def stop(self) -> None:
        """Stop the thread (the cluster is shutting down)."""
        self._stop.set()
        self._changed.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)

    def delivered(self) -> None:
        """A ``wait()`` raised the failure to the user: no need to interrupt the main thread."""
        self._delivered.set()

    def report(self, failure: WorkerFailure) -> None:
        """Record ``failure`` if it is the first, log it and tear every group down."""
        with self._lock:
            if self._failure is not None:
                return
            self._failure = failure
            groups = {g for g, _ in self._watches.values()} | set(self._cluster.groups.values())
        _logger.error("rlinf_scheduler: ending the run: %s", failure.describe())
        teardown_workers([h for g in groups for h in g.actor_handles], grace_s=FAILURE_GRACE_S)
        if self._interrupt_main:
            timer = threading.Timer(self._grace_s, self._interrupt_if_undelivered)
            timer.daemon = True
            timer.start()

    # ------------------------------------------------------------------------------------------ internal
    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                refs = list(self._watches)
            if not refs or self._failure is not None:
                self._changed.wait(_POLL_S)
                self._changed.clear()
                continue
            try:
                ready, _ = ray.wait(refs, num_returns=1, timeout=_POLL_S)
            except Exception:  # Ray is shutting down under us
                if self._stop.wait(_POLL_S):
                    return
                continue
            for ref in ready:
                with self._lock:
                    entry = self._watches.pop(ref, None)
                if entry is None:
                    continue
                group, rank = entry
                failure = _resolve(ref, group.name, rank)
                if not failure.where and 0 <= rank < len(group.placements):
                    failure = attrs.evolve(failure, where=group.placements[rank].hardware)
                if failure.kind == "died":
                    cause = self._cluster.explain_death(group.name, rank, failure.details)
                    failure = attrs.evolve(failure, details=f"{failure.details.rstrip()}\n{cause}")
                self.report(failure)

    def _interrupt_if_undelivered(self) -> None:
        if self._delivered.is_set() or self._stop.is_set():
            return
        main = threading.main_thread()
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler or main.ident is None:
            return
        _logger.error(
            "rlinf_scheduler: no wait() raised the worker failure within %.1f s; interrupting the main thread",
            self._grace_s,
        )
        signal.pthread_kill(main.ident, signal.SIGINT)


def _resolve(ref: Any, group_name: str, rank: int) -> WorkerFailure:
    try:
        failure = ray.get(ref, timeout=10.0)
    except ray.exceptions.RayActorError as err:
        text = str(err)
        creation = "creation task" in text
        return WorkerFailure(
            group_name=group_name,
            rank=rank,
            kind="raised" if creation else "died",
            method="__init__" if creation else None,
            details=text,
        )
    except Exception as err:  # the watch call itself broke: report what we know
        return WorkerFailure(group_name=group_name, rank=rank, kind="died", method=None, details=repr(err))
    if isinstance(failure, WorkerFailure):
        return failure
    return WorkerFailure(
        group_name=group_name,
        rank=rank,
        kind="died",
        method=None,
        details=f"unexpected watch result {failure!r}",
    )
