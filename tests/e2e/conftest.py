from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

APP_DIR = Path(__file__).resolve().parents[2] / "apps" / "embodied"


def load_app_config() -> ModuleType:
    """``apps/embodied/config.py`` as a module (apps are scripts, not an installed package)."""
    name = "rlinf_embodied_app_config"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, APP_DIR / "config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def app() -> ModuleType:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    return load_app_config()


# A CartPole run small enough for a test: 4 envs x 8 steps, 2 training steps, tiny eval.
SMALL = [
    "runner.max_epochs=2",
    "runner.val_check_interval=1",
    "runner.save_interval=1",
    "runner.stop_eval_return=null",
    "runner.progress_bar=false",
    "runner.step_timeout_s=120",
    "runner.logger.logger_backends=[]",
    "env.train.total_num_envs=4",
    "env.train.max_steps_per_rollout_epoch=8",
    "env.eval.total_num_envs=4",
    "env.eval.max_steps_per_rollout_epoch=20",
    "env.eval.max_episode_steps=20",
    "actor.global_batch_size=32",
    "actor.micro_batch_size=16",
    "actor.model.hidden_sizes=[16]",
    "algorithm.update_epoch=2",
]
