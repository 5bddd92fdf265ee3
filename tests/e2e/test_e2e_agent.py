"""End to end: the agent app (SFT warm-up, multi-turn GRPO with tools, eval, checkpoints, resume) on a tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from rlinf_core.checkpoint import is_complete
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import AgentApp, run_app

from .conftest import assert_profiled

pytestmark = pytest.mark.ray

APP_DIR = Path(__file__).resolve().parents[2] / "apps" / "agent"
CLUSTER_SLOTS = 2  # simulated accelerator slots of the module's cluster (tests/e2e/conftest.py)


@pytest.fixture(scope="module")
def app() -> AgentApp:
    return AgentApp(APP_DIR)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlinf_models.llm.testing import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("agent_tiny"))


def _small(model_dir: Path, log_path: Path, *extra: str) -> list[str]:
    return [
        f"actor.model.model_path={model_dir}",
        "actor.global_batch_size=4",
        "actor.micro_batch_size=2",
        "actor.torch_num_threads=1",
        "actor.optim.lr=0.0001",
        "rollout.torch_num_threads=1",
        "rollout.sampling.max_new_tokens=8",
        "algorithm.group_size=2",
        "algorithm.dynamic_sampling=false",
        "data.rollout_batch_size=2",
        "data.eval_size=4",
        "sft.steps=2",
        "sft.batch_size=2",
        "sft.eval_before=true",
        "agent.max_turns=2",
        "agent.max_new_tokens_per_turn=8",
        "agent.max_total_tokens=320",
        "runner.max_epochs=2",
        "runner.val_check_interval=1",
        "runner.save_interval=1",
        "runner.progress_bar=false",
        "runner.step_timeout_s=300",
        "runner.logger.logger_backends=[]",
        f"runner.logger.log_path={log_path}",
        *extra,
    ]


def test_agent_app_trains_evaluates_checkpoints_and_resumes(
    app: AgentApp, cluster: Any, model_dir: Path, tmp_path: Path
) -> None:
    cfg = app.load_config(
        APP_DIR / "config" / "smollm2_tools.yaml", _small(model_dir, tmp_path, "runner.profile=true")
    )
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    phases = {"rollout": {"agent_episodes"}, "actor": {"actor/run_training"}}
    sizes = app.world_sizes(cfg)
    assert sizes is not None
    assert_profiled(result, phases, sizes, [1, 2])
    records = read_metrics(result.metrics_file)
    sft = [r for r in records if "sft/loss" in r]
    assert len(sft) == 2 and all(r["sft/num_tokens"] > 0 for r in sft)
    pre = [r for r in records if "eval_pre_sft/success_rate" in r]
    evals = [r for r in records if "eval/success_rate" in r]
    assert len(pre) == 1 and [r["step"] for r in evals] == [0, 1, 2]
    assert all(r["eval/num_episodes"] == 4 and 0.0 <= r["eval/success_rate"] <= 1.0 for r in evals)
    train = [r for r in records if "rollout/num_episodes" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert all(r["rollout/num_episodes"] == 4 and r["train/skipped"] == 0.0 for r in train)
    assert all("train/actor/policy_loss" in r for r in train)
    assert is_complete(result.last_checkpoint) and result.last_checkpoint.name == "global_step_2"
    # Resume: one more step continues at step 3 from the saved state (SFT is not repeated).
    more = app.load_config(
        APP_DIR / "config" / "smollm2_tools.yaml",
        _small(model_dir, tmp_path, "runner.max_epochs=3", "runner.resume_dir=auto"),
    )
    again = run_app(app, more, cluster=cluster)
    assert again.global_step == 3
    records = read_metrics(again.metrics_file)
    assert len([r for r in records if "sft/loss" in r]) == 2
    assert [r["step"] for r in records if "rollout/num_episodes" in r] == [1, 2, 3]


@pytest.mark.slow
def test_agent_app_runs_disaggregated_from_yaml(
    app: AgentApp, cluster: Any, model_dir: Path, tmp_path: Path
) -> None:
    cfg = app.load_config(
        APP_DIR / "config" / "smollm2_tools_disaggregated.yaml",
        _small(model_dir, tmp_path, "runner.max_epochs=1", "sft.eval_before=false"),
    )
    assert cfg.cluster.component_placement == {"actor": 0, "rollout,reward": 1}
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 1
    records = read_metrics(result.metrics_file)
    assert [r["step"] for r in records if "eval/success_rate" in r] == [0, 1]
    assert [r["step"] for r in records if "rollout/num_episodes" in r] == [1]
