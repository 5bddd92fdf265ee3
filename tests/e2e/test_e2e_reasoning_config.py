"""The reasoning app's configs and command line, without Ray: every YAML loads, bad ones fail clearly."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from rlinf_core.config import ConfigError
from rlinf_core.data import load_prompt_dataset
from rlinf_runners.apps import ReasoningApp

from .test_e2e_reasoning import APP_DIR, placement_mode

# The *_gpu.yaml examples need GPU backends (megatron-core); tests/e2e/test_e2e_llm_backends.py loads them. The
# Qwen2.5-VL configs read a model written by scripts/make_tiny_qwen2_5_vl.py: tests/e2e/test_e2e_reasoning_vlm.py.
CONFIGS = sorted(
    p.stem
    for p in (APP_DIR / "config").glob("*.yaml")
    if not p.stem.endswith("_gpu") and "qwen2_5_vl" not in p.stem
)


@pytest.fixture(scope="module")
def app() -> ReasoningApp:
    return ReasoningApp(APP_DIR)


def test_the_expected_configs_exist() -> None:
    assert {
        "grpo_smollm2_cpu",
        "dapo_smollm2_cpu",
        "ppo_smollm2_cpu",
        "reinpp_smollm2_cpu",
        "grpo_smollm2_disaggregated",
    } <= set(CONFIGS)


@pytest.mark.parametrize("name", CONFIGS)
def test_every_config_loads_and_places(app: ReasoningApp, name: str) -> None:
    cfg = app.load_config(APP_DIR / "config" / f"{name}.yaml")
    assert app.world_sizes(cfg) == {"actor": 1, "rollout": 1, "reward": 1}
    expected = "disaggregated" if "disaggregated" in name or "pipeline" in name else "collocated"
    assert placement_mode(cfg) == expected
    assert cfg.actor.model.model_path == "smollm2-135m-instruct"
    if cfg.algorithm.adv_type == "gae":
        assert cfg.actor.model.add_value_head and cfg.algorithm.loss_type == "actor_critic"


def test_dapo_and_reinpp_switches(app: ReasoningApp) -> None:
    dapo = app.load_config(APP_DIR / "config" / "dapo_smollm2_cpu.yaml").algorithm
    assert dapo.dynamic_sampling and dapo.overlong_filter and dapo.clip_ratio_high > dapo.clip_ratio_low
    reinpp = app.load_config(APP_DIR / "config" / "reinpp_smollm2_cpu.yaml").algorithm
    assert reinpp.adv_type == "reinpp" and reinpp.use_reinpp_baseline and reinpp.reinpp_kl_beta > 0


def test_cross_section_problems_are_listed_together(app: ReasoningApp, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        app.load_config(
            APP_DIR / "config" / "grpo_smollm2_cpu.yaml",
            [
                "algorithm.adv_type=gae",
                "algorithm.loss_type=actor_critic",
                f"data.train_path={tmp_path / 'missing.jsonl'}",
                "algorithm.overlong_buffer_len=100",
                "rollout.sampling.temperature=1.0",
                "data.rollout_batch_size=3",
            ],
        )
    text = str(err.value)
    for needle in (
        "data.train_path",
        "add_value_head must be true",
        "overlong_buffer_len (100) exceeds rollout.sampling.max_new_tokens (40)",
        "actor.temperature (0.7) must equal rollout.sampling.temperature (1.0)",
        "must be a multiple of actor.global_batch_size (32)",
    ):
        assert needle in text, text
    with pytest.raises(ConfigError, match="neither collocated"):
        app.load_config(
            APP_DIR / "config" / "grpo_smollm2_cpu.yaml",
            ["cluster.simulated_accelerators_per_node=2", "cluster.component_placement.rollout=0-1"],
        )
    with pytest.raises(ConfigError, match=r"no placement for \['reward'\]"):
        app.load_config(APP_DIR / "config" / "grpo_smollm2_cpu.yaml", ["~cluster.component_placement.reward"])


def test_a_math_reward_without_math_verify_is_refused_at_load(
    app: ReasoningApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the check the reward workers fail on start, after Ray and the model workers are up."""
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object) -> object:
        return None if name == "math_verify" else real_find_spec(name, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(
        ConfigError, match=r"reward.reward_type 'math' needs math-verify.*rlinf-algos\[math\]"
    ):
        app.load_config(APP_DIR / "config" / "grpo_smollm2_cpu.yaml")
    monkeypatch.undo()
    assert app.load_config(APP_DIR / "config" / "grpo_smollm2_cpu.yaml").reward.reward_type == "math"


def test_shipped_data_is_valid_and_held_out(app: ReasoningApp) -> None:
    cfg = app.load_config(APP_DIR / "config" / "grpo_smollm2_cpu.yaml")
    data = app.load_datasets(cfg)
    assert len(data["train"]) == 2000 and len(data["eval"]) == 200 and len(data["sft"]) == 400
    train = {e.extra["expression"] for e in data["train"]}
    sft = {e.extra["expression"] for e in data["sft"]}
    held_out = {e.extra["expression"] for e in data["eval"]}
    assert not held_out & (train | sft)
    for example in list(data["sft"])[:20]:
        assert example.solution.endswith(f"\\boxed{{{example.answers[0]}}}.")


def _prepare_data_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rlinf_reasoning_prepare", APP_DIR / "prepare_data.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_prepare_data_splits_share_the_term_mix() -> None:
    module = _prepare_data_module()
    # 2-term expressions are few and repeated, 3-term ones many: a split-by-split dedup would starve train.
    two = [f"{a} + {b}" for a in range(5) for b in range(4)]  # 20 distinct
    three = [f"{a} - {b} + {c}" for a in range(10) for b in range(10) for c in range(3)]  # 300 distinct
    pool = [{"expression": e} for e in (two * 5 + three)]  # 100 two-term draws, 300 three-term
    splits = module._split(pool, {"eval": 8, "sft": 4, "train": 24})
    mix = {
        name: sum(module._num_terms(r) == 2 for r in rows) / len(rows)  # the pool has 25% two-term draws
        for name, rows in splits.items()
    }
    assert {len(rows) for rows in splits.values()} == {8, 4, 24} and set(mix.values()) == {0.25}
    expressions = [r["expression"] for rows in splits.values() for r in rows]
    assert len(expressions) == len(set(expressions))  # disjoint, distinct
    with pytest.raises(SystemExit, match="2-term problems: the splits need 25 distinct expressions"):
        module._split(pool, {"eval": 20, "sft": 20, "train": 60})


def test_prepare_data_worked_solution() -> None:
    module = _prepare_data_module()
    assert module.worked_solution("12 + 7 - 3") == (
        "12 + 7 = 19. 19 - 3 = 16. The answer is \\boxed{16}.",
        16,
    )
    assert module.worked_solution("4 - 9") == ("4 - 9 = -5. The answer is \\boxed{-5}.", -5)


def _train_py(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    return subprocess.run(
        [sys.executable, str(APP_DIR / "train.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_train_py_prints_the_config_and_rejects_bad_ones(tmp_path: Path) -> None:
    out = _train_py("--config-name", "ppo_smollm2_cpu", "--print-config")
    assert out.returncode == 0, out.stderr
    assert "adv_type: gae" in out.stdout and "add_value_head: true" in out.stdout
    bad = _train_py("algorithm.adv_type=grpo_video", "algorithm.group_size=1")
    assert bad.returncode == 2
    assert "algorithm.adv_type 'grpo_video' is not one of grpo, reinpp, gae" in bad.stderr
    field = _train_py("data.rollout_batch_size=0")
    assert (
        field.returncode == 2 and "data.rollout_batch_size: 'rollout_batch_size' must be >= 1" in field.stderr
    )
    missing = _train_py("--config-name", "nope")
    assert missing.returncode == 2 and "available: " in missing.stderr


def test_prepare_data_writes_loadable_files(tmp_path: Path) -> None:
    pytest.importorskip("reasoning_gym")
    out = subprocess.run(
        [
            sys.executable,
            str(APP_DIR / "prepare_data.py"),
            "--out",
            str(tmp_path),
            "--train",
            "30",
            "--eval",
            "10",
            "--sft",
            "10",
            "--no-verify",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert len(load_prompt_dataset(tmp_path / "train.jsonl")) == 30
    sft = load_prompt_dataset(tmp_path / "sft.jsonl", require_solution=True)
    assert len(sft) == 10
    row = json.loads((tmp_path / "eval.jsonl").read_text().splitlines()[0])
    assert set(row) == {"prompt", "answer", "expression"}


def test_dynamic_scaling_needs_a_disaggregated_placement(app: ReasoningApp) -> None:
    """``runner.dynamic_scaling`` adds one actor rank per rollout device; a collocated run has none to take."""
    cfg = app.load_config(
        APP_DIR / "config" / "grpo_smollm2_disaggregated.yaml", ["runner.dynamic_scaling=true"]
    )
    assert app.world_sizes(cfg) == {"actor": 2, "rollout": 1, "reward": 1}
    with pytest.raises(
        ConfigError, match=r"runner\.dynamic_scaling .*needs a disaggregated placement.*collocated"
    ):
        app.load_config(APP_DIR / "config" / "grpo_smollm2_cpu.yaml", ["runner.dynamic_scaling=true"])
    # The grown actor splits the batch over both ranks: the batch checks count them.
    with pytest.raises(
        ConfigError, match=r"actor\.global_batch_size \(8\) must be a multiple of .*actor ranks \(2\)"
    ):
        app.load_config(
            APP_DIR / "config" / "grpo_smollm2_disaggregated.yaml",
            ["runner.dynamic_scaling=true", "actor.global_batch_size=8", "actor.micro_batch_size=8"],
        )
