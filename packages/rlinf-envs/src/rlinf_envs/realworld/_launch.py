"""Dummy robot servers as child processes on 127.0.0.1: started together, found by their port files, stopped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DummyServer", "start_dummy_servers"]

_MODULE = "rlinf_envs.realworld.dummy_robot"
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])
"""The directory holding ``rlinf_envs``: put on the child's ``PYTHONPATH`` so it finds the same source tree."""


class DummyServer:
    """One running dummy robot server process."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = 5.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after ``timeout_s``) and reap it; idempotent."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _log_tail(path: Path, limit: int = 2000) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-limit:].strip()


def start_dummy_servers(
    seeds: Sequence[int],
    *,
    image_size: tuple[int, int],
    target_pose: Sequence[float],
    timeout_s: float = 30.0,
) -> tuple[list[DummyServer], Path]:
    """Start one dummy server per seed (in parallel) and wait until each listens.

    Each listens on 127.0.0.1 with a free port (``--port 0``) written to a port file in a fresh temporary
    directory (returned; the caller removes it after stopping the servers), and exits when this process dies.

    Raises:
        RuntimeError: a server exited or did not listen within ``timeout_s`` (with its stderr); every server
            started is stopped first.
    """
    workdir = Path(tempfile.mkdtemp(prefix="rlinf-dummy-robot-"))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    started: list[tuple[subprocess.Popen[bytes], Path, Path]] = []
    try:
        for i, seed in enumerate(seeds):
            port_file, log = workdir / f"robot{i}.port", workdir / f"robot{i}.log"
            cmd = [
                sys.executable,
                "-m",
                _MODULE,
                "--port",
                "0",
                "--port-file",
                str(port_file),
                "--seed",
                str(int(seed)),
                "--image-size",
                str(image_size[0]),
                str(image_size[1]),
                "--parent-pid",
                str(os.getpid()),
                "--target-pose",
                *(repr(float(v)) for v in target_pose),
            ]
            with log.open("wb") as err:
                proc = subprocess.Popen(
                    cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err, env=env
                )
            started.append((proc, port_file, log))
        servers = _wait_for_ports(started, time.monotonic() + timeout_s, timeout_s)
    except BaseException:
        for proc, _, _ in started:
            DummyServer(proc, 0, workdir).stop()
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return servers, workdir


def _wait_for_ports(
    started: Sequence[tuple[subprocess.Popen[bytes], Path, Path]], deadline: float, timeout_s: float
) -> list[DummyServer]:
    ports: dict[int, int] = {}
    while len(ports) < len(started):
        for i, (proc, port_file, log) in enumerate(started):
            if i in ports:
                continue
            if port_file.exists():
                ports[i] = int(port_file.read_text())
            elif proc.poll() is not None:
                raise RuntimeError(
                    f"dummy robot server {i} exited with code {proc.returncode} before listening: {_log_tail(log)}"
                )
        if len(ports) < len(started):
            if time.monotonic() > deadline:
                late = [i for i in range(len(started)) if i not in ports]
                raise RuntimeError(f"dummy robot servers {late} did not listen within {timeout_s:g} s")
            time.sleep(0.02)
    return [DummyServer(proc, ports[i], log) for i, (proc, _, log) in enumerate(started)]
