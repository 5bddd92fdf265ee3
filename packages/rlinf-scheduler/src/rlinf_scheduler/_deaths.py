"""Why a worker process died: what the run can know beyond Ray's generic "SYSTEM_ERROR" message.

Ray reports every abrupt exit of a worker the same way (its connection ended; maybe the OOM killer, ``ray stop``
or a crash). Three records narrow it down:

* **fatal signals Python sees** (SIGSEGV, SIGBUS, SIGFPE, SIGABRT, SIGILL): each worker writes them, with every
  thread's Python stack, to its own file through :mod:`faulthandler` (``<fault dir>/<group>-<rank>.txt``);
  an ``os._exit(code)`` of the worker process goes to the same file;
* **Ray's memory monitor** names itself in the error ("memory pressure", "OOM");
* **the kernel's OOM killer** counts its kills in the memory cgroup (``oom_kill`` in ``memory.events``, or
  ``memory.oom_control`` with cgroup v1): the driver reads the counter when the cluster starts and again when a
  worker died.

When none of them has a record, the process ended by a signal Python cannot see: SIGKILL (``kill -9``, an
out-of-memory killer outside this cgroup) or ``ray stop``. The records are per node: a worker on another node
than the driver is explained by Ray's message and its own fault file only if the driver can read it.
"""

from __future__ import annotations

import faulthandler
import os
import re
from pathlib import Path
from typing import IO, NoReturn

__all__ = ["FAULT_DIR_ENV", "explain_death", "fault_file", "oom_kill_count", "record_fatal_signals"]

FAULT_DIR_ENV = "RLINF_FAULT_DIR"
"""Environment variable naming the directory of the workers' fatal-signal records."""

_FATAL = re.compile(r"Fatal Python error: ([^\n]+)")
_EXIT = re.compile(r"^rlinf: os\._exit\((-?\d+)\)$", re.MULTILINE)
_SIGNALS = {
    "Segmentation fault": "SIGSEGV",
    "Bus error": "SIGBUS",
    "Floating point exception": "SIGFPE",
    "Aborted": "SIGABRT",
    "Illegal instruction": "SIGILL",
}
_RAY_OOM = ("memory pressure", "OOM kill reason", "killed due to memory")
_open_records: list[IO[str]] = []  # kept open for the life of the process (faulthandler writes to its fd)


def fault_file(fault_dir: str | Path, group_name: str, rank: int) -> Path:
    """The fatal-signal record of worker ``group_name:rank``."""
    return Path(fault_dir) / f"{group_name}-{rank}.txt"


def record_fatal_signals(path: Path) -> None:
    """In a worker: write fatal signals and every thread's Python stack to ``path`` (truncated now)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = path.open("w", encoding="utf-8")
    _open_records.append(record)
    faulthandler.enable(file=record, all_threads=True)
    real_exit, pid = os._exit, os.getpid()

    def exit_recorded(status: int) -> NoReturn:
        if os.getpid() == pid:  # not in a forked child, which inherits this function
            record.write(f"\nrlinf: os._exit({status})\n")
            record.flush()
        real_exit(status)

    os._exit = exit_recorded


def _memory_events_paths() -> list[Path]:
    paths: list[Path] = []
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":  # cgroup v2
            paths.append(Path("/sys/fs/cgroup", rel, "memory.events"))
        elif "memory" in controllers.split(","):  # cgroup v1
            paths += [
                Path("/sys/fs/cgroup/memory", rel, "memory.oom_control"),
                Path("/sys/fs/cgroup/memory/memory.oom_control"),
            ]
    return paths


def oom_kill_count() -> int | None:
    """Kills by the kernel's OOM killer in this process's memory cgroup so far (``None``: not readable)."""
    for path in _memory_events_paths():
        try:
            text = path.read_text()
        except OSError:
            continue
        m = re.search(r"^oom_kill (\d+)$", text, re.MULTILINE)
        if m:
            return int(m.group(1))
    return None


def explain_death(
    ray_message: str, record: Path | None, *, oom_kills_before: int | None, oom_kills_now: int | None
) -> str:
    """One sentence on how the worker most likely died, from the records described in the module docstring.

    Args:
        ray_message: what Ray said about the death.
        record: the worker's fatal-signal file (``None`` or missing: none readable here).
        oom_kills_before: the cgroup's OOM-kill count when the cluster started.
        oom_kills_now: the count now.
    """
    text = ""
    if record is not None:
        try:
            text = record.read_text(errors="replace")
        except OSError:
            text = ""
    exited = _EXIT.search(text)
    if exited:
        return f"cause: the worker process called os._exit({exited.group(1)}) (exit code {exited.group(1)})"
    fatal = _FATAL.search(text)
    if fatal:
        name = fatal.group(1).strip()
        sig = _SIGNALS.get(name, "a fatal signal")
        stack = text[fatal.end() :].strip()
        return (
            f"cause: the process was killed by {sig} ({name}); its Python threads at that moment "
            f"({record}):\n{stack}"
        )
    if any(key in ray_message for key in _RAY_OOM):
        return (
            "cause: Ray's memory monitor killed it (the node's memory use passed RAY_memory_usage_threshold)"
        )
    if oom_kills_before is not None and oom_kills_now is not None and oom_kills_now > oom_kills_before:
        return (
            "cause: the kernel's OOM killer (SIGKILL): the memory cgroup of this machine counts "
            f"{oom_kills_now - oom_kills_before} OOM kill(s) since the run started; lower the memory use "
            "(fewer envs, smaller batches, offload) or give the machine more memory"
        )
    if record is None or not record.exists():
        return "cause: not recorded on this node (the worker ran on another node, or before its setup)"
    return (
        "cause: a signal Python cannot see: SIGKILL (kill -9, or an out-of-memory killer outside this "
        "machine's memory cgroup) or `ray stop`; there was no fatal-signal record and no OOM kill in the cgroup"
    )
