"""End to end: HG-DAgger (``pendulum_hgdagger``) through Ray: the rollout's gate, gated aggregation, metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rlinf_core.config import ConfigError
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import APP_DIR, assert_same_actor_state

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


def test_half_run_plus_resume_is_bit_identical_to_a_straight_run(
    app: EmbodiedApp, cluster: Any, tmp_path: Path
) -> None:
    """1 step, then a resume to 3: the learner, its optimizer, the aggregate and the metrics of steps 2-3 equal
    those of 3 uninterrupted steps. The gate holds control of an env across the checkpoint, so this needs the
    rollout's gate state in the checkpoint (without it the resumed episodes continue under the learner)."""
    import pickle

    expert = _expert(tmp_path)

    def cfg(log: Path, *extra: str) -> Any:
        overrides = [
            *SMALL,
            "runner.save_interval=1",
            f"runner.logger.log_path={log}",
            f"actor.expert.checkpoint={expert}",
            # No hand-back: control taken in step 1 (discrepancies up to ~0.4) is held for the rest of the
            # episode, through the checkpoint; a fresh gate would not take it in step 2 (discrepancies ~0.1).
            "actor.expert.gate_threshold=0.3",
            "actor.expert.release_threshold=0.0",
            *extra,
        ]
        return app.load_config(APP_DIR / "config" / "pendulum_hgdagger.yaml", overrides)

    ref, half = tmp_path / "straight", tmp_path / "half"
    assert run_app(app, cfg(ref), cluster=cluster).global_step == 3
    assert run_app(app, cfg(half, "runner.max_epochs=1"), cluster=cluster).global_step == 1
    resumed = run_app(app, cfg(half, "runner.resume_dir=auto"), cluster=cluster)
    assert resumed.global_step == 3
    gate = pickle.loads((half / "checkpoints" / "global_step_1" / "rollout" / "gate_rank0.pkl").read_bytes())
    assert gate["control"][0].any(), "the expert holds no env at the checkpoint: the test would not tell"
    for step in (1, 3):
        assert_same_actor_state(
            ref / "checkpoints" / f"global_step_{step}", half / "checkpoints" / f"global_step_{step}"
        )

    def by_step(path: Path) -> dict[tuple[int, bool], dict[str, float]]:
        out = {}
        for r in read_metrics(path / "metrics.jsonl"):
            if int(r["step"]) in (2, 3):
                clean = {
                    k: v for k, v in r.items() if not k.startswith("time/") and k != "rollout/env_steps_per_s"
                }
                out[(int(r["step"]), "eval/return_mean" in r)] = clean
        return out

    expected = by_step(ref)
    assert len(expected) == 4 and all(
        "train/hgdagger/takeovers" in r for (_, ev), r in expected.items() if not ev
    )
    assert by_step(half) == expected


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
