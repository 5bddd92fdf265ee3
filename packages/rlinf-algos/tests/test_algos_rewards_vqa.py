"""The ``vqa`` reward: multiple-choice and open answers, format terms, weights, registry."""

from __future__ import annotations

import pytest
from rlinf_algos.rewards import (
    VQAReward,
    get_reward_class,
    reward_registry,
    vqa_accuracy,
    vqa_format_scores,
)


@pytest.mark.parametrize(
    ("response", "reference", "expected"),
    [
        ("<think>three circles</think><answer>B. 3</answer>", "B. 3", True),
        ("<answer>b. 3</answer>", "B. 3", True),  # letter in any case
        ("<answer>B.   Red Circle </answer>", "B. red circle", True),  # content lower-cased and trimmed
        ("<answer>B. red</answer>", "B. red circle", True),  # RLinf's lenient containment, either way
        ("<answer>B. a big red circle</answer>", "B. red circle", True),
        ("<answer>C. 3</answer>", "B. 3", False),  # wrong letter, right text
        ("<answer>B. 4</answer>", "B. 3", False),  # right letter, wrong text
        ("<answer>B</answer>", "B. 3", False),  # no text: not the multiple-choice form
        ("B. 3", "B. 3", False),  # no answer tag
        ("<answer>A. 1</answer><answer>B. 3</answer>", "B. 3", False),  # the FIRST answer counts
        ("<answer>F. 3</answer>", "B. 3", False),  # letters A-E only
        # Open short answers (a reference without a letter).
        ("<answer> The red circle. </answer>", "red circle", True),
        ("<answer>3</answer>", "3", True),
        ("<answer>33</answer>", "3", False),
        ("<answer></answer>", "", False),
        ("the answer is 3", "3", False),
    ],
)
def test_vqa_accuracy_table(response: str, reference: str, expected: bool) -> None:
    assert vqa_accuracy(response, reference) is expected


@pytest.mark.parametrize(
    ("response", "think", "answer"),
    [
        ("<think>a</think><answer>A. x</answer>", 1.0, 1.0),
        ("  <think>a</think>\n<answer>A. x</answer>  ", 1.0, 1.0),  # stripped first
        ("<answer>A. x</answer>", 0.0, 1.0),
        ("text <think>a</think><answer>A. x</answer>", 0.0, 1.0),  # the think block must come first
        ("<think>a</think><think>b</think><answer>A. x</answer>", 0.0, 1.0),  # one think block only
        ("<think>a</think><answer>x</answer>", 1.0, 0.0),  # not a multiple-choice answer
        ("<think>a", 0.0, 0.0),
    ],
)
def test_vqa_format_scores(response: str, think: float, answer: float) -> None:
    assert vqa_format_scores(response) == {"think_format": think, "answer_format": answer}


def _loop_reward(response: str, refs: list[str], weights: dict[str, float]) -> float:
    """The reward written out term by term."""
    acc = 1.0 if any(vqa_accuracy(response, r) for r in refs) else 0.0
    fmt = vqa_format_scores(response)
    return (
        weights["qa_accuracy"] * acc
        + weights["think_format"] * fmt["think_format"]
        + weights["answer_format"] * fmt["answer_format"]
    )


def test_weighted_sum_matches_term_by_term() -> None:
    weights = {"qa_accuracy": 1.0, "think_format": 0.25, "answer_format": 0.5}
    reward = VQAReward(reward_weights=weights)
    responses = [
        "<think>count them</think><answer>A. 2</answer>",
        "<answer>A. 2</answer>",
        "<think>x</think><answer>C. 5</answer>",
        "<think>x</think>",
        "nothing",
    ]
    refs = [["A. 2"], ["A. 2"], ["A. 2", "C. 5"], ["A. 2"], ["A. 2"]]
    assert reward.get_reward(responses, refs) == [
        _loop_reward(r, g, weights) for r, g in zip(responses, refs, strict=True)
    ]
    assert reward.get_reward(responses, refs) == [1.75, 1.5, 1.75, 0.25, 0.0]
    assert reward.score(responses[0], "A. 2") == {
        "qa_accuracy": 1.0,
        "think_format": 1.0,
        "answer_format": 1.0,
        "reward": 1.75,
    }


def test_default_weights_are_accuracy_only() -> None:
    reward = VQAReward()
    assert reward.weights == {"qa_accuracy": 1.0, "think_format": 0.0, "answer_format": 0.0}
    assert reward.get_reward(["<think>a</think><answer>B. 2</answer>"], ["A. 1"]) == [0.0]


@pytest.mark.parametrize(
    ("weights", "match"),
    [
        ({"qa_accuracy": 1.0}, "exactly the keys qa_accuracy, think_format, answer_format"),
        ({"qa_accuracy": 1.0, "think_format": 0.0, "answer_format": 0.0, "extra": 1.0}, "exactly the keys"),
        ({"qa_accuracy": 1.0, "think_format": -0.1, "answer_format": 0.0}, "non-negative"),
    ],
)
def test_bad_weights_are_refused(weights: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VQAReward(reward_weights=weights)


def test_length_mismatch_is_refused() -> None:
    with pytest.raises(ValueError, match="same length"):
        VQAReward().get_reward(["a", "b"], [["A. 1"]])


def test_registered_as_vqa() -> None:
    assert "vqa" in reward_registry
    assert get_reward_class("VQA") is VQAReward
