"""Failure handling: a worker that raises or dies ends the run promptly, with its cause, and tears down all actors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import cloudpickle
import pytest
import ray
from rlinf_scheduler import Cluster, NodePlacementStrategy, Worker, WorkerFailedError

pytestmark = pytest.mark.ray

cloudpickle.register_pickle_by_value(sys.modules[__name__])

FAILURE_BUDGET_S = 10.0


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture
def cluster(ray_instance: None) -> Iterator[Cluster]:
    with Cluster(num_nodes=1, interrupt_main_on_failure=False) as c:
        yield c


class _NeedsTwoArguments(Exception):
    """An exception Ray cannot rebuild on the caller's side (``__init__`` takes more than ``args``)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(f"{message} (code {code})")


class Victim(Worker):
    def pid(self) -> int:
        return os.getpid()

    def explode(self, message: str) -> None:
        raise ValueError(message)

    def explode_unpicklable(self, message: str) -> None:
        raise _NeedsTwoArguments(message, 7)

    def exit_process(self, code: int) -> None:
        os._exit(code)

    def block(self, seconds: float) -> str:
        time.sleep(seconds)
        return "finished"

    def patient(self) -> str:
        # A nested call that raises and is handled by the user's method is not a worker failure (the peer
        # exists but sends nothing, so the receive times out).
        try:
            self.recv(self.group_name, (self.rank + 1) % self.world_size, timeout=0.2)
        except TimeoutError:
            return "handled"
        return "received"


class BadInit(Worker):
    def __init__(self) -> None:
        raise RuntimeError("constructor refused")

    def ping(self) -> str:
        return "pong"


def _assert_torn_down(cluster: Cluster, *names: str) -> None:
    """Every named worker actor is gone (Ray reports it dead within a few seconds of the kill)."""
    deadline = time.monotonic() + FAILURE_BUDGET_S
    for name in names:
        while True:
            try:
                handle = ray.get_actor(name, namespace=cluster.namespace)
                ray.get(handle.__ray_ready__.remote(), timeout=2)
            except (ValueError, ray.exceptions.RayActorError):
                break
            assert time.monotonic() < deadline, f"actor {name} still alive after a failure"
            time.sleep(0.2)


def test_raise_in_one_group_ends_a_wait_on_another(cluster: Cluster) -> None:
    victim = Victim.create_group().launch(cluster, NodePlacementStrategy([0]), name="victim")
    bystander = Victim.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="bystander")
    victim.wait_ready(timeout=60)
    bystander.wait_ready(timeout=60)
    long_call = bystander.block(120.0)
    start = time.monotonic()
    victim.explode("kaboom")  # nobody waits on this call: the monitor must notice
    with pytest.raises(WorkerFailedError) as info:
        long_call.wait(timeout=60)
    assert time.monotonic() - start < FAILURE_BUDGET_S
    failure = info.value.failure
    assert (failure.group_name, failure.rank, failure.kind, failure.method) == (
        "victim",
        0,
        "raised",
        "explode",
    )
    assert "ValueError: kaboom" in str(info.value) and "Traceback" in str(info.value)
    _assert_torn_down(cluster, "victim:0", "bystander:0", "bystander:1")
    # The run is over: further calls raise the same failure at once.
    with pytest.raises(WorkerFailedError, match="kaboom"):
        bystander.pid()


def test_raise_in_the_waited_call_reports_that_rank(cluster: Cluster) -> None:
    group = Victim.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="direct")
    group.wait_ready(timeout=60)
    start = time.monotonic()
    with pytest.raises(WorkerFailedError, match=r"direct:1 raised in explode\(\)[\s\S]*ValueError: only one"):
        group.execute_on(1).explode("only one").wait(timeout=60)
    assert time.monotonic() - start < FAILURE_BUDGET_S
    assert cluster.failure is not None and cluster.failure.rank == 1
    _assert_torn_down(cluster, "direct:0", "direct:1")


def test_an_exception_that_cannot_be_unpickled_still_reports_the_failure(cluster: Cluster) -> None:
    """The caller gets WorkerFailedError with the worker's exception type, message and traceback, not Ray's
    "failed to deserialize exception"."""
    group = Victim.create_group().launch(cluster, NodePlacementStrategy([0]), name="unpicklable")
    group.wait_ready(timeout=60)
    with pytest.raises(WorkerFailedError) as info:
        group.explode_unpicklable("robot lost").wait(timeout=60)
    text = str(info.value)
    assert "unpicklable:0 raised in explode_unpicklable()" in text, text
    # the worker's traceback: its frames down to the raising line (Ray may or may not print the "Traceback" header)
    assert (
        "_NeedsTwoArguments: robot lost (code 7)" in text and "raise _NeedsTwoArguments(message, 7)" in text
    ), text


@pytest.mark.parametrize(
    ("how", "cause"),
    [
        ("os_exit", r"called os\._exit\(3\) \(exit code 3\)"),
        ("sigkill", r"SIGKILL \(kill -9"),
        ("sigsegv", r"killed by SIGSEGV \(Segmentation fault\); its Python threads"),
    ],
)
def test_process_death_ends_the_run_naming_the_cause(cluster: Cluster, how: str, cause: str) -> None:
    victim = Victim.create_group().launch(cluster, NodePlacementStrategy([0]), name="mortal")
    other = Victim.create_group().launch(cluster, NodePlacementStrategy([0]), name="other")
    (pid,) = victim.pid().wait(timeout=60)
    long_call = other.block(120.0)
    start = time.monotonic()
    if how == "os_exit":
        victim.exit_process(3)
    else:
        os.kill(pid, signal.SIGKILL if how == "sigkill" else signal.SIGSEGV)
    with pytest.raises(WorkerFailedError) as info:
        long_call.wait(timeout=60)
    assert time.monotonic() - start < FAILURE_BUDGET_S
    failure = info.value.failure
    assert (failure.group_name, failure.rank, failure.kind) == ("mortal", 0, "died")
    assert "worker mortal:0 died" in str(info.value)
    assert re.search(cause, str(info.value)), str(info.value)
    _assert_torn_down(cluster, "other:0")


def test_constructor_failure_is_reported_with_its_traceback(cluster: Cluster) -> None:
    group = BadInit.create_group().launch(cluster, NodePlacementStrategy([0]), name="badinit")
    with pytest.raises(WorkerFailedError, match=r"badinit:0[\s\S]*constructor refused"):
        group.wait_ready(timeout=60)


def test_monitor_records_a_failure_nobody_waits_for(cluster: Cluster) -> None:
    group = Victim.create_group().launch(cluster, NodePlacementStrategy([0]), name="unwatched")
    group.wait_ready(timeout=60)
    group.explode("silent")
    deadline = time.monotonic() + FAILURE_BUDGET_S
    while cluster.failure is None:
        assert time.monotonic() < deadline, "the failure monitor did not notice the raise"
        time.sleep(0.05)
    assert "ValueError: silent" in cluster.failure.details
    _assert_torn_down(cluster, "unwatched:0")


def test_intentional_shutdown_is_not_a_failure(cluster: Cluster) -> None:
    group = Victim.create_group().launch(cluster, NodePlacementStrategy([0]), name="planned")
    group.wait_ready(timeout=60)
    group.shutdown()
    time.sleep(1.5)
    assert cluster.failure is None
    again = Victim.create_group().launch(cluster, NodePlacementStrategy([0]), name="planned")
    assert again.pid().wait(timeout=60)[0] > 0


_DRIVER = textwrap.dedent(
    """
    import os, sys, time
    from rlinf_scheduler import Cluster, NodePlacementStrategy, Worker

    class Bad(Worker):
        def explode(self):
            raise ValueError("driver-visible kaboom")
        def exit_process(self):
            os._exit(7)
        def block(self):
            time.sleep(120)

    mode = sys.argv[1]
    cluster = Cluster(num_nodes=1, ray_address="local", num_cpus=1)
    bad = Bad.create_group().launch(cluster, NodePlacementStrategy([0]), name="bad")
    other = Bad.create_group().launch(cluster, NodePlacementStrategy([0]), name="other")
    bad.wait_ready(timeout=120)
    other.wait_ready(timeout=120)
    print("READY", time.time(), flush=True)
    pending = other.block()
    if mode == "raise":
        bad.explode()
        pending.wait(timeout=60)
    elif mode == "exit":
        bad.exit_process()
        pending.wait(timeout=60)
    elif mode == "sleep":
        bad.explode()
        time.sleep(60)  # not waiting on anything: the monitor must interrupt the main thread
    print("UNREACHABLE", flush=True)
    """
)


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("raise", "ValueError: driver-visible kaboom"),
        ("exit", "worker bad:0 died"),
        pytest.param("sleep", "driver-visible kaboom", marks=pytest.mark.slow),
    ],
)
def test_driver_process_exits_non_zero_with_the_cause(tmp_path: Path, mode: str, expected: str) -> None:
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    env = dict(os.environ, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0", RAY_ADDRESS="")
    proc = subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    exited = time.time()
    ready_lines = [line for line in out.splitlines() if line.startswith("READY")]
    assert ready_lines, f"driver never got ready:\n{out}\n{err}"
    # From the failure to the driver's exit (Ray's own shutdown included).
    assert exited - float(ready_lines[0].split()[1]) < FAILURE_BUDGET_S
    assert proc.returncode != 0
    assert "UNREACHABLE" not in out
    assert expected in err, err


def test_exception_caught_inside_a_method_is_not_a_failure(cluster: Cluster) -> None:
    group = Victim.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="patient")
    assert group.patient().wait(timeout=60) == ["handled", "handled"]
    assert group.pid().wait(timeout=30)[0] > 0  # the run goes on
    group.shutdown()
