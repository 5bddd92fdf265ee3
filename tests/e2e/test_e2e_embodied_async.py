"""End to end: asynchronous embodied PPO (``runner.mode: async``) through real worker groups.

With ``algorithm.staleness_threshold: 0`` the asynchronous runner computes what the synchronous one does (same
weights, optimizer state and metrics); with a positive bound every sample's lag stays within it; a resume is a
continuation. (A killed worker: ``test_e2e_embodied_failures.py``.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rlinf_core.checkpoint import is_complete
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import (
    APP_DIR,
    SMALL,
    assert_profiled,
    assert_same_actor_state,
    assert_same_shared_metrics,
    metric_records,
)

pytestmark = pytest.mark.ray

ASYNC = ["runner.mode=async", "algorithm.loss_type=decoupled_actor_critic"]


def _cfg(app: EmbodiedApp, tmp_path: Path, *extra: str) -> Any:
    # A constant learning rate: a half run plans the same schedule as a whole one (resume tests).
    overrides = [
        *SMALL,
        "runner.max_epochs=4",
        "cluster.simulated_accelerators_per_node=4",
        "actor.optim.lr_schedule=constant",
        f"runner.logger.log_path={tmp_path}",
        *extra,
    ]
    return app.load_config(APP_DIR / "config" / "cartpole_ppo.yaml", overrides)


def _records(metrics_file: Path) -> dict[tuple[int, str], dict[str, float]]:
    # Loss metrics only one of the two losses reports are compared where both have them.
    return metric_records(metrics_file, "train/actor/total_loss")


@pytest.fixture(scope="module")
def sync_run(app: EmbodiedApp, cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sync")
    assert run_app(app, _cfg(app, path), cluster=cluster).global_step == 4
    return path


def test_staleness_zero_reproduces_the_synchronous_run(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, sync_run: Path
) -> None:
    """Same seed, 4 steps: weights, optimizer and trainer state after every step and every shared metric
    (losses, episode returns, evaluations) are bit-identical to the synchronous PPO run's. The asynchronous run
    is profiled: recording its timeline changes nothing it computes."""
    cfg = _cfg(app, tmp_path, *ASYNC, "algorithm.staleness_threshold=0", "runner.profile=true")
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 4
    phases = {"env": {"env_step"}, "rollout": {"inference"}, "actor": {"actor/run_training"}}
    sizes = app.world_sizes(cfg)
    assert sizes is not None
    assert_profiled(result, phases, sizes, [1, 2, 3, 4])
    for step in range(1, 5):
        assert_same_actor_state(
            sync_run / "checkpoints" / f"global_step_{step}", tmp_path / "checkpoints" / f"global_step_{step}"
        )
    expected, got = _records(sync_run / "metrics.jsonl"), _records(tmp_path / "metrics.jsonl")
    assert expected.keys() == got.keys() and len(expected) == 9  # 4 train steps, 5 evaluations
    losses = ("env/num_episodes", "train/actor/policy_loss", "train/critic/value_loss")
    assert_same_shared_metrics(expected, got, in_train=losses)
    for r in read_metrics(tmp_path / "metrics.jsonl"):
        if "staleness/max" in r:
            assert r["staleness/max"] == 0 and r["staleness/frac_0"] == 1.0


def test_staleness_bound_is_honoured_and_logged(app: EmbodiedApp, cluster: Any, tmp_path: Path) -> None:
    """Bound 1, no checkpoints or evaluations in the way: every sample lags its training weights by at most one
    version, and each step logs the histogram (fractions summing to one) and the decoupled loss's versions."""
    extra = [
        *ASYNC,
        "algorithm.staleness_threshold=1",
        "runner.save_interval=0",
        "runner.val_check_interval=-1",
    ]
    result = run_app(app, _cfg(app, tmp_path, *extra, "runner.max_epochs=6"), cluster=cluster)
    assert result.global_step == 6
    train = [r for r in read_metrics(result.metrics_file) if "train/actor/total_loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    for r in train:
        assert 0 <= r["staleness/min"] <= r["staleness/mean"] <= r["staleness/max"] <= 1
        fracs = [v for k, v in r.items() if k.startswith("staleness/frac_")]
        assert len(fracs) == 8 and sum(fracs) == pytest.approx(1.0)
        assert r["env/steps"] == 32 and "train/actor/proximal_approx_kl" in r
    assert train[0]["staleness/max"] == 0  # batch 0 can only use the initial weights
    assert is_complete(result.last_checkpoint)  # type: ignore[arg-type]


def test_half_run_plus_resume_equals_a_straight_run_at_staleness_zero(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, sync_run: Path
) -> None:
    """Staleness 0, 2 steps then a resume to 4: bit-identical to the 4 straight steps (here: the synchronous
    run, which the staleness-0 run equals)."""
    common = [*ASYNC, "algorithm.staleness_threshold=0"]
    assert run_app(app, _cfg(app, tmp_path, *common, "runner.max_epochs=2"), cluster=cluster).global_step == 2
    resumed = run_app(app, _cfg(app, tmp_path, *common, "runner.resume_dir=auto"), cluster=cluster)
    assert resumed.global_step == 4
    for step in (2, 3, 4):
        assert_same_actor_state(
            sync_run / "checkpoints" / f"global_step_{step}", tmp_path / "checkpoints" / f"global_step_{step}"
        )
    expected, got = _records(sync_run / "metrics.jsonl"), _records(tmp_path / "metrics.jsonl")
    assert_same_shared_metrics(expected, got, (3, "train"), (4, "train"), (3, "eval"), (4, "eval"))


def test_resume_with_a_positive_bound_continues_the_run(
    app: EmbodiedApp, cluster: Any, tmp_path: Path
) -> None:
    """Bound 2, checkpoint every 2 steps: the run resumes at step 3 from a checkpoint taken between batches."""
    common = [
        *ASYNC,
        "algorithm.staleness_threshold=2",
        "runner.save_interval=2",
        "runner.val_check_interval=-1",
    ]
    assert run_app(app, _cfg(app, tmp_path, *common, "runner.max_epochs=2"), cluster=cluster).global_step == 2
    resumed = run_app(app, _cfg(app, tmp_path, *common, "runner.resume_dir=auto"), cluster=cluster)
    assert resumed.global_step == 4
    steps = [int(r["step"]) for r in read_metrics(resumed.metrics_file) if "train/actor/total_loss" in r]
    assert steps == [1, 2, 3, 4]
    assert all(r["staleness/max"] <= 2 for r in read_metrics(resumed.metrics_file) if "staleness/max" in r)


def test_two_actor_ranks_and_two_pipeline_stages(app: EmbodiedApp, cluster: Any, tmp_path: Path) -> None:
    """Hybrid placement, FSDP over 2 actor ranks: the proximal forward of stale samples stays collective."""
    extra = [
        *ASYNC,
        "algorithm.staleness_threshold=1",
        "cluster.component_placement={actor: 0-1, env: 2, rollout: 3}",
        "rollout.pipeline_stage_num=2",
        "runner.val_check_interval=2",
        "runner.save_interval=2",
    ]
    result = run_app(app, _cfg(app, tmp_path, *extra), cluster=cluster)
    assert result.global_step == 4 and is_complete(result.last_checkpoint)  # type: ignore[arg-type]
    train = [r for r in read_metrics(result.metrics_file) if "train/actor/total_loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert all(r["staleness/max"] <= 1 and r["env/steps"] == 32 for r in train)
