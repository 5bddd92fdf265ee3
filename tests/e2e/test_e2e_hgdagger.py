"""End to end: HG-DAgger (``pendulum_hgdagger``) through Ray: the rollout's gate, gated aggregation, metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rlinf_core.config import ConfigError
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import APP_DIR

pytestmark = pytest.mark.ray

CLUSTER_SLOTS = 1  # simulated accelerator slots of the module's cluster (tests/e2e/conftest.py)

# 2 envs x 8 steps per training step, 3 training steps, an evaluation and a checkpoint after each.
SMALL = [
    "runner.max_epochs=3",
    "runner.val_check_interval=1",
    "runner.save_interval=3",
    "runner.stop_eval_return=null",
    "runner.progress_bar=false",
    "runner.step_timeout_s=120",
    "runner.logger.logger_backends=[]",
    "env.train.total_num_envs=2",
    "env.train.max_steps_per_rollout_epoch=8",
    "env.eval.total_num_envs=2",
    "env.eval.max_steps_per_rollout_epoch=20",
    "env.eval.max_episode_steps=20",
    "actor.global_batch_size=8",
    "actor.micro_batch_size=8",
    "actor.model.hidden_sizes=[16]",
    "actor.expert.model.hidden_sizes=[16]",
    "algorithm.update_epoch=3",
    "algorithm.replay_buffer.min_buffer_size=1",
]


def _expert(tmp_path: Path) -> Path:
    """An untrained expert's checkpoint in the layout of a run (``.../global_step_1/actor/model.pt``)."""
    import torch
    from rlinf_envs.gymnasium import gymnasium_spec
    from rlinf_models.policies import PolicyConfig, build_inference_policy

    # pendulum_hgdagger's actor.expert.model with SMALL's hidden sizes
    model = PolicyConfig(
        add_value_head=False,
        add_q_head=True,
        num_q_heads=2,
        hidden_sizes=(16,),
        activation="relu",
        ortho_init=False,
    )
    torch.manual_seed(7)
    policy = build_inference_policy(gymnasium_spec("Pendulum-v1"), model)
    path = tmp_path / "expert" / "global_step_1"
    (path / "actor").mkdir(parents=True)
    torch.save(policy.state_dict(), path / "actor" / "model.pt")
    return path


def test_pendulum_hgdagger_aggregates_only_the_experts_steps(
    app: EmbodiedApp, cluster: Any, tmp_path: Path
) -> None:
    expert = _expert(tmp_path)
    cfg = app.load_config(
        APP_DIR / "config" / "pendulum_hgdagger.yaml",
        [
            *SMALL,
            f"runner.logger.log_path={tmp_path / 'run'}",
            f"actor.expert.checkpoint={expert}",
            # Low thresholds: the untrained expert and learner disagree enough for takeovers and hand-backs.
            "actor.expert.gate_threshold=0.1",
            "actor.expert.release_threshold=0.05",
        ],
    )
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 3
    train = [r for r in read_metrics(result.metrics_file) if "train/replay_buffer/size" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    rates = [r["train/hgdagger/intervention_rate"] for r in train]
    added = [r["train/hgdagger/aggregated"] for r in train]
    # One action per chunk: every step the expert controlled is a sample, and nothing else is.
    assert added == [rate * 16 for rate in rates]
    assert [r["train/replay_buffer/size"] for r in train] == [sum(added[: i + 1]) for i in range(3)]
    assert sum(added) > 0 and all(0 <= rate <= 1 for rate in rates)
    assert sum(r["train/hgdagger/takeovers"] for r in train) >= 1
    assert all(r["train/hgdagger/discrepancy"] >= 0 for r in train)
    assert all("train/dagger/beta" not in r for r in train)
    assert result.last_checkpoint is not None
    # The aggregate's labels are the expert's actions (the ones the gate executed), normalised to [-1, 1].
    import torch
    from rlinf_envs.gymnasium import gymnasium_spec
    from rlinf_models.offpolicy import build_expert

    assert cfg.actor.expert is not None
    buf = torch.load(result.last_checkpoint / "actor" / "trainer.pt", weights_only=True)["buffer"]["contents"]
    assert buf["obs"].shape == (int(sum(added)), 3)
    expert = build_expert(gymnasium_spec("Pendulum-v1"), cfg.actor.expert)
    want = expert.act(buf["obs"], deterministic=True).actions.clamp(-2.0, 2.0) / 2.0
    torch.testing.assert_close(buf["expert_actions"], want)


def test_gating_mistakes_fail_at_config_load_naming_the_key(app: EmbodiedApp, tmp_path: Path) -> None:
    path = APP_DIR / "config" / "pendulum_hgdagger.yaml"
    with pytest.raises(
        ConfigError, match=r"actor\.expert\.gating: 'human' is not one of 'mixture', 'discrepancy'"
    ):
        app.load_config(path, ["actor.expert.gating=human"])
    with pytest.raises(
        ConfigError, match=r"actor\.expert\.release_threshold \(0\.5\) must be <= actor\.expert\.gate"
    ):
        app.load_config(path, ["actor.expert.release_threshold=0.5"])
    with pytest.raises(ConfigError, match=r"actor\.expert\.checkpoint: no expert weights at"):
        app.load_config(path, [f"actor.expert.checkpoint={tmp_path / 'none'}"])
    # A real human needs no expert policy, and an env that reports the takeovers in its step info.
    human = app.load_config(path, ["actor.expert.gating=intervention", "actor.expert.checkpoint="])
    assert human.actor.expert is not None and human.actor.expert.checkpoint == ""
    rgb = APP_DIR / "config" / "maniskill_pushcube_rgb_dagger.yaml"
    with pytest.raises(
        ConfigError, match=r"gating 'intervention' reads the human's takeovers .* 'maniskill'"
    ):
        app.load_config(rgb, ["actor.expert.gating=intervention", "actor.expert.checkpoint="])
