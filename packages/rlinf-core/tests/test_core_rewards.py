"""RewardConfig / build_reward / RewardWorker.compute (the worker's method called in-process)."""

from __future__ import annotations

import importlib.util

import pytest
from rlinf_core.rewards import RewardConfig, RewardWorker, build_reward

needs_math = pytest.mark.skipif(
    importlib.util.find_spec("math_verify") is None, reason="needs rlinf-algos[math] (math-verify)"
)


@needs_math
def test_math_reward_worker_scores_boxed_answers() -> None:
    worker = RewardWorker(RewardConfig(reward_scale=2.0, reward_min_val=0.0, timeout_s=20.0))
    try:
        out = worker.compute(
            ["so 3 + 4 = \\boxed{7}", "\\boxed{8}", "no answer", "\\boxed{\\frac{1}{2}}"],
            [["7"], ["7"], ["7"], ["0.5"]],
        )
    finally:
        worker.reward._verifier.close()
    assert out == {"rewards": [2.0, 0.0, 0.0, 2.0], "correct": [True, False, False, True]}


def test_is_correct_thresholds() -> None:
    assert RewardConfig().is_correct(1.0) and not RewardConfig().is_correct(-1.0)
    assert RewardConfig(reward_scale=5.0).is_correct(5.0) and not RewardConfig(reward_scale=5.0).is_correct(
        1.0
    )
    assert RewardConfig(correct_threshold=0.5).is_correct(0.6)
    assert RewardConfig(reward_type="searchr1").is_correct(0.25)
    assert not RewardConfig(reward_type="searchr1").is_correct(0.0)


def test_errors() -> None:
    with pytest.raises(ValueError, match=r"reward_max_val .* must be greater"):
        RewardConfig(reward_max_val=0.0, reward_min_val=0.0)
    with pytest.raises(ValueError, match="searchr1"):
        build_reward(RewardConfig(reward_type="nope"))


def test_other_registered_rewards_take_kwargs() -> None:
    reward = build_reward(RewardConfig(reward_type="searchr1", kwargs={"score": 2.0}))
    assert reward.get_reward(["<answer>Paris</answer>"], [["paris"]]) == [2.0]


@needs_math
def test_compute_checks_lengths() -> None:
    worker = RewardWorker(RewardConfig())
    with pytest.raises(ValueError, match="2 responses but 1 reference lists"):
        worker.compute(["a", "b"], [["1"]])
    assert worker.compute([], []) == {"rewards": [], "correct": []}
