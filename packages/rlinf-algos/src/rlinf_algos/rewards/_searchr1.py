"""Search-R1 answer reward: exact match (RLinf ``SearchR1Reward``) or token F1 of the ``<answer>`` (pure strings)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from typing import Literal

__all__ = ["SEARCHR1_METRICS", "SearchR1Reward", "answer_f1", "normalize_answer", "searchr1_score"]

SEARCHR1_METRICS = ("em", "f1")
"""``em``: exact match after :func:`normalize_answer` (Search-R1, RLinf); ``f1``: SQuAD token F1 (:func:`answer_f1`)."""

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lower-case, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def answer_f1(prediction: str, golden_answers: str | Sequence[str]) -> float:
    """SQuAD token F1 of ``prediction``, the best over the accepted answers (both normalised first).

    Precision and recall count shared tokens with multiplicity (``Counter`` intersection), as the SQuAD v1.1
    evaluation script does. An empty side scores 0.

    Example:
        >>> round(answer_f1("the Eiffel Tower in Paris", ["Eiffel Tower"]), 3)
        0.667
    """
    golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    pred = normalize_answer(prediction).split()
    best = 0.0
    for gold in golds:
        ref = normalize_answer(gold).split()
        common = sum((Counter(pred) & Counter(ref)).values())
        if common == 0:
            continue
        precision, recall = common / len(pred), common / len(ref)
        best = max(best, 2 * precision * recall / (precision + recall))
    return best


def searchr1_score(
    response: str,
    golden_answers: str | Sequence[str],
    *,
    score: float = 1.0,
    format_score: float = 0.0,
    max_answer_tags: int = 10,
    metric: Literal["em", "f1"] = "em",
) -> float:
    """Score of the LAST ``<answer>...</answer>`` in ``response``: exact match, or token F1.

    Args:
        response: the model output.
        golden_answers: one accepted answer or several (any may match after `normalize_answer`).
        score: reward of a correct answer (``f1``: of an F1 of 1).
        format_score: reward of a well-formed but wrong answer (``f1``: of an F1 of 0).
        max_answer_tags: more than this many ``<answer>`` or ``</answer>`` tags divides the reward of a
            (partly) correct answer by 4 (guards against spamming answers, RLinf).
        metric: ``em`` (Search-R1 and RLinf) or ``f1`` (``format_score + (score - format_score) * F1``).

    Returns:
        0.0 without an answer tag; ``em``: ``score`` (or ``score / 4``) on a match, ``format_score`` otherwise.

    Raises:
        ValueError: for an unknown ``metric``.
    """
    if metric not in SEARCHR1_METRICS:
        raise ValueError(f"metric: unknown value {metric!r}; allowed: {', '.join(SEARCHR1_METRICS)}")
    matches = list(_ANSWER_RE.finditer(response))
    if not matches:
        return 0.0
    answer = matches[-1].group(1).strip()
    golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    if metric == "f1":
        f1 = answer_f1(answer, golds)
        if f1 == 0.0:
            return format_score
        earned = format_score + (score - format_score) * f1
    else:
        prediction = normalize_answer(answer)
        if not any(normalize_answer(g) == prediction for g in golds):
            return format_score
        earned = score
    too_many = response.count("<answer>") > max_answer_tags or response.count("</answer>") > max_answer_tags
    return earned / 4 if too_many else earned


class SearchR1Reward:
    """Rule-based reward of Search-R1 question answering (registered as ``"searchr1"``).

    ``metric: em`` is Search-R1's and RLinf's reward; ``metric: f1`` (SQuAD token F1) gives partial credit, which
    RLinf's Search-R1 reward (EM and substring EM) does not have.

    RLinf reads ``reward_scale`` into this class but never applies it (see
    docs/algorithms.md#rlinf-compatibility); to keep RLinf's numbers there is no scale here: use ``score`` /
    ``format_score`` instead.

    Args:
        score: reward of a correct answer (1.0).
        format_score: reward of a wrong but tagged answer (0.0).
        metric: ``em`` (exact match) or ``f1`` (token F1), see :func:`searchr1_score`.

    Raises:
        ValueError: for an unknown ``metric`` (the allowed values are listed).

    Example:
        >>> SearchR1Reward().get_reward(["<answer> The Eiffel Tower </answer>"], [["eiffel tower"]])
        [1.0]
    """

    def __init__(self, *, score: float = 1.0, format_score: float = 0.0, metric: str = "em") -> None:
        if metric not in SEARCHR1_METRICS:
            raise ValueError(f"metric: unknown value {metric!r}; allowed: {', '.join(SEARCHR1_METRICS)}")
        self.score = float(score)
        self.format_score = float(format_score)
        self.metric: Literal["em", "f1"] = "f1" if metric == "f1" else "em"

    def get_reward(self, responses: Sequence[str], references: Sequence[str | Sequence[str]]) -> list[float]:
        """Score each response against its golden answers.

        Args:
            responses: ``[B]`` decoded outputs.
            references: ``[B]`` golden answers per response (a string or a list of accepted strings).

        Returns:
            ``[B]`` rewards.
        """
        if len(responses) != len(references):
            raise ValueError(
                f"responses and references must have the same length, got {len(responses)} and {len(references)}"
            )
        return [
            searchr1_score(r, g, score=self.score, format_score=self.format_score, metric=self.metric)
            for r, g in zip(responses, references, strict=True)
        ]
