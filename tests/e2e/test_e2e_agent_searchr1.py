"""End to end: Search-R1 on the agent app, collocated and disaggregated, on a tiny model.

The rollout's search calls the ``retriever`` worker group and the reward scores the ``<answer>`` (F1 here).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import AgentApp

pytestmark = pytest.mark.ray

APP_DIR = Path(__file__).resolve().parents[2] / "apps" / "agent"
CLUSTER_SLOTS = 2  # simulated accelerator slots of the module's cluster (tests/e2e/conftest.py)
SEARCHR1 = APP_DIR / "config" / "searchr1_smollm2.yaml"


@pytest.fixture(scope="module")
def app() -> AgentApp:
    return AgentApp(APP_DIR)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rlinf_models.llm.testing import make_tiny_model_dir

    return make_tiny_model_dir(tmp_path_factory.mktemp("searchr1_tiny"))


def _small(model_dir: Path, log_path: Path, *extra: str) -> list[str]:
    return [
        f"actor.model.model_path={model_dir}",
        "actor.global_batch_size=4",
        "actor.micro_batch_size=2",
        "actor.torch_num_threads=1",
        "rollout.torch_num_threads=1",
        "rollout.sampling.max_new_tokens=8",
        "algorithm.group_size=2",
        "algorithm.dynamic_sampling=false",
        "data.rollout_batch_size=2",
        "data.eval_size=4",
        "sft.steps=1",
        "sft.batch_size=2",
        "agent.max_turns=2",
        "agent.max_new_tokens_per_turn=8",
        "agent.max_total_tokens=320",
        "runner.max_epochs=1",
        "runner.val_check_interval=-1",
        "runner.save_interval=-1",
        "runner.progress_bar=false",
        "runner.step_timeout_s=300",
        "runner.logger.logger_backends=[]",
        f"runner.logger.log_path={log_path}",
        "reward.kwargs.metric=f1",
        "reward.correct_threshold=0.5",
        *extra,
    ]


@pytest.mark.parametrize(
    "placement",
    [
        pytest.param(['cluster.component_placement={"actor,rollout,reward,retriever": 0}'], id="collocated"),
        pytest.param(
            [
                "cluster.simulated_accelerators_per_node=2",
                'cluster.component_placement={"actor": 0, "rollout,reward,retriever": 1}',
            ],
            id="disaggregated",
            marks=pytest.mark.slow,
        ),
    ],
)
def test_searchr1_rollout_calls_the_retriever_group_and_scores_f1(
    app: AgentApp, cluster: Any, model_dir: Path, tmp_path: Path, placement: list[str]
) -> None:
    cfg = app.load_config(SEARCHR1, _small(model_dir, tmp_path, *placement))
    groups = app.launch(cfg, cluster)
    try:
        assert set(groups) == {"actor", "rollout", "reward", "retriever"}
        retriever = groups["retriever"]
        # The group itself: batched top-k over the shipped corpus.
        hits = retriever.search(["capital of Zasgrox", "", "year Lampon founded"], 2).wait(timeout=60)[0]
        assert [h["id"] for h in hits[0]][:1] == ["k-zasgrox"] and hits[1] == []
        assert hits[2][0]["id"] == "k-lampon" and len(hits[2]) == 2
        retriever.pop_timings().wait(timeout=60)
        # The rollout's search tool goes through the group: the SFT demonstrations run the real tools.
        call = '<tool_call>{"name": "search", "arguments": {"query": "capital of Zasgrox"}}</tool_call>'
        demo = {"question": "What is the capital of Zasgrox?", "demo": [call, "<answer>Drimmur</answer>"]}
        built = groups["rollout"].build_demonstrations([demo], shard=False).wait(timeout=120)[0]
        assert len(built) == 1 and sum(built[0]["loss_mask"]) > 0
        timings = retriever.pop_timings().wait(timeout=60)[0]
        assert timings.get("retrieve", 0.0) > 0.0  # the rollout's call reached the retriever
        # The reward: F1 of the <answer> (partial credit), EM would give 0 for the second.
        scored = (
            groups["reward"]
            .compute(
                ["<answer>Drimmur</answer>", "<answer>old Drimmur town</answer>", "no tag"],
                [["Drimmur"], ["Drimmur town"], ["x"]],
                shard=False,
            )
            .wait(timeout=60)[0]
        )
        assert scored["rewards"] == pytest.approx([1.0, 0.8, 0.0])
        # One SFT update and one RL step through the runner, with the retriever in the loop.
        result = app.build_runner(cfg, cluster, groups).run()
        assert result.global_step == 1
        records = read_metrics(result.metrics_file)
        train = [r for r in records if "rollout/num_episodes" in r]
        assert len(train) == 1 and train[0]["rollout/num_episodes"] == 4
        assert 0.0 <= train[0]["rollout/reward_mean"] <= 1.0
        assert any("sft/loss" in r for r in records)
    finally:
        for group in groups.values():
            group.shutdown()
