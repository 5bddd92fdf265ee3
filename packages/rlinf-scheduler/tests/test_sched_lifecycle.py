"""A driver's end as the OS sees it: clean shutdown output, and what a SIGKILLed driver leaves behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rlinf_scheduler._reaper import _descendants, _stat

pytestmark = [
    pytest.mark.ray,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

_DRIVER = textwrap.dedent(
    """
    import asyncio, os, sys, time
    import torch
    from rlinf_scheduler import Channel, Cluster, NodePlacementStrategy, Worker

    class Sleeper(Worker):
        def nap(self, seconds):
            time.sleep(seconds)
            return self.rank

        def feed(self, ch):
            ch.put(self.rank)
            try:
                ch.get(key="never", timeout=120)  # still waiting when the channel shuts down
            except RuntimeError:
                return "closed"

    cluster = Cluster(num_nodes=1, ray_address="local", num_cpus=1)
    group = Sleeper.create_group().launch(cluster, NodePlacementStrategy([0]), name="sleeper")
    assert group.nap(0).wait(timeout=120) == [0]
    ch = Channel.create("lifecycle")
    ch.put({"t": torch.ones(1 << 18)})
    ch.get(timeout=30)

    async def cancelled_get():
        try:
            await asyncio.wait_for(ch.get_async(), 0.2)
        except asyncio.TimeoutError:
            pass

    asyncio.run(cancelled_get())
    if sys.argv[1] == "kill":
        group.nap(600)
        print("READY", os.getpid(), flush=True)
        time.sleep(600)
    fed = group.feed(ch)  # a second connection to the channel actor, with a request waiting in it
    assert ch.get(timeout=60) == 0
    time.sleep(0.5)
    ch.shutdown()
    assert fed.wait(timeout=60) == ["closed"]
    cluster.shutdown()
    print("CLEAN EXIT", flush=True)
    """
)


def _alive(pid: int, start: int) -> bool:
    """Whether the process still runs (a zombie waiting for its reaper counts as gone)."""
    st = _stat(pid)
    if st is None or st[1] != start:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return False
    return raw[raw.rindex(b")") + 2 :].split()[0] != b"Z"


def _driver(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "driver.py"
    script.write_text(_DRIVER)
    env = dict(os.environ, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0", RAY_ADDRESS="")
    return subprocess.Popen(
        [sys.executable, str(script), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_clean_shutdown_prints_no_asyncio_warning(tmp_path: Path) -> None:
    proc = _driver(tmp_path, "clean")
    try:
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "CLEAN EXIT" in out, err
    # Worker and channel-actor output reaches the driver (log_to_driver); none of these may appear.
    bad_lines = (
        "Task was destroyed",
        "never retrieved",
        "InvalidStateError",
        "Exception in callback",
        "Traceback",
    )
    for bad in bad_lines:
        assert bad not in err and bad not in out, err


def test_sigkilled_driver_leaves_no_ray_process_behind(tmp_path: Path) -> None:
    proc = _driver(tmp_path, "kill")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("READY"), proc.stderr.read() if proc.stderr else line
        time.sleep(2.0)  # let Ray start everything it starts (agents, the worker's process)
        below = _descendants(proc.pid)
        names = {pid: Path(f"/proc/{pid}/cmdline").read_bytes()[:80] for pid in below}
        assert any(b"raylet" in n for n in names.values()), names
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10.0
        left = dict(below)
        while left and time.monotonic() < deadline:
            left = {pid: start for pid, start in left.items() if _alive(pid, start)}
            time.sleep(0.2)
        assert not left, {pid: names.get(pid) for pid in left}
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
