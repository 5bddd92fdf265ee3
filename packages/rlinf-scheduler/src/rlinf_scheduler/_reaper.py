"""Reaper of a local Ray instance whose driver was killed (run as a script: ``python _reaper.py <driver pid>``).

When a driver that started a local Ray instance dies without shutting it down (``SIGKILL``, the OOM killer),
Ray's GCS, raylet and workers notice and exit, but the raylet's agents (``ray::DashboardAgent``,
``ray::RuntimeEnvAgent``) linger for a minute or more: they first try to report the raylet's death to the
GCS that is already gone. The cluster cannot stop Ray from starting them (the raylet always does, and the
runtime-env agent is what applies a worker's ``runtime_env``), so it starts this small process instead.

It reads its stdin, a pipe whose other end only the driver holds, and meanwhile records every Ray process
below the driver (re-scanning ``/proc`` each interval, because the agents and workers start later). A line
``exit`` means a planned shutdown: it exits without killing anything. End of file without it means the
driver died: it sends ``SIGKILL`` to every recorded process that still runs (same pid and start time).

Only the standard library is imported (not ``rlinf_scheduler``, whose import pulls in Ray), and nothing
runs at import time. Linux only (``/proc``); elsewhere the cluster does not start it.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys

_SCAN_S = 0.5
_RAY_MARKERS = ("ray::", "/ray/", "raylet", "gcs_server")
"""Substrings of a command line that mark a Ray process (only descendants of the driver are considered)."""


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of ``pid``, or ``None`` if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rindex(b")") + 2 :].split()  # after "pid (comm) "
    return int(fields[1]), int(fields[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descendants(root: int) -> dict[int, int]:
    """Every process below ``root``: pid -> start time."""
    children: dict[int, list[tuple[int, int]]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st is not None:
                children.setdefault(st[0], []).append((int(name), st[1]))
    out: dict[int, int] = {}
    todo = [root]
    while todo:
        for pid, start in children.get(todo.pop(), []):
            if pid not in out:
                out[pid] = start
                todo.append(pid)
    return out


def main(driver: int) -> None:
    """Watch ``driver`` until stdin says ``exit`` (planned) or closes (driver gone), then reap."""
    me = os.getpid()
    seen: dict[int, int] = {}
    buffer = b""
    while True:
        for pid, start in _descendants(driver).items():
            if pid != me and pid not in seen and any(m in _cmdline(pid) for m in _RAY_MARKERS):
                seen[pid] = start
        ready, _, _ = select.select([sys.stdin.buffer], [], [], _SCAN_S)
        if not ready:
            continue
        chunk = os.read(sys.stdin.fileno(), 64)
        buffer += chunk
        if b"exit" in buffer:
            return
        if not chunk:
            break
    for pid, start in seen.items():
        st = _stat(pid)
        if st is not None and st[1] == start:  # the same process, not a reused pid
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    main(int(sys.argv[1]))
