"""How a dead worker is explained: fatal-signal and exit records, Ray's memory monitor, the cgroup's OOM kills."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from rlinf_scheduler._deaths import explain_death, fault_file, oom_kill_count

GENERIC = "Worker unexpectedly exits with a connection error code 2. End of file."


def test_a_segfault_is_named_with_the_python_stack(tmp_path: Path) -> None:
    record = fault_file(tmp_path, "actor", 1)
    code = textwrap.dedent(
        f"""
        import ctypes, pathlib
        from rlinf_scheduler._deaths import record_fatal_signals
        record_fatal_signals(pathlib.Path({str(record)!r}))
        def deep_in_the_model():
            ctypes.string_at(0)
        deep_in_the_model()
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == -11
    why = explain_death(GENERIC, record, oom_kills_before=0, oom_kills_now=0)
    assert why.startswith("cause: the process was killed by SIGSEGV (Segmentation fault)")
    assert "deep_in_the_model" in why


def test_os_exit_is_recorded_with_its_code_but_not_in_a_forked_child(tmp_path: Path) -> None:
    record = fault_file(tmp_path, "env", 0)
    code = textwrap.dedent(
        f"""
        import os, pathlib
        from rlinf_scheduler._deaths import record_fatal_signals
        record_fatal_signals(pathlib.Path({str(record)!r}))
        child = os.fork()
        if child == 0:
            os._exit(5)
        os.waitpid(child, 0)
        os._exit(7)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 7, out.stderr
    assert "os._exit(5)" not in record.read_text()
    why = explain_death(GENERIC, record, oom_kills_before=None, oom_kills_now=None)
    assert why == "cause: the worker process called os._exit(7) (exit code 7)"


def test_without_records_the_cause_is_a_signal_python_cannot_see(tmp_path: Path) -> None:
    record = fault_file(tmp_path, "rollout", 0)
    record.write_text("")  # the worker set up its record and died without a word
    why = explain_death(GENERIC, record, oom_kills_before=2, oom_kills_now=2)
    assert "SIGKILL (kill -9" in why and "no OOM kill in the cgroup" in why


def test_oom_kills_in_the_cgroup_and_ray_memory_monitor_are_named(tmp_path: Path) -> None:
    record = fault_file(tmp_path, "actor", 0)
    record.write_text("")
    why = explain_death(GENERIC, record, oom_kills_before=1, oom_kills_now=2)
    assert why.startswith("cause: the kernel's OOM killer (SIGKILL)") and "1 OOM kill(s)" in why
    ray_oom = "Task was killed due to the node running low on memory. ... memory pressure ..."
    assert "Ray's memory monitor" in explain_death(ray_oom, record, oom_kills_before=0, oom_kills_now=0)


def test_a_worker_on_another_node_is_not_explained_from_this_one(tmp_path: Path) -> None:
    why = explain_death(GENERIC, fault_file(tmp_path, "env", 3), oom_kills_before=0, oom_kills_now=0)
    assert "not recorded on this node" in why


def test_the_oom_counter_reads_this_machine_cgroup() -> None:
    count = oom_kill_count()
    assert count is None or count >= 0
    if (
        Path("/sys/fs/cgroup/memory/memory.oom_control").exists()
        or Path("/sys/fs/cgroup/memory.events").exists()
    ):
        assert count is not None


def test_recording_in_this_process_keeps_faulthandler_and_os_exit_usable(tmp_path: Path) -> None:
    code = textwrap.dedent(
        f"""
        import faulthandler, os, pathlib
        from rlinf_scheduler._deaths import record_fatal_signals
        record_fatal_signals(pathlib.Path({str(tmp_path / "x" / "w-0.txt")!r}))
        assert faulthandler.is_enabled()
        os._exit(0)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "x" / "w-0.txt").read_text().strip() == "rlinf: os._exit(0)"
