"""End to end: the embodied app through real worker groups, in every placement mode, and resume."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rlinf_core.checkpoint import is_complete
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import APP_DIR, SMALL

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster(app: EmbodiedApp) -> Iterator[Any]:
    from rlinf_scheduler import Cluster

    c = Cluster(
        num_nodes=1,
        simulated_accelerators_per_node=4,
        ray_address="local",
        num_cpus=2,
        interrupt_main_on_failure=False,
    )
    try:
        yield c
    finally:
        c.shutdown()


PLACEMENTS = {
    "collocated": (['cluster.component_placement={"actor,env,rollout": 0}'], 1),
    "disaggregated": (["cluster.component_placement={actor: 0, rollout: 1, env: 2}"], 1),
    # Two actor ranks (FSDP2 on gloo) overlapping env and rollout, which run on disjoint slots; 2 stages.
    "hybrid": (
        ["cluster.component_placement={actor: 0-1, env: 2, rollout: 3}", "rollout.pipeline_stage_num=2"],
        2,
    ),
}


def _cfg(app: EmbodiedApp, tmp_path: Path, *extra: str) -> Any:
    overrides = [
        *SMALL,
        "cluster.simulated_accelerators_per_node=4",
        f"runner.logger.log_path={tmp_path}",
        *extra,
    ]
    return app.load_config(APP_DIR / "config" / "cartpole_ppo.yaml", overrides)


@pytest.mark.parametrize("mode", list(PLACEMENTS))
def test_placement_modes_train_evaluate_and_checkpoint(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, mode: str
) -> None:
    extra, actor_ranks = PLACEMENTS[mode]
    cfg = _cfg(app, tmp_path, *extra)
    assert app.world_sizes(cfg)["actor"] == actor_ranks
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    records = read_metrics(result.metrics_file)
    train = [r for r in records if "train/actor/total_loss" in r]
    evals = [r for r in records if "eval/return_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 1, 2]  # before each step, and after the last
    assert all(r["env/steps"] == 32 for r in train)  # 4 envs x 8 steps
    assert all(0 < r["eval/return_mean"] <= 20 and r["eval/num_episodes"] == 4 for r in evals)
    assert all(r["time/wall_s"] > 0 for r in records)
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["global_step_1", "global_step_2"]
    assert result.last_checkpoint == tmp_path / "checkpoints" / "global_step_2"
    assert is_complete(result.last_checkpoint)


def test_resume_continues_at_the_next_step(app: EmbodiedApp, cluster: Any, tmp_path: Path) -> None:
    first = run_app(app, _cfg(app, tmp_path, "runner.val_check_interval=-1"), cluster=cluster)
    assert first.global_step == 2
    lrs = {int(r["step"]): r["train/actor/lr"] for r in read_metrics(first.metrics_file)}
    # Same run, longer: `auto` picks global_step_2 and training continues with step 3.
    cfg = _cfg(
        app,
        tmp_path,
        "runner.val_check_interval=-1",
        "runner.max_epochs=3",
        "runner.resume_dir=auto",
        "actor.optim.reset_lr_schedule_on_resume=true",  # a longer run: rebuild the schedule over 3 steps
    )
    second = run_app(app, cfg, cluster=cluster)
    assert second.global_step == 3
    records = read_metrics(second.metrics_file)
    assert [int(r["step"]) for r in records] == [1, 2, 3]  # appended to the same metrics.jsonl
    assert is_complete(tmp_path / "checkpoints" / "global_step_3")
    # The optimizer state came back: the rebuilt linear schedule continues from step 2 of 3, not from scratch.
    assert lrs[1] == pytest.approx(1e-3) and records[-1]["train/actor/lr"] == pytest.approx(1e-3 / 3)
    # Standalone evaluation of a checkpoint.
    metrics = run_app(app, _cfg(app, tmp_path, "runner.max_epochs=3"), cluster=cluster, evaluate_only="auto")
    assert metrics["eval/checkpoint_step"] == 3 and metrics["eval/num_episodes"] == 4
