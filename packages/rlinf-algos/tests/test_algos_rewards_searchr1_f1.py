"""Search-R1 reward with ``metric: f1`` (SQuAD token F1 of the last ``<answer>``) next to ``em``."""

from __future__ import annotations

import pytest
from rlinf_algos.rewards import SearchR1Reward, answer_f1, searchr1_score


def test_answer_f1_by_hand() -> None:
    # "eiffel tower paris" vs "eiffel tower" (after normalisation): 2 shared, P = 2/3, R = 1 -> F1 = 0.8
    assert answer_f1("The Eiffel Tower, Paris", "eiffel tower") == pytest.approx(0.8)
    assert answer_f1("tower", ["Eiffel Tower", "tower"]) == 1.0  # best over the accepted answers
    assert answer_f1("a a b", "a b b") == pytest.approx(2 / 3)  # counts with multiplicity: 2 shared of 3
    assert answer_f1("", "x") == 0.0 and answer_f1("x", "") == 0.0 and answer_f1("y", "x") == 0.0


def test_searchr1_score_f1_and_em() -> None:
    text = "<answer>old Eiffel Tower</answer>"
    assert searchr1_score(text, "Eiffel Tower") == 0.0  # em: not exact
    assert searchr1_score(text, "Eiffel Tower", metric="f1") == pytest.approx(0.8)
    assert searchr1_score(text, "Eiffel Tower", metric="f1", format_score=0.2) == pytest.approx(
        0.2 + 0.8 * 0.8
    )
    assert searchr1_score("<answer>no</answer>", "yes", metric="f1", format_score=0.1) == 0.1
    assert searchr1_score("no tag", "yes", metric="f1") == 0.0
    spam = "<answer>x</answer>" * 11 + "<answer>eiffel tower</answer>"
    assert searchr1_score(spam, "Eiffel Tower", metric="f1") == 0.25
    with pytest.raises(ValueError, match="metric: unknown value 'rouge'; allowed: em, f1"):
        searchr1_score(text, "x", metric="rouge")  # type: ignore[arg-type]


def test_reward_class_metric() -> None:
    responses = ["<answer>Eiffel Tower</answer>", "<answer>the tower</answer>"]
    refs = [["eiffel tower"], ["Eiffel Tower"]]
    assert SearchR1Reward().get_reward(responses, refs) == [1.0, 0.0]
    assert SearchR1Reward(metric="f1").get_reward(responses, refs) == pytest.approx([1.0, 2 / 3])
    with pytest.raises(ValueError, match="allowed: em, f1"):
        SearchR1Reward(metric="bleu")
