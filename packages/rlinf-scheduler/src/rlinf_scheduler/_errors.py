"""Errors raised by the runtime, and the record of a worker failure."""

from __future__ import annotations

from typing import Literal

import attrs

__all__ = ["SchedulerTimeoutError", "WorkerFailedError", "WorkerFailure"]


class SchedulerTimeoutError(TimeoutError):
    """A blocking wait of the scheduler ran out of time; the message says what it was waiting for."""


@attrs.frozen(kw_only=True)
class WorkerFailure:
    """Why a run ended: one worker raised, or its process died.

    Attributes:
        group_name: Worker group of the failed worker.
        rank: Its rank in the group.
        kind: ``"raised"`` (a method or the constructor raised) or ``"died"`` (the process exited or was killed).
        method: The method that raised (``"__init__"`` for the constructor), ``None`` if unknown.
        details: The worker's traceback, or the exit cause Ray reported.
        where: Where the worker ran, e.g. ``"Franka unit 0 (robot_ip=10.0.0.2) on node 1, node group 'robot'"``
            (empty if unknown): a failure of a worker that drives hardware names the hardware.
    """

    group_name: str
    rank: int
    kind: Literal["raised", "died"]
    method: str | None
    details: str
    where: str = ""

    def describe(self) -> str:
        """One paragraph for logs and error messages."""
        where = f"worker {self.group_name}:{self.rank}"
        if self.kind == "raised":
            head = f"{where} raised in {self.method}()" if self.method else f"{where} raised"
        else:
            head = f"{where} died"
        if self.where:
            head += f" ({self.where})"
        return f"{head}:\n{self.details.rstrip()}"


class WorkerFailedError(RuntimeError):
    """A worker of the run raised or died; the run is over and every worker was torn down.

    Attributes:
        failure: The first failure of the run (which may belong to another group than the call waited on).
    """

    def __init__(self, failure: WorkerFailure) -> None:
        super().__init__(failure.describe())
        self.failure = failure

    def __reduce__(self) -> tuple[type[WorkerFailedError], tuple[WorkerFailure]]:
        return (type(self), (self.failure,))
