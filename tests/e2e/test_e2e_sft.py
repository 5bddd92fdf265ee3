"""End to end: record CartPole episodes, SFT on them, start PPO from the SFT checkpoint (actor.model.model_path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from rlinf_core.data.lerobot import LeRobotReader
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, EmbodiedSFTConfig, run_app, run_sft
from rlinf_runners.apps._collect import expert_env, record_episodes, write_dataset

from .conftest import APP_DIR, SMALL, assert_profiled

SFT_CONFIG = APP_DIR / "config" / "sft" / "cartpole_sft.yaml"


def _balance(obs: Any) -> np.ndarray:
    """A CartPole controller: push towards the side the pole falls to (``[E, 1]`` actions)."""
    return (obs[:, 2] + 0.5 * obs[:, 3] > 0).astype(np.int64)[:, None]


@pytest.fixture(scope="module")
def demos(app: EmbodiedApp, tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = app.load_config(
        APP_DIR / "config" / "cartpole_ppo.yaml", [*SMALL, "env.train.max_episode_steps=40"]
    )
    env = expert_env(cfg, 4, auto_reset=True)
    try:
        episodes, outcomes = record_episodes(env, _balance, chunks=1, episodes=8, seed=0, only_success=False)
    finally:
        env.close()
    assert len(episodes) == 8 and outcomes == [None] * 8  # CartPole defines no success
    assert all(len(e["reward"]) == 40 for e in episodes)  # the controller balances until the time limit
    root = tmp_path_factory.mktemp("demos") / "cartpole"
    return write_dataset(root, env.spec, episodes, fps=50, task="balance the pole")


def _sft_cfg(app: EmbodiedApp, demos: Path, log_path: Path) -> Any:
    from rlinf_core.config import load_config

    overrides = [
        f"data.train_data_paths=[{demos}]",
        "data.val_ratio=0.25",
        "data.eval_env=false",
        f"runner.logger.log_path={log_path}",
        "runner.max_epochs=120",
        "runner.val_check_interval=40",
        "runner.save_interval=60",
        "runner.progress_bar=false",
        "runner.profile=true",
        "runner.logger.logger_backends=[]",
        "actor.global_batch_size=64",
        "actor.micro_batch_size=64",
        "actor.model.hidden_sizes=[16]",
        "actor.optim.lr=0.02",
        "actor.optim.lr_schedule=constant",
    ]
    return load_config(EmbodiedSFTConfig, SFT_CONFIG, overrides)


def test_recorded_dataset_is_lerobot_v3(demos: Path) -> None:
    reader = LeRobotReader(demos)
    assert (reader.num_episodes, reader.num_frames) == (8, 320)
    assert set(reader.features) >= {"observation.state", "action", "next.reward", "next.done"}
    state, action = reader.column("observation.state"), reader.column("action")
    np.testing.assert_array_equal(action[:, 0], _balance(state)[:, 0])  # each frame's own action
    assert reader.task_of_frames()[0] == "balance the pole"


@pytest.fixture(scope="module")
def sft_run(app: EmbodiedApp, demos: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    log_path = tmp_path_factory.mktemp("sft")
    result, env_metrics = run_sft(app, _sft_cfg(app, demos, log_path))
    assert env_metrics == {}  # data.eval_env: false
    return result, log_path


def test_sft_learns_the_demonstrations_and_checkpoints(sft_run: tuple[Any, Path]) -> None:
    result, log_path = sft_run
    assert result.global_step == 120
    records = read_metrics(result.metrics_file)
    val = [r["eval/val_loss"] for r in records if "eval/val_loss" in r]
    assert len(val) == 4 and val[-1] < 0.5 * val[0]  # steps 0, 40, 80, 120
    assert [p.name for p in sorted((log_path / "checkpoints").iterdir())] == [
        "global_step_120",
        "global_step_60",
    ]
    assert result.last_checkpoint == log_path / "checkpoints" / "global_step_120"
    assert (result.last_checkpoint / "actor" / "model.pt").is_file()
    # profiled: the driver is the only process, each step a span
    assert_profiled(
        result, {"driver": {"train_step 1", "train_step 120", "evaluate"}}, {}, list(range(1, 121))
    )


def test_sft_refuses_data_that_does_not_fit_the_env(app: EmbodiedApp, demos: Path, tmp_path: Path) -> None:
    from rlinf_core.data import DatasetError

    cfg = _sft_cfg(app, demos, tmp_path)
    import attrs

    pendulum = attrs.evolve(cfg.env, train=attrs.evolve(cfg.env.train, env_id="Pendulum-v1"))
    with pytest.raises(
        DatasetError, match=r"feature 'observation\.state' is float32 \[4\]; .* needs float32 \[3\]"
    ):
        run_sft(app, attrs.evolve(cfg, env=pendulum))


@pytest.mark.ray
def test_ppo_starts_from_the_sft_checkpoint(
    app: EmbodiedApp, cluster: Any, sft_run: tuple[Any, Path], tmp_path: Path
) -> None:
    sft, _ = sft_run
    assert sft.last_checkpoint is not None
    sft_weights = torch.load(sft.last_checkpoint / "actor" / "model.pt", weights_only=True)
    cfg = app.load_config(
        APP_DIR / "config" / "cartpole_ppo.yaml",
        [
            *SMALL,
            "cluster.simulated_accelerators_per_node=4",
            f"runner.logger.log_path={tmp_path / 'ppo'}",
            "runner.max_epochs=1",
            "actor.optim.lr=1e-12",  # the update leaves the weights as loaded
            f"actor.model.model_path={sft.last_checkpoint}",
        ],
    )
    result = run_app(app, cfg, cluster=cluster)
    ppo_weights = torch.load(result.last_checkpoint / "actor" / "model.pt", weights_only=True)
    assert set(ppo_weights) == set(sft_weights)
    for key, value in sft_weights.items():
        torch.testing.assert_close(ppo_weights[key], value, atol=1e-6, rtol=0)
    assert [r["step"] for r in read_metrics(result.metrics_file) if "eval/return_mean" in r] == [0, 1]


@pytest.mark.slow  # two command-line runs (about 30 s here)
def test_collect_command_records_a_checkpoints_episodes(demos: Path, tmp_path: Path) -> None:
    from rlinf_core.protocols import EnvSpec
    from rlinf_models.policies import PolicyConfig, build_policy

    torch.manual_seed(0)
    spec = EnvSpec((4,), "discrete", 1, num_actions=2)
    weights = tmp_path / "ckpt" / "actor" / "model.pt"
    weights.parent.mkdir(parents=True)
    torch.save(build_policy(spec, PolicyConfig()).state_dict(), weights)
    out = subprocess.run(
        [
            sys.executable,
            str(APP_DIR / "collect.py"),
            "--checkpoint",
            str(weights.parent.parent),
            "--episodes",
            "3",
            "--num-envs",
            "2",
            "--out",
            str(tmp_path / "ds"),
            "env.train.max_episode_steps=30",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "episode 3/3: return" in out.stdout
    assert LeRobotReader(tmp_path / "ds").num_episodes == 3
    bad = subprocess.run(
        [sys.executable, str(APP_DIR / "collect.py"), "--expert", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "scripted experts drive maniskill tasks" in bad.stderr
