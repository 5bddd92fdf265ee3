r"""`MathVerifier`: math-verify in a pool of worker processes with a hard per-sample timeout.

Sympy can take unbounded time (or hold the GIL in a C big-integer loop) on adversarial answers such as
``9^{9^{9^{9}}}``; math-verify's own ``signal.alarm`` timeout only works in the main thread and cannot
interrupt C code. So each sample is checked by `rlinf_algos.rewards.math.verify_math_answer` in a worker
subprocess (``python -m rlinf_core.rewards._math_worker``, JSON lines over pipes), and a worker that exceeds
the per-sample timeout is SIGKILLed and replaced; that sample counts as incorrect. The caller never hangs.

The workers import math-verify; this module does not (it is stdlib only), so it imports without the
``rlinf-core[math]`` extra and a missing extra is reported when a worker starts.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import rlinf_algos
from rlinf_algos.rewards import SampleReferences

__all__ = ["MathVerifier", "math_verify_call"]


class _Worker:
    """One verifier subprocess speaking JSON lines over its stdin/stdout."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rlinf_core.rewards._math_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # a terminal Ctrl-C goes to the parent, which then closes the pool
        )
        assert self.proc.stdout is not None
        self.fd = self.proc.stdout.fileno()
        os.set_blocking(self.fd, False)
        self.buffer = b""
        self.ready = False
        self.started_at = time.monotonic()
        self.job: int | None = None
        self.deadline = 0.0

    def send(self, message: dict[str, Any]) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        stdin.write((json.dumps(message) + "\n").encode("ascii"))
        stdin.flush()

    def read_messages(self) -> list[dict[str, Any]] | None:
        """Complete messages available now; None at EOF (the worker died)."""
        try:
            chunk = os.read(self.fd, 1 << 16)
        except BlockingIOError:
            return []
        if not chunk:
            return None
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        return [json.loads(line) for line in lines if line.strip()]

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):  # unflushed bytes to a dead pipe
                    stream.close()

    def request_exit(self) -> None:
        """Close stdin: an idle worker exits on its own at EOF."""
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()


def _shutdown(workers: list[_Worker], grace_s: float = 1.0) -> None:
    for worker in workers:
        worker.request_exit()
    deadline = time.monotonic() + grace_s
    for worker in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        worker.kill()
    workers.clear()


def _reference_list(references: object) -> list[str]:
    """One sample's references as strings: a lone answer (``"3"``, ``3``) or any sequence of answers."""
    if isinstance(references, str | bytes) or not isinstance(references, Sequence):
        return [str(references)]
    return [str(r) for r in references]


def _worker_env() -> dict[str, str]:
    env = dict(os.environ)
    # Make the worker import these very copies of rlinf_core and rlinf_algos even when they are not installed
    # (PYTHONPATH runs).
    sources = [str(Path(__file__).resolve().parents[2]), str(Path(rlinf_algos.__file__).resolve().parents[1])]
    if env.get("PYTHONPATH"):
        sources.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(sources))
    return env


class MathVerifier:
    r"""A pool of verifier processes with a hard per-sample timeout.

    Workers start lazily on the first call and stay alive between calls; a worker that exceeds the timeout
    (or dies) is killed and replaced, and its sample counts as incorrect. Safe to share between threads
    (calls are serialised). Use as a context manager or call `close`; leftover workers are also stopped at
    interpreter exit, and exit on their own when the parent process goes away.

    Args:
        num_workers: processes in the pool (default ``min(8, os.cpu_count())``).
        startup_timeout_s: how long a new worker may take to import math-verify before the call fails
            with RuntimeError.

    Example:
        >>> with MathVerifier(num_workers=1) as verifier:  # doctest: +SKIP
        ...     verifier.verify([r"\boxed{0.5}"], [[r"\frac{1}{2}"]], timeout_s=5.0)
        [True]
    """

    def __init__(self, num_workers: int | None = None, *, startup_timeout_s: float = 120.0) -> None:
        if num_workers is None:
            num_workers = max(1, min(8, os.cpu_count() or 1))
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        if startup_timeout_s <= 0:
            raise ValueError(f"startup_timeout_s must be > 0, got {startup_timeout_s}")
        self.num_workers = num_workers
        self.startup_timeout_s = startup_timeout_s
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._env: dict[str, str] | None = None
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop every worker (a later `verify` starts new ones)."""
        with self._lock:
            _shutdown(self._workers)

    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the live workers (for monitoring and tests)."""
        return [w.proc.pid for w in self._workers]

    def verify(
        self,
        responses: Sequence[str],
        references: Sequence[SampleReferences],
        *,
        timeout_s: float = 10.0,
    ) -> list[bool]:
        """Verify each response against its references with a per-sample timeout.

        Args:
            responses: ``[B]`` decoded outputs.
            references: ``[B]`` references per response (a string, a number or a list; ANY match counts).
            timeout_s: wall-clock budget of one sample on a worker; a sample over budget is False.

        Returns:
            ``[B]`` booleans.

        Raises:
            ValueError: on a length mismatch or a non-positive timeout.
            RuntimeError: when a worker cannot start (e.g. math-verify missing in ``sys.executable``).
        """
        if len(responses) != len(references):
            raise ValueError(
                f"responses and references must have the same length, got {len(responses)} and {len(references)}"
            )
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        jobs = [
            {"response": str(r), "references": _reference_list(ref)}
            for r, ref in zip(responses, references, strict=True)
        ]
        results = [False] * len(jobs)
        if not jobs:
            return results
        with self._lock:
            self._run(jobs, results, timeout_s)
        return results

    # -- scheduling -------------------------------------------------------------------------------------

    def _spawn(self) -> _Worker:
        if self._env is None:
            self._env = _worker_env()
        worker = _Worker(self._env)
        self._workers.append(worker)
        return worker

    def _replace(self, worker: _Worker, call: _Call) -> None:
        call.selector.unregister(worker.fd)
        worker.kill()
        self._workers.remove(worker)
        new = self._spawn()
        call.selector.register(new.fd, selectors.EVENT_READ, new)

    def _run(self, jobs: list[dict[str, Any]], results: list[bool], timeout_s: float) -> None:
        # Drop workers that died while idle (e.g. killed from outside) before scheduling.
        for worker in [w for w in self._workers if w.proc.poll() is not None]:
            worker.kill()
            self._workers.remove(worker)
        while len(self._workers) < min(self.num_workers, len(jobs)) or not self._workers:
            self._spawn()
        call = _Call(jobs, results, timeout_s)
        try:
            self._loop(call)
        except BaseException:
            # A failed start-up or an interrupt leaves workers mid-job: stop them all, the next call restarts.
            _shutdown(self._workers)
            raise
        finally:
            call.selector.close()

    def _loop(self, call: _Call) -> None:
        for worker in self._workers:
            call.selector.register(worker.fd, selectors.EVENT_READ, worker)
        while call.pending or any(w.job is not None for w in self._workers):
            self._dispatch(call)
            now = time.monotonic()
            deadlines = [w.deadline for w in self._workers if w.job is not None]
            deadlines += [w.started_at + self.startup_timeout_s for w in self._workers if not w.ready]
            wait = max(0.0, min(deadlines) - now) if deadlines else None
            for key, _ in call.selector.select(wait):
                worker = key.data
                if worker in self._workers:  # not replaced earlier in this round
                    self._receive(worker, call)
            self._expire(call)

    def _dispatch(self, call: _Call) -> None:
        for worker in list(self._workers):
            if not call.pending:
                return
            if not worker.ready or worker.job is not None:
                continue
            index = call.pending.popleft()
            try:
                worker.send({"id": index, **call.jobs[index]})
            except OSError:  # the worker died while idle
                call.crashed(index)
                self._replace(worker, call)
                continue
            worker.job = index
            worker.deadline = time.monotonic() + call.timeout_s

    def _receive(self, worker: _Worker, call: _Call) -> None:
        messages = worker.read_messages()
        if messages is None:  # EOF: the worker died
            if not worker.ready:
                raise RuntimeError("a math-verify worker exited during start-up")
            if worker.job is not None:
                call.crashed(worker.job)
            self._replace(worker, call)
            return
        for message in messages:
            if "ready" in message:
                if not message["ready"]:
                    raise RuntimeError(f"a math-verify worker failed to start: {message.get('error')}")
                worker.ready = True
            elif worker.job is not None and message.get("id") == worker.job:
                call.results[worker.job] = bool(message.get("ok", False))
                worker.job = None

    def _expire(self, call: _Call) -> None:
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.job is not None and now >= worker.deadline:
                call.results[worker.job] = False  # over budget: incorrect, and the stuck worker is replaced
                self._replace(worker, call)
            elif not worker.ready and now >= worker.started_at + self.startup_timeout_s:
                raise RuntimeError(f"a math-verify worker did not start within {self.startup_timeout_s} s")


class _Call:
    """Scheduling state of one `MathVerifier.verify` call."""

    max_crashes = 2

    def __init__(self, jobs: list[dict[str, Any]], results: list[bool], timeout_s: float) -> None:
        self.jobs = jobs
        self.results = results
        self.timeout_s = timeout_s
        self.pending = deque(range(len(jobs)))
        self.selector = selectors.DefaultSelector()
        self._crashes: dict[int, int] = {}

    def crashed(self, index: int) -> None:
        """A worker died under ``index`` (not a timeout): retry once on a fresh worker, then give up (False)."""
        self._crashes[index] = self._crashes.get(index, 0) + 1
        if self._crashes[index] < self.max_crashes:
            self.pending.appendleft(index)
        else:
            self.results[index] = False


_default_verifier: MathVerifier | None = None
_default_lock = threading.Lock()


def _get_default_verifier() -> MathVerifier:
    global _default_verifier
    with _default_lock:
        if _default_verifier is None:
            _default_verifier = MathVerifier()
            atexit.register(_default_verifier.close)
        return _default_verifier


def math_verify_call(
    responses: Sequence[str],
    references: Sequence[SampleReferences],
    timeout: float = 10.0,
) -> list[bool]:
    """RLinf's ``math_verify_call``: per response, whether its final answer matches ANY reference.

    Runs on a process-wide `MathVerifier` created on first use. A sample taking longer than ``timeout``
    seconds is False (RLinf's behaviour) and never blocks the caller beyond that.

    Args:
        responses: ``[B]`` decoded outputs.
        references: ``[B]`` references per response (string or list of strings).
        timeout: per-sample budget in seconds.

    Returns:
        ``[B]`` booleans.
    """
    return _get_default_verifier().verify(responses, references, timeout_s=timeout)
