"""RLPD on ManiSkill PickCube: the scripted-expert demo generator, the config's demo path, a short run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rlinf_core.config import ConfigError
from rlinf_runners.apps import EmbodiedApp

from .conftest import APP_DIR

pytest.importorskip("mani_skill", reason='needs the ManiSkill extra: pip install "rlinf-envs[maniskill]"')

CONFIG = APP_DIR / "config" / "maniskill_pickcube_rlpd.yaml"
EPISODES = 2


@pytest.fixture(scope="module")
def vulkan_env() -> Iterator[None]:
    """ManiSkill's Vulkan driver for this process and the workers it starts (skip without one)."""
    from rlinf_envs.maniskill import find_installed_icd

    saved = os.environ.get("VK_ICD_FILENAMES")
    icd = find_installed_icd()
    if saved is None and icd is None:
        msg = "no Vulkan driver for ManiSkill: run scripts/install_vulkan_cpu.sh"
        if os.environ.get("CI"):
            pytest.fail(f".ci/run must provide the Vulkan driver ({msg})")
        pytest.skip(msg)
    if saved is None:
        os.environ["VK_ICD_FILENAMES"] = str(icd)
    yield
    if saved is None:
        os.environ.pop("VK_ICD_FILENAMES", None)


@pytest.fixture(scope="module")
def demos(tmp_path_factory: pytest.TempPathFactory, vulkan_env: None) -> tuple[Path, str]:
    """``make_demos.py`` run for 2 episodes on 2 envs: the file and what it printed."""
    out = tmp_path_factory.mktemp("demos") / "pickcube.pt"
    proc = subprocess.run(
        [
            sys.executable,
            str(APP_DIR / "make_demos.py"),
            "--episodes",
            str(EPISODES),
            "--num-envs",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, proc.stdout


def test_make_demos_writes_transitions_the_demo_buffer_samples(demos: tuple[Path, str]) -> None:
    import torch
    from rlinf_models.offpolicy import TRANSITION_KEYS, ReplayBuffer, SymmetricSampler

    path, printed = demos
    assert "expert on PickCube-v1 (pd_ee_delta_pos): " in printed and f"of {EPISODES} episodes" in printed
    buf = ReplayBuffer.load(path, min_size=1, seed=0)
    data = buf.contents()
    n = len(buf)
    assert set(data) == set(TRANSITION_KEYS)
    # Only solved episodes, 50 steps each, chunks of 1; the policy's action space (4 = xyz + gripper).
    assert n % 50 == 0 and n >= 50
    assert data["obs"].shape == (n, 42) and data["next_obs"].shape == (n, 42)
    assert data["actions"].shape == (n, 1, 4) and data["actions"].dtype == torch.float32
    assert (data["actions"].abs() <= 1.0).all()
    assert data["rewards"].shape == (n, 1) and data["rewards"].dtype == torch.float32
    assert data["terminations"].shape == (n, 1) and not data["terminations"].any()  # ignore_terminations
    assert ((data["rewards"] >= 0) & (data["rewards"] <= 1)).all()  # normalized_dense
    # Each episode is stored in order: the next observation is the following transition's observation.
    for start in range(0, n, 50):
        assert torch.equal(data["next_obs"][start : start + 49], data["obs"][start + 1 : start + 50])
    assert (data["rewards"].reshape(-1, 50).max(dim=1).values == 1.0).all()  # PickCube's success reward
    # The online buffer holds the same fields (trajectory_transitions): RLPD batches mix them half and half.
    online = ReplayBuffer(8)
    online.add({k: v[:4] for k, v in data.items()})
    batch = SymmetricSampler(online, buf).sample(6)
    assert batch["obs"].shape == (6, 42) and batch["actions"].shape == (6, 1, 4)


def test_rlpd_config_refuses_a_missing_demo_file_naming_the_command(app: EmbodiedApp) -> None:
    with pytest.raises(ConfigError) as err:
        app.load_config(CONFIG, ["algorithm.demo_buffer.load_path=/nonexistent/demos.pt"])
    text = str(err.value)
    assert "algorithm.demo_buffer.load_path: no file '/nonexistent/demos.pt'" in text
    assert "uv run apps/embodied/make_demos.py --config-name" in text


def test_relative_demo_path_is_looked_up_in_the_app_dir(tmp_path: Path, demos: tuple[Path, str]) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "pickcube_demos.pt").write_bytes(demos[0].read_bytes())
    app = EmbodiedApp(tmp_path)
    cfg = app.load_config(CONFIG)  # load_path: data/pickcube_demos.pt, not under the working directory
    assert cfg.algorithm.demo_buffer is not None
    assert cfg.algorithm.demo_buffer.load_path == "data/pickcube_demos.pt"
    assert cfg.env.train.control_mode == cfg.env.eval.control_mode == "pd_ee_delta_pos"
    assert cfg.actor.model.num_q_heads == 10 and cfg.actor.model.q_layer_norm
    assert cfg.algorithm.critic_subsample_size == 2


@pytest.mark.ray
@pytest.mark.slow
def test_rlpd_smoke_run(app: EmbodiedApp, tmp_path: Path, demos: tuple[Path, str]) -> None:
    from rlinf_core.metrics import read_metrics
    from rlinf_runners.apps import run_app

    overrides = [
        "runner.max_epochs=3",
        "runner.val_check_interval=3",
        "runner.save_interval=-1",
        "runner.progress_bar=false",
        "runner.logger.logger_backends=[]",
        f"runner.logger.log_path={tmp_path}",
        f"algorithm.demo_buffer.load_path={demos[0]}",
        "algorithm.random_warmup_steps=1",
        "algorithm.utd_ratio=0.5",
        "algorithm.replay_buffer.min_buffer_size=8",
        "env.train.total_num_envs=2",
        "env.eval.total_num_envs=2",
        "env.eval.max_steps_per_rollout_epoch=10",
        "env.eval.max_episode_steps=10",
        "actor.global_batch_size=16",
        "actor.micro_batch_size=16",
        "actor.model.hidden_sizes=[32]",
    ]
    cfg = app.load_config(CONFIG, overrides)
    result = run_app(app, cfg)
    assert result.global_step == 3
    records: list[dict[str, Any]] = read_metrics(result.metrics_file)
    train = [r for r in records if "train/replay_buffer/size" in r]
    assert [r["train/replay_buffer/size"] for r in train] == [8.0, 16.0, 24.0]
    assert [r["train/sac/num_updates"] for r in train] == [4.0, 4.0, 4.0]
    assert all(r["train/sac/critic_loss"] >= 0 for r in train)
    evals = [r for r in records if "eval/success_rate" in r]
    assert [r["step"] for r in evals] == [0, 3]
