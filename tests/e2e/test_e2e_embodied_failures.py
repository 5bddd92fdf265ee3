"""A killed env, rollout or actor process ends the run promptly, naming it, with the last checkpoint intact."""

from __future__ import annotations

import time
from pathlib import Path
from types import ModuleType

import pytest
from rlinf_core.checkpoint import CheckpointManager, find_latest_checkpoint, is_complete

from .conftest import APP_DIR, SMALL

pytestmark = pytest.mark.ray


@pytest.mark.parametrize(
    "target",
    ["env", pytest.param("rollout", marks=pytest.mark.slow), pytest.param("actor", marks=pytest.mark.slow)],
)
def test_killed_worker_ends_the_run(app: ModuleType, tmp_path: Path, target: str) -> None:
    import ray
    from rlinf_scheduler import Cluster, WorkerFailedError

    cfg = app.load_embodied_config(
        APP_DIR / "config" / "cartpole_ppo.yaml",
        [
            *SMALL,
            "runner.max_epochs=50",
            "runner.val_check_interval=-1",
            f"runner.logger.log_path={tmp_path}",
        ],
    )
    killed_at: list[float] = []

    def on_step(step: int, _record: dict[str, float]) -> None:
        if step == 2:
            ray.kill(cluster.groups[target].actor_handles[0], no_restart=True)
            killed_at.append(time.monotonic())

    with Cluster(cfg.cluster, ray_address="local", num_cpus=2, interrupt_main_on_failure=False) as cluster:
        with pytest.raises(WorkerFailedError) as err:
            app.run_embodied(cfg, cluster=cluster, on_step=on_step)
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
