"""The sandboxed process of `run_sandboxed` (not a public module; run as ``python -I -S -B <this file>``).

Standard library only: it runs with ``-I -S`` (no site-packages, no environment, no script directory on the
path) so the untrusted program sees a bare interpreter.

Protocol: one JSON object on stdin ``{"code", "tests", "dir", "limits"}``; JSON lines on the original stdout:
``{"mechanisms": [...]}`` once the sandbox is in place, then ``{"test": i, "status", "reason"}`` per test.
The program's own stdout and stderr go to a size-capped file in its directory, so its prints cannot pose as
protocol lines (it can still write to the protocol descriptor on purpose: see the module docs of
``_sandbox.py`` on what the sandbox does not protect).

Order of set-up, each step best effort and reported in ``mechanisms``:

1. ``unshare(NEWUSER | NEWNS | NEWNET | NEWPID)`` then fork: the program runs as PID 1 of a new PID
   namespace (its whole process tree dies with it), in a network namespace with no interface up, in a mount
   namespace where every mount is remounted read-only except its own directory;
2. a second ``unshare(NEWUSER)`` drops the capabilities over those namespaces, so the program cannot undo them;
3. ``setrlimit``: CPU seconds, address space, processes (counted inside the user namespace only), file size,
   open files, no core dumps;
4. an audit hook (PEP 578) that refuses sockets, new processes, signals to other processes, ctypes, frame and
   heap introspection and any write outside the directory, and remembers the first refusal as the test's
   reason even when the program swallows the exception.
"""

from __future__ import annotations

import builtins
import errno
import json
import os
import resource
import signal
import sys
from collections.abc import Callable
from typing import Any, TextIO

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_CLONE_NEWNET = 0x40000000
_CLONE_NEWPID = 0x20000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_NOATIME, _MS_NODIRATIME, _MS_BIND = 32, 1024, 2048, 4096
_MS_REC, _MS_PRIVATE, _MS_RELATIME, _MS_STRICTATIME = 16384, 1 << 18, 1 << 21, 1 << 24
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
# Per-mount options that a remount inside a user namespace must repeat (the kernel locks them).
_LOCKED_FLAGS = {
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": _MS_NOATIME,
    "nodiratime": _MS_NODIRATIME,
    "relatime": _MS_RELATIME,
    "strictatime": _MS_STRICTATIME,
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {  # audit event -> indices of the path arguments it modifies
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.mkdir": (0,),
    "os.chmod": (0,),
    "os.chown": (0,),
    "os.chflags": (0,),
    "os.lchflags": (0,),
    "os.utime": (0,),
    "os.truncate": (0,),
    "os.rename": (0, 1),
    "os.link": (0, 1),
    "os.symlink": (1,),
    "os.setxattr": (0,),
    "os.removexattr": (0,),
    "shutil.rmtree": (0,),
    "shutil.move": (0, 1),
    "shutil.copyfile": (1,),
    "shutil.copytree": (1,),
}
_PROCESS_EVENTS = frozenset(
    {
        "os.fork",
        "os.forkpty",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "subprocess.Popen",
        "pty.spawn",
    }
)
# Not sys._getframe: enum and namedtuple call it on import.
_INTROSPECTION_EVENTS = frozenset({"gc.get_objects", "gc.get_referrers", "gc.get_referents"})


class SandboxTimeout(BaseException):
    """Raised in the program by the per-test timer (a BaseException: ``except Exception`` does not catch it)."""


class _Libc:
    """The few libc calls Python 3.11 lacks (``os.unshare`` is 3.12+), through ctypes."""

    def __init__(self) -> None:
        import ctypes

        self._ctypes = ctypes
        self.lib = ctypes.CDLL(None, use_errno=True)

    def call(self, name: str, *args: Any) -> bool:
        return int(getattr(self.lib, name)(*args)) == 0

    def mount(self, source: str | None, target: str, flags: int) -> bool:
        src = source.encode() if source is not None else None
        return self.call("mount", src, target.encode(), None, self._ctypes.c_ulong(flags), None)


def _write_id_maps(uid: int, gid: int) -> bool:
    """Map ``uid``/``gid`` (ours before ``unshare``) onto themselves in the new user namespace.

    Inside a fresh user namespace ``getuid()`` reads the overflow id, hence the arguments. The order (uid map,
    setgroups, gid map) is util-linux ``unshare``'s.
    """
    try:
        for path, text in (
            ("/proc/self/uid_map", f"{uid} {uid} 1\n"),
            ("/proc/self/setgroups", "deny"),
            ("/proc/self/gid_map", f"{gid} {gid} 1\n"),
        ):
            fd = os.open(path, os.O_WRONLY)
            try:
                os.write(fd, text.encode())
            finally:
                os.close(fd)
    except OSError:
        return False
    return True


def _mounts() -> list[tuple[str, int]]:
    """``(mount point, locked per-mount flags)`` of every mount, from ``/proc/self/mountinfo``."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")  # octal escapes such as \040
            flags = 0
            for opt in fields[5].split(","):
                flags |= _LOCKED_FLAGS.get(opt, 0)
            out.append((point, flags))
    return out


def _read_only_except(libc: _Libc, directory: str) -> bool:
    """Remount every mount read-only except a bind mount of ``directory``; True if ``/`` became read-only."""
    if not libc.mount(None, "/", _MS_REC | _MS_PRIVATE):
        return False
    if not libc.mount(directory, directory, _MS_BIND):
        return False
    root_ro = False
    for point, flags in _mounts():
        # /proc stays as it is: the second user namespace needs its id maps (procfs refuses most writes from a
        # non-initial user namespace anyway).
        if point == directory or point == "/proc" or point.startswith("/proc/"):
            continue
        ok = libc.mount(None, point, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | flags)
        root_ro = root_ro or (ok and point == "/")
    os.chdir(directory)  # the old working directory is the read-only mount underneath the bind mount
    return root_ro


def _enter_namespaces(directory: str) -> list[str]:
    """Step 1 and 2 of the module docs; returns the mechanisms in force (empty when namespaces are refused).

    Forks once: the parent stays outside the PID namespace, waits for the sandboxed child and exits with its
    status (``128 + signal`` when it was killed); only the child returns.
    """
    try:
        libc = _Libc()
    except OSError:
        return []
    uid, gid = os.getuid(), os.getgid()
    flags = _CLONE_NEWUSER | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID
    if not libc.call("unshare", flags) or not _write_id_maps(uid, gid):
        return []
    pid = os.fork()
    if pid:
        _, status = os.waitpid(pid, 0)
        os._exit(128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    libc.call("prctl", _PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    mechanisms = ["pid namespace", "network namespace"]
    if _read_only_except(libc, directory):
        mechanisms.append("read-only mounts")
    if libc.call("unshare", _CLONE_NEWUSER) and _write_id_maps(uid, gid):
        mechanisms.append("user namespace")
    return mechanisms


def _count_user_tasks() -> int:
    """Tasks (threads) of this uid on the host: RLIMIT_NPROC counts them all outside a user namespace."""
    uid, total = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    total += len(os.listdir(f"/proc/{entry}/task"))
            except OSError:
                continue
    return total


def _set_limits(limits: dict[str, Any], *, host_uid: int, own_user_namespace: bool) -> list[str]:
    cpu = int(limits["cpu_s"])
    nproc = int(limits["max_processes"]) + 1
    if not own_user_namespace:  # the count covers every process of this user: allow only a few more
        nproc += _count_user_tasks()
    size = int(limits["max_output_bytes"])
    for res, value in (
        (resource.RLIMIT_CPU, (cpu, cpu + 1)),
        (resource.RLIMIT_AS, (int(limits["memory_bytes"]),) * 2),
        (resource.RLIMIT_NPROC, (nproc, nproc)),
        (resource.RLIMIT_FSIZE, (size, size)),
        (resource.RLIMIT_NOFILE, (64, 64)),
        (resource.RLIMIT_CORE, (0, 0)),
    ):
        resource.setrlimit(res, value)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-size write fails with EFBIG instead of killing
    # The kernel never applies RLIMIT_NPROC to the host's uid 0, whatever the namespace.
    return ["rlimits"] if host_uid == 0 else ["rlimits", "process limit"]


def _inside(path: object, directory: str) -> bool:
    if isinstance(path, int):  # an already open descriptor: its opening was checked
        return True
    if not isinstance(path, str | bytes | os.PathLike):
        return False
    real = os.path.realpath(os.fsdecode(path))
    return real == directory or real.startswith(directory + os.sep)


def _audit_hook(directory: str, violations: list[str]) -> Callable[[str, tuple[Any, ...]], None]:
    me = os.getpid()

    def refuse(reason: str) -> None:
        violations.append(reason)
        raise PermissionError(f"sandbox: {reason}")

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event.startswith("socket."):
            refuse("network blocked")
        elif event in _PROCESS_EVENTS:
            refuse("fork limit")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill") and args and args[0] != me:
            refuse("signal blocked")
        elif event.startswith("ctypes.") or event in _INTROSPECTION_EVENTS:
            refuse(f"{event} blocked")
        elif event == "open" and len(args) >= 3:
            path, mode, flags = args[0], args[1], args[2]
            writes = (isinstance(flags, int) and flags & _WRITE_FLAGS) or (
                isinstance(mode, str) and any(c in mode for c in "wax+")
            )
            if writes and not _inside(path, directory):
                refuse("write outside sandbox")
        elif event in _PATH_EVENTS:
            for i in _PATH_EVENTS[event]:
                if i < len(args) and not _inside(args[i], directory):
                    refuse("write outside sandbox")

    return hook


def _reason(exc: BaseException) -> tuple[str, str]:
    """``(status, reason)`` of an exception raised by the program or a test."""
    if isinstance(exc, SandboxTimeout):
        return "error", "timeout"
    if isinstance(exc, MemoryError):
        return "error", "memory"
    if isinstance(exc, AssertionError):
        return "failed", "wrong answer"
    if isinstance(exc, RecursionError):
        return "error", "recursion limit"
    if isinstance(exc, BlockingIOError):  # fork/clone refused by RLIMIT_NPROC
        return "error", "fork limit"
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG:  # RLIMIT_FSIZE
        return "error", "output limit"
    if isinstance(exc, OSError) and exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):  # no interface up
        return "error", "network blocked"
    if isinstance(exc, OSError) and exc.errno == errno.EROFS:  # outside the directory's bind mount
        return "error", "write outside sandbox"
    return "error", f"{type(exc).__name__}: {str(exc)[:120]}"


def _run(
    code: str, tests: list[str], timeout_s: float, violations: list[str], report: Callable[..., None]
) -> None:
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}

    def on_alarm(_signum: int, _frame: object) -> None:
        # Remembered like a refusal, and re-armed every 50 ms: a program that catches it keeps getting it.
        if "timeout" not in violations:
            violations.append("timeout")
        raise SandboxTimeout

    signal.signal(signal.SIGALRM, on_alarm)

    def execute(source: str, name: str) -> tuple[str, str]:
        violations.clear()
        try:
            compiled = compile(source, name, "exec")
        except (SyntaxError, ValueError):
            return "error", "syntax error"
        try:
            signal.setitimer(signal.ITIMER_REAL, timeout_s, 0.05)
            try:
                exec(compiled, namespace)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        except BaseException as e:  # the program's own exceptions, timeouts and refusals alike
            status, reason = _reason(e)
            return "error" if violations else status, violations[0] if violations else reason
        if violations:  # refused but swallowed by the program
            return "error", violations[0]
        return "passed", ""

    status, reason = execute(code, "<program>")
    if status != "passed":  # a program that does not load fails every test for the same reason
        for i in range(len(tests)):
            report(test=i, status="error", reason=reason)
        return
    for i, test in enumerate(tests):
        test_status, test_reason = execute(test, f"<test {i}>")
        report(test=i, status=test_status, reason=test_reason)


def main() -> None:
    """Read the job, build the sandbox around this process, run the program and its tests."""
    job = json.loads(sys.stdin.buffer.read())
    directory = os.path.realpath(job["dir"])
    limits: dict[str, Any] = job["limits"]
    channel: TextIO = os.fdopen(os.dup(1), "w", encoding="utf-8")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    output = os.open(os.path.join(directory, ".output"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(output, 1)
    os.dup2(output, 2)
    os.close(output)
    os.chdir(directory)

    host_uid = os.getuid()
    mechanisms = _enter_namespaces(directory) if limits["namespaces"] else []
    mechanisms += _set_limits(limits, host_uid=host_uid, own_user_namespace="user namespace" in mechanisms)
    violations: list[str] = []
    if limits["audit_hook"]:
        sys.addaudithook(_audit_hook(directory, violations))
        mechanisms.append("audit hook")

    def report(**message: Any) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    report(mechanisms=mechanisms)
    _run(job["code"], list(job["tests"]), float(limits["test_timeout_s"]), violations, report)
    channel.close()
    os._exit(0)  # skip interpreter teardown: the program may have left hooks or threads behind


if __name__ == "__main__":
    main()
