"""End to end: SAC-Flow (``pendulum_sac_flow``: the flow policy as SAC's actor) through real worker groups."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rlinf_core.checkpoint import is_complete
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import APP_DIR, SAC_SMALL

pytestmark = pytest.mark.ray


def test_pendulum_sac_flow_trains_evaluates_and_checkpoints(
    app: EmbodiedApp, cluster: Any, tmp_path: Path
) -> None:
    overrides = [*SAC_SMALL, f"runner.logger.log_path={tmp_path}", "runner.max_epochs=3"]
    cfg = app.load_config(APP_DIR / "config" / "pendulum_sac_flow.yaml", overrides)
    assert cfg.actor.model.model_type == "flow" and cfg.actor.model.flow_velocity == "gated"
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 3
    records = read_metrics(result.metrics_file)
    train = [r for r in records if "train/replay_buffer/size" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert [r["rollout/random_actions"] for r in train] == [1.0, 0.0, 0.0]
    assert all(r["train/sac/num_updates"] > 0 and r["train/sac/critic_loss"] >= 0 for r in train)
    assert all("train/sac/actor_loss" in r and "train/actor/entropy" in r for r in train)
    evals = [r for r in records if "eval/return_mean" in r]
    assert [r["step"] for r in evals] == [0, 1, 2, 3]
    assert all(r["eval/return_mean"] < 0 for r in evals)
    assert is_complete(tmp_path / "checkpoints" / "global_step_3")


def test_sac_flow_config_errors_before_ray(app: EmbodiedApp, tmp_path: Path) -> None:
    path = APP_DIR / "config" / "pendulum_sac_flow.yaml"
    with pytest.raises(Exception, match="flow_velocity"):
        app.load_config(path, [f"runner.logger.log_path={tmp_path}", "actor.model.flow_velocity=gru"])
    with pytest.raises(Exception, match="joint_logprob"):
        app.load_config(path, [f"runner.logger.log_path={tmp_path}", "actor.model.joint_logprob=false"])
