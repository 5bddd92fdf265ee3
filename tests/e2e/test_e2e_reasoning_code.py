"""The coding config loads, its generated task set is valid and held out, and its references pass the reward."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from rlinf_algos.rewards import CodeReward
from rlinf_runners.apps import ReasoningApp

from .test_e2e_reasoning import APP_DIR, placement_mode

CONFIG = APP_DIR / "config" / "grpo_smollm2_code_cpu.yaml"


@pytest.fixture(scope="module")
def app() -> ReasoningApp:
    return ReasoningApp(APP_DIR)


def _prepare_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rlinf_reasoning_code", APP_DIR / "prepare_code_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_code_config_loads(app: ReasoningApp) -> None:
    cfg = app.load_config(CONFIG)
    assert cfg.reward.reward_type == "code" and cfg.reward.correct_threshold == 1.0
    assert dict(cfg.reward.kwargs)["partial_credit"] is False
    assert placement_mode(cfg) == "collocated" and cfg.actor.model.model_path == "smollm2-135m-instruct"
    assert cfg.sft.steps > 0 and cfg.algorithm.adv_type == "grpo"


def test_shipped_code_tasks_are_held_out(app: ReasoningApp) -> None:
    data = app.load_datasets(app.load_config(CONFIG))
    tasks = {name: {e.extra["task"] for e in data[name]} for name in ("train", "eval", "sft")}
    assert len(tasks["eval"]) == len(data["eval"]) == 100
    assert not tasks["eval"] & (tasks["train"] | tasks["sft"])
    assert all(len(e.answers) == 4 and e.answers[0].startswith("assert ") for e in data["eval"])
    # The warm-up demonstrates some templates only; train and eval hold all of them.
    demonstrated = {t.name for t in _prepare_module().TEMPLATES if t.sft}
    templates = {name: {task.split("/")[0] for task in tasks[name]} for name in tasks}
    assert templates["sft"] <= demonstrated
    assert templates["eval"] - demonstrated and templates["train"] - demonstrated
    assert templates["train"] | templates["sft"] <= templates["eval"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")
def test_reference_solutions_pass_and_generation_is_deterministic(tmp_path: Path) -> None:
    module = _prepare_module()
    sizes = {"eval": 5, "sft": 5, "train": 5}
    first, again = module.generate(sizes, 3), module.generate(sizes, 3)
    assert first == again
    assert first != module.generate(sizes, 4)
    rows = [r for split in first.values() for r in split]
    assert len({r["task"] for r in rows}) == 15
    demonstrated = {t.name for t in module.TEMPLATES if t.sft}
    assert all(r["task"].split("/")[0] in demonstrated for r in first["sft"])
    rewards = CodeReward().get_reward([r["solution"] for r in rows], [r["answer"] for r in rows])
    assert rewards == [1.0] * 15
    assert (
        module.main(["--out", str(tmp_path), "--train", "3", "--eval", "2", "--sft", "2", "--no-verify"]) == 0
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.jsonl", "sft.jsonl", "train.jsonl"]
