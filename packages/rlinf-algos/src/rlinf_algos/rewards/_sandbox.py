"""Run an untrusted Python program and its tests in a separate, locked-down process (Linux, stdlib only).

`run_sandboxed` starts ``python -s -S -B -P _sandbox_child.py`` in a new session (its own process group) with
an empty environment, in a fresh temporary directory that is deleted afterwards. The child builds the
sandbox around itself before it runs anything untrusted (details in ``_sandbox_child.py``):

- **namespaces** (when the kernel lets unprivileged users create them, as on this machine): a user, PID,
  network and mount namespace; no network interface is up, every mount except the directory is read-only,
  the program's process tree dies with it, and a second user namespace takes away the capabilities that
  could undo this;
- **rlimits**: CPU seconds (SIGXCPU), address space (``MemoryError``), processes (counted inside the user
  namespace; outside one, the user's current task count plus the allowance), file size, open files, no core;
- **an audit hook** (PEP 578) that refuses sockets, new processes, signals to other processes, ctypes,
  frame and heap introspection and writes outside the directory, with a clear reason even when the program
  catches the ``PermissionError``;
- **time**: a per-test timer in the child and a wall-clock deadline in the parent, which SIGKILLs the whole
  process group; the protocol output read back is capped.

What it does NOT protect against (say so before trusting it with adversarial code): the audit hook lives in
the same interpreter as the program, and known CPython escapes (memory corruption through buggy C code,
``__del__`` tricks on interpreter internals) can bypass it; without namespaces the only network and
file-system barrier is that hook. The program can read every file its user can read (read-only is not
invisible), can use all the CPU time it is given, and can forge its own results: it runs in the same process
as its tests, so it can write fake protocol lines or return objects whose ``__eq__`` is always true. The
sandbox protects the host, not the integrity of the reward against a model that learns to cheat.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

__all__ = ["SandboxLimits", "SandboxResult", "TestResult", "run_sandboxed"]

_CHILD = str(Path(__file__).with_name("_sandbox_child.py"))
TestStatus = Literal["passed", "failed", "error"]


@dataclass(frozen=True, kw_only=True)
class SandboxLimits:
    """The resources one sandboxed program and its tests get."""

    test_timeout_s: float = 2.0
    """Wall-clock seconds for loading the program and for each test (``timeout``)."""
    wall_timeout_s: float = 15.0
    """Wall-clock seconds for the whole process; the tests not reported by then get ``timeout``."""
    cpu_s: int = 10
    """CPU seconds (RLIMIT_CPU) of the whole run."""
    memory_bytes: int = 512 * 2**20
    """Address space (RLIMIT_AS); a larger allocation raises ``MemoryError`` (``memory``)."""
    max_processes: int = 4
    """Extra tasks (processes or threads) allowed (RLIMIT_NPROC); a fork past it fails (``fork limit``)."""
    max_output_bytes: int = 1 << 20
    """Largest file the program may write (RLIMIT_FSIZE, its stdout/stderr included; ``output limit``)."""
    namespaces: bool = True
    """Use user/PID/network/mount namespaces when the kernel allows them (else rlimits and the hook only)."""
    audit_hook: bool = True
    """Install the audit hook (switch off only to test the OS layers on their own)."""

    def __post_init__(self) -> None:
        for name in ("test_timeout_s", "wall_timeout_s", "cpu_s", "memory_bytes", "max_output_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if self.max_processes < 1:
            raise ValueError(f"max_processes must be >= 1, got {self.max_processes!r}")


@dataclass(frozen=True)
class TestResult:
    """The outcome of one test: ``passed``, ``failed`` (``wrong answer``) or ``error`` with a short reason."""

    __test__ = False  # not a pytest class

    status: TestStatus
    reason: str = ""

    @property
    def passed(self) -> bool:
        """Whether the test passed."""
        return self.status == "passed"


@dataclass(frozen=True)
class SandboxResult:
    """Per-test results of one program, and the isolation mechanisms that were in force."""

    tests: tuple[TestResult, ...]
    mechanisms: tuple[str, ...] = ()

    @property
    def pass_rate(self) -> float:
        """Fraction of the tests that passed (0.0 without tests)."""
        return sum(t.passed for t in self.tests) / len(self.tests) if self.tests else 0.0

    @property
    def reason(self) -> str:
        """The first failing test's reason (``""`` when all passed)."""
        return next((t.reason for t in self.tests if not t.passed), "")


def _exit_reason(returncode: int, *, killed_by_us: bool) -> str:
    """Why a child that stopped before reporting every test stopped (``128 + n``: the PID-namespace wrapper)."""
    if killed_by_us:
        return "timeout"
    sig = -returncode if returncode < 0 else returncode - 128 if returncode > 128 else 0
    if sig == signal.SIGXCPU:
        return "timeout"
    if sig == signal.SIGXFSZ:
        return "output limit"
    if sig == signal.SIGKILL:
        return "killed"
    if sig:
        return f"crashed ({signal.Signals(sig).name})"
    return f"exited ({returncode})"


def _read_protocol(proc: subprocess.Popen[bytes], deadline: float, cap: int) -> tuple[bytes, bool]:
    """Read the child's protocol stream until EOF, the deadline or ``cap`` bytes; ``(data, complete)``."""
    assert proc.stdout is not None
    data = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(timeout=left):
                continue
            chunk = os.read(proc.stdout.fileno(), 1 << 16)
            if not chunk:
                return data, True
            data += chunk
            if len(data) > cap:
                return data[:cap], False
    return data, False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _parse(data: bytes, n_tests: int) -> tuple[dict[int, TestResult], tuple[str, ...]]:
    results: dict[int, TestResult] = {}
    mechanisms: tuple[str, ...] = ()
    for line in data.splitlines():
        try:
            message: Any = json.loads(line)
        except ValueError:
            continue
        if not isinstance(message, dict):
            continue
        if "mechanisms" in message and not mechanisms:
            mechanisms = tuple(str(m) for m in message["mechanisms"])
        test, status = message.get("test"), message.get("status")
        if not isinstance(test, int) or status not in ("passed", "failed", "error"):
            continue
        if 0 <= test < n_tests and test not in results:
            results[test] = TestResult(cast(TestStatus, status), str(message.get("reason", ""))[:200])
    return results, mechanisms


def run_sandboxed(code: str, tests: Sequence[str], limits: SandboxLimits | None = None) -> SandboxResult:
    """Run ``code``, then each test in the same namespace, in a fresh sandboxed process.

    A test is Python source (usually ``assert f(2) == 4``) run after the program; it passes when it raises
    nothing. Reasons: ``wrong answer`` (AssertionError), ``syntax error``, ``timeout``, ``memory``,
    ``fork limit``, ``network blocked``, ``write outside sandbox``, ``output limit``, ``recursion limit``,
    ``<Exception>: <message>`` and ``killed`` / ``crashed (...)`` for a process that died.

    Args:
        code: the candidate program.
        tests: ``[N]`` test snippets.
        limits: the resources (`SandboxLimits()` by default).

    Returns:
        ``N`` results in order, and the mechanisms that were in force.
    """
    limits = limits or SandboxLimits()
    directory = tempfile.mkdtemp(prefix="rlinf-sandbox-")
    job = {
        "code": code,
        "tests": list(tests),
        "dir": directory,
        "limits": {
            "test_timeout_s": limits.test_timeout_s,
            "cpu_s": limits.cpu_s,
            "memory_bytes": limits.memory_bytes,
            "max_processes": limits.max_processes,
            "max_output_bytes": limits.max_output_bytes,
            "namespaces": limits.namespaces,
            "audit_hook": limits.audit_hook,
        },
    }
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": directory,
        "TMPDIR": directory,
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
    }
    deadline = time.monotonic() + limits.wall_timeout_s
    try:
        proc = subprocess.Popen(
            [sys.executable, "-s", "-S", "-B", "-P", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=directory,
            env=env,
            start_new_session=True,
        )
        try:
            assert proc.stdin is not None
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(json.dumps(job).encode())
                proc.stdin.close()
            data, complete = _read_protocol(proc, deadline, cap=64 * (len(tests) + 4) * 1024)
            killed_by_us = not complete
            if complete:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    killed_by_us = True
        finally:
            _kill_group(proc)  # also reaps anything the program left in its process group
        if proc.stdout is not None:
            proc.stdout.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    results, mechanisms = _parse(data, len(tests))
    if len(results) < len(tests):
        why = "output limit" if len(data) >= 64 * (len(tests) + 4) * 1024 else None
        why = why or _exit_reason(proc.returncode, killed_by_us=killed_by_us)
        for i in range(len(tests)):
            results.setdefault(i, TestResult("error", why))
    return SandboxResult(tuple(results[i] for i in range(len(tests))), mechanisms)
