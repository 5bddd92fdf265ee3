"""VQA reward (RLinf ``VQAReward``, registry name ``vqa``): answer accuracy plus optional format terms.

A response answers inside ``<answer>...</answer>``, optionally after reasoning in ``<think>...</think>``. The
reward is a weighted sum of three scores in ``[0, 1]`` (RLinf's ``reward_weights`` keys):

- ``qa_accuracy``: the FIRST ``<answer>`` against the reference. A multiple-choice reference ``"B. blue"``
  (a letter A-E, a dot, the choice's text) needs ``<answer>B. blue</answer>``: the same letter (any case) and
  the same choice text after lower-casing and trimming, or one text contained in the other (RLinf's lenient
  content match). A reference without a letter (an open short answer, an extension over RLinf, whose VQA
  data is multiple choice only) needs the answer's text to equal it after :func:`normalize_vqa_answer`.
- ``think_format``: the response starts with one ``<think>...</think>`` block (no second ``<think>``).
- ``answer_format``: it holds a multiple-choice answer ``<answer>X. text</answer>``.

RLinf reads the ground truth from a ``{"correct_answer", "choices"}`` dict; here references are strings (the
reasoning data's ``answer`` column), so a choice is written as its letter and text, ``"B. blue"``, which is
what RLinf compares in the end. Any of a sample's references may match.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from ._searchr1 import normalize_answer

__all__ = ["VQA_REWARD_TERMS", "VQAReward", "normalize_vqa_answer", "vqa_accuracy", "vqa_format_scores"]

VQA_REWARD_TERMS = ("qa_accuracy", "think_format", "answer_format")
"""The weighted terms of :class:`VQAReward` (RLinf's ``reward_weights`` keys)."""

_CHOICE_ANSWER = re.compile(r"<answer>\s*([A-E])\.\s*(.*?)\s*</answer>", re.DOTALL | re.IGNORECASE)
_ANY_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CHOICE_REFERENCE = re.compile(r"^\s*([A-Ea-e])\.\s*(.*?)\s*$", re.DOTALL)
_THINK_FIRST = re.compile(r"^<think>(?!.*<think>)(.*?)</think>.*$", re.DOTALL)


def normalize_vqa_answer(text: str) -> str:
    """Open answers compared as SQuAD does: lower-case, no punctuation or articles, single spaces."""
    return normalize_answer(text)


def _same_choice_text(predicted: str, reference: str) -> bool:
    pred, ref = predicted.strip().lower(), reference.strip().lower()
    return pred == ref or pred in ref or ref in pred


def vqa_accuracy(response: str, reference: str) -> bool:
    """Whether the first ``<answer>`` of ``response`` matches ``reference`` (see the module docstring).

    Example:
        >>> vqa_accuracy("<think>two red ones</think><answer>B. 2</answer>", "B. 2")
        True
        >>> vqa_accuracy("<answer>C. 2</answer>", "B. 2")
        False
        >>> vqa_accuracy("<answer> the Red circle </answer>", "red circle")
        True
    """
    choice = _CHOICE_REFERENCE.match(reference)
    if choice is not None:
        found = _CHOICE_ANSWER.search(response)
        if found is None:
            return False
        return found.group(1).upper() == choice.group(1).upper() and _same_choice_text(
            found.group(2), choice.group(2)
        )
    found_any = _ANY_ANSWER.search(response)
    if found_any is None:
        return False
    answer = normalize_vqa_answer(found_any.group(1))
    return bool(answer) and answer == normalize_vqa_answer(reference)


def vqa_format_scores(response: str) -> dict[str, float]:
    """``think_format`` and ``answer_format`` of one response (1.0 or 0.0 each)."""
    text = response.strip()
    return {
        "think_format": 1.0 if _THINK_FIRST.match(text) else 0.0,
        "answer_format": 1.0 if _CHOICE_ANSWER.search(text) else 0.0,
    }


class VQAReward:
    """Rule-based VQA reward (registered as ``"vqa"``): ``sum_k weight_k * score_k`` over :data:`VQA_REWARD_TERMS`.

    Args:
        reward_weights: a non-negative weight for each of ``qa_accuracy``, ``think_format`` and
            ``answer_format`` (RLinf's ``reward.reward_weights``; all three keys). Default: accuracy only.

    Raises:
        ValueError: for missing or unknown keys, or a negative weight.

    Example:
        >>> reward = VQAReward(reward_weights={"qa_accuracy": 1.0, "think_format": 0.5, "answer_format": 0.0})
        >>> reward.get_reward(["<think>count</think><answer>A. 3</answer>", "<answer>B. 4</answer>"], [["A. 3"], ["A. 3"]])
        [1.5, 0.0]
    """

    def __init__(self, *, reward_weights: Mapping[str, float] | None = None) -> None:
        weights = dict(reward_weights) if reward_weights is not None else {"qa_accuracy": 1.0}
        if reward_weights is not None and set(weights) != set(VQA_REWARD_TERMS):
            raise ValueError(
                f"reward_weights must have exactly the keys {', '.join(VQA_REWARD_TERMS)}; got {sorted(weights)}"
            )
        negative = {k: w for k, w in weights.items() if float(w) < 0}
        if negative:
            raise ValueError(f"reward_weights must be non-negative, got {negative}")
        self.weights = {k: float(weights.get(k, 0.0)) for k in VQA_REWARD_TERMS}

    def score(self, response: str, references: str | Sequence[str]) -> dict[str, float]:
        """The three terms of one response (accuracy: 1.0 when any reference matches) and their weighted ``reward``."""
        refs = [references] if isinstance(references, str) else list(references)
        terms = {"qa_accuracy": 1.0 if any(vqa_accuracy(response, r) for r in refs) else 0.0}
        terms.update(vqa_format_scores(response))
        terms["reward"] = sum(self.weights[k] * terms[k] for k in VQA_REWARD_TERMS)
        return terms

    def get_reward(self, responses: Sequence[str], references: Sequence[str | Sequence[str]]) -> list[float]:
        """Score each response against its accepted answers.

        Args:
            responses: ``[B]`` decoded outputs.
            references: ``[B]`` accepted answers per response (a string or a list of strings).

        Returns:
            ``[B]`` rewards.
        """
        if len(responses) != len(references):
            raise ValueError(
                f"responses and references must have the same length, got {len(responses)} and {len(references)}"
            )
        return [self.score(r, g)["reward"] for r, g in zip(responses, references, strict=True)]
