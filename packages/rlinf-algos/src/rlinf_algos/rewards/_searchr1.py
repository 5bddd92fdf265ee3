"""Search-R1 exact-match reward (pure string logic, RLinf ``SearchR1Reward``)."""

from __future__ import annotations

import re
import string
from collections.abc import Sequence

__all__ = ["SearchR1Reward", "normalize_answer", "searchr1_score"]

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lower-case, drop punctuation and articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES_RE.sub(" ", text).split())


def searchr1_score(
    response: str,
    golden_answers: str | Sequence[str],
    *,
    score: float = 1.0,
    format_score: float = 0.0,
    max_answer_tags: int = 10,
) -> float:
    """Exact-match score of the LAST ``<answer>...</answer>`` in ``response``.

    Args:
        response: the model output.
        golden_answers: one accepted answer or several (any may match after `normalize_answer`).
        score: reward of a correct answer.
        format_score: reward of a well-formed but wrong answer.
        max_answer_tags: more than this many ``<answer>`` or ``</answer>`` tags divides ``score`` by 4
            (guards against spamming answers, RLinf).

    Returns:
        0.0 without an answer tag; ``score`` (or ``score / 4``) on a match; ``format_score`` otherwise.
    """
    matches = list(_ANSWER_RE.finditer(response))
    if not matches:
        return 0.0
    prediction = normalize_answer(matches[-1].group(1).strip())
    golds = [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)
    if any(normalize_answer(g) == prediction for g in golds):
        too_many = (
            response.count("<answer>") > max_answer_tags or response.count("</answer>") > max_answer_tags
        )
        return score / 4 if too_many else score
    return format_score


class SearchR1Reward:
    """Rule-based reward of Search-R1 question answering (registered as ``"searchr1"``).

    RLinf reads ``reward_scale`` into this class but never applies it (see
    docs/algorithms.md#rlinf-compatibility); to keep RLinf's numbers there is no scale here: use ``score`` /
    ``format_score`` instead.

    Args:
        score: reward of a correct answer (1.0).
        format_score: reward of a wrong but tagged answer (0.0).

    Example:
        >>> SearchR1Reward().get_reward(["<answer> The Eiffel Tower </answer>"], [["eiffel tower"]])
        [1.0]
    """

    def __init__(self, *, score: float = 1.0, format_score: float = 0.0) -> None:
        self.score = float(score)
        self.format_score = float(format_score)

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
            searchr1_score(r, g, score=self.score, format_score=self.format_score)
            for r, g in zip(responses, references, strict=True)
        ]
