"""The evaluation's per-task table (eval/results.json and results.md) from the env ranks' episode lists."""

from __future__ import annotations

from rlinf_runners._embodied import _merge_episode_stats, per_task_results, results_markdown

RANKS = [
    {
        "returns": [1.0, 0.0, 1.0],
        "lengths": [10, 20, 12],
        "successes": [True, False, True],
        "successes_at_end": [True, False, False],
        "tasks": ["pick bowl", "open drawer", "pick bowl"],
        "videos": ["/x/rank0_env0_pick_bowl_success.mp4"],
    },
    {
        "returns": [0.0],
        "lengths": [20],
        "successes": [False],
        "successes_at_end": [False],
        "tasks": ["open drawer"],
        "videos": [],
    },
]


def test_tasks_grouped_over_ranks_in_first_seen_order() -> None:
    table = per_task_results(RANKS, "libero_spatial")
    assert [r["task"] for r in table["tasks"]] == ["pick bowl", "open drawer"]
    bowl, drawer = table["tasks"]
    assert bowl == {
        "task": "pick bowl",
        "episodes": 2,
        "success_rate": 1.0,
        "success_at_end": 0.5,
        "return_mean": 1.0,
    }
    assert drawer["episodes"] == 2 and drawer["success_rate"] == 0.0
    assert table["episodes"] == 4 and table["success_rate"] == 0.5 and len(table["videos"]) == 1
    md = results_markdown(table, "Evaluation at step 3")
    assert "| pick bowl | 2 | 1.000 | 0.500 | 1.000 |" in md and "success rate 0.500" in md
    assert "rank0_env0_pick_bowl_success.mp4" in md


def test_single_task_envs_and_envs_without_success() -> None:
    cartpole = [{"returns": [200.0, 150.0], "lengths": [200, 150], "successes": [], "tasks": []}]
    table = per_task_results(cartpole, "CartPole-v1")
    assert table["tasks"] == [
        {
            "task": "CartPole-v1",
            "episodes": 2,
            "success_rate": None,
            "success_at_end": None,
            "return_mean": 175.0,
        }
    ]
    assert "| CartPole-v1 | 2 | - | - | 175.000 |" in results_markdown(table, "t")
    metrics = _merge_episode_stats(RANKS, "eval")
    assert metrics["eval/success_rate"] == 0.5 and metrics["eval/success_at_end"] == 0.25
    assert "eval/success_rate" not in _merge_episode_stats(cartpole, "eval")
