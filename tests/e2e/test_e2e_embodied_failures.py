"""A killed env, rollout or actor process ends the run promptly, naming it, with the last checkpoint intact."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from rlinf_core.checkpoint import CheckpointManager, find_latest_checkpoint, is_complete
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import APP_DIR, SMALL

pytestmark = pytest.mark.ray


@pytest.mark.parametrize(
    "target",
    ["env", pytest.param("rollout", marks=pytest.mark.slow), pytest.param("actor", marks=pytest.mark.slow)],
)
def test_killed_worker_ends_the_run(app: EmbodiedApp, tmp_path: Path, target: str) -> None:
    _kill_at_step_2(app, tmp_path, target)


@pytest.mark.parametrize("target", ["env", pytest.param("actor", marks=pytest.mark.slow)])
def test_killed_worker_ends_the_async_run(app: EmbodiedApp, tmp_path: Path, target: str) -> None:
    """runner.mode: async: the kill lands while the next rollout batch is produced during the update."""
    _kill_at_step_2(app, tmp_path, target, "runner.mode=async", "algorithm.loss_type=decoupled_actor_critic")


@pytest.mark.parametrize(
    ("target", "mode"),
    [
        ("actor", "sync"),
        pytest.param("env", "sync", marks=pytest.mark.slow),
        # Slow: the failure path of an asynchronous run is AsyncEnvRunner's, already run by the PPO case above.
        pytest.param("actor", "async", marks=pytest.mark.slow),
        pytest.param("env", "async", marks=pytest.mark.slow),
    ],
)
def test_killed_worker_ends_the_offpolicy_run(
    app: EmbodiedApp, tmp_path: Path, target: str, mode: str
) -> None:
    """pendulum_sac: the actor holds the replay buffer; its death must end the run like any other. In an
    asynchronous run the kill lands while the next batch is collected during the SAC steps."""
    _kill_at_step_2(
        app,
        tmp_path,
        target,
        f"runner.mode={mode}",
        "algorithm.replay_buffer.min_buffer_size=16",
        config="pendulum_sac",
    )


def _kill_at_step_2(
    app: EmbodiedApp, tmp_path: Path, target: str, *extra: str, config: str = "cartpole_ppo"
) -> None:
    import ray
    from rlinf_scheduler import Cluster, WorkerFailedError

    cfg = app.load_config(
        APP_DIR / "config" / f"{config}.yaml",
        [
            *SMALL,
            "runner.max_epochs=50",
            "runner.val_check_interval=-1",
            f"runner.logger.log_path={tmp_path}",
            *extra,
        ],
    )
    killed_at: list[float] = []

    def on_step(step: int, _record: dict[str, float]) -> None:
        if step == 2:
            ray.kill(cluster.groups[target].actor_handles[0], no_restart=True)
            killed_at.append(time.monotonic())

    with Cluster(cfg.cluster, ray_address="local", num_cpus=2, interrupt_main_on_failure=False) as cluster:
        with pytest.raises(WorkerFailedError) as err:
            run_app(app, cfg, cluster=cluster, on_step=on_step)
        elapsed = time.monotonic() - killed_at[0]
    assert f"{target}:0" in str(err.value)
    assert elapsed < 10.0, f"the run took {elapsed:.1f} s to end after {target}:0 was killed"
    latest = find_latest_checkpoint(tmp_path)
    assert latest is not None and latest.name in ("global_step_1", "global_step_2") and is_complete(latest)
    assert (latest / "actor" / "model.pt").is_file()
    # Every visible checkpoint is complete; a staging directory of the interrupted save (if the dying worker
    # still wrote into it) is hidden and removed by the next run's clean_stale().
    root = tmp_path / "checkpoints"
    assert all(is_complete(p) for p in root.iterdir() if p.name.startswith("global_step_"))
    CheckpointManager(tmp_path).clean_stale()
    assert sorted(p.name for p in root.iterdir()) == sorted(
        p.name for p in root.iterdir() if p.name.startswith("global_step_")
    )


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (Linux /proc walk; Ray's raylet and workers descend from the driver)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _cmdline(pid: int) -> str:
    try:
        return (
            (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


@pytest.mark.slow
def test_train_script_exits_non_zero_when_an_env_process_is_killed(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys

    cmd = [
        sys.executable,
        str(APP_DIR / "train.py"),
        *[o for o in SMALL if not o.startswith("runner.max_epochs")],
        "runner.max_epochs=200",
        "runner.val_check_interval=-1",
        f"runner.logger.log_path={tmp_path}",
        "cluster.ray_address=local",
    ]
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 180
        while find_latest_checkpoint(tmp_path) is None:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no checkpoint within 180 s"
            time.sleep(0.2)
        victims = [p for p in _descendants(proc.pid) if "EnvWorker" in _cmdline(p)]
        assert victims, "no EnvWorker process found below the driver"
        os.kill(victims[0], signal.SIGKILL)
        killed = time.monotonic()
        _, stderr = proc.communicate(timeout=30)
        elapsed = time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode not in (0, None), stderr[-3000:]
    assert elapsed < 10.0, f"train.py took {elapsed:.1f} s to exit after the env process was killed"
    assert "env:0" in stderr, stderr[-3000:]
    latest = find_latest_checkpoint(tmp_path)
    assert latest is not None and is_complete(latest) and (latest / "actor" / "model.pt").is_file()
