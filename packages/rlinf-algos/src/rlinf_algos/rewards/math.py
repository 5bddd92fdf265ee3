r"""Math-answer verification and reward built on Hugging Face's math-verify (extra ``rlinf-algos[math]``).

`verify_math_answer` decides whether a response's final answer (the last ``\boxed{...}``, see
`extract_final_answer`) is mathematically equal to ANY of the sample's references, with
``math_verify.parse`` + ``math_verify.verify`` (numbers, fractions, LaTeX expressions, sets, intervals,
matrices, equations ``x = 3`` vs ``3``, percentages). `MathReward` turns a verifier's verdicts into rewards:
``max_val · scale`` when correct, ``min_val · scale`` otherwise.

`verify_math_answer` runs in-process with no time limit: sympy can take unbounded time (or hold the GIL in a
C big-integer loop) on adversarial answers such as ``9^{9^{9^{9}}}``. Untrusted model outputs therefore go
through an `AnswerVerifier` that bounds each sample; rlinf-core's ``MathVerifier`` runs this function in a
pool of worker processes and SIGKILLs a worker past the per-sample timeout.

This deliberately replaces RLinf 0.4's in-tree verifier (its own ``extract_answer``/``math_equal`` on
sympy + latex2sympy2): scores can differ on edge cases where the two verifiers disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

try:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
except ImportError as e:  # pragma: no cover - exercised in a subprocess test
    raise ImportError('rlinf_algos.rewards.math needs math-verify: pip install "rlinf-algos[math]"') from e

from ._extract import extract_final_answer, extract_reference_answer
from ._verifier import AnswerVerifier, SampleReferences

__all__ = ["AnswerVerifier", "MathReward", "SampleReferences", "verify_math_answer"]

_EXTRACTION = (LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig())


def _parse_answer(answer: str) -> list[Any]:
    # Wrapping in \boxed{} makes math-verify's LaTeX extractor take the whole answer as one expression.
    return list(parse("\\boxed{" + answer + "}", extraction_config=_EXTRACTION, parsing_timeout=None))


def verify_math_answer(response: str, references: str | Sequence[str]) -> bool:
    r"""Whether ``response``'s final answer equals any reference (in-process, NO timeout).

    Untrusted inputs need a per-sample time limit (an `AnswerVerifier` such as rlinf-core's ``MathVerifier``,
    which runs this function in worker processes): in-process, it can run for an unbounded time on
    adversarial expressions.

    Args:
        response: decoded model output; its answer is extracted with `extract_final_answer`.
        references: one reference or several; each may be a bare answer (``"\frac{1}{2}"``) or a solution
            ending in ``\boxed{...}``.

    Returns:
        True when some reference verifies; False when none does or the response has no final answer.
    """
    answer = extract_final_answer(response)
    if answer is None:
        return False
    prediction = _parse_answer(answer)
    if not prediction:
        return False
    for reference in [references] if isinstance(references, str) else references:
        gold_text = extract_reference_answer(reference)
        if gold_text is None:
            continue
        gold = _parse_answer(gold_text)
        if gold and verify(gold, prediction, timeout_seconds=None):
            return True
    return False


class MathReward:
    r"""Rule-based math reward (registered as ``"math"``; RLinf ``MathReward``).

    ``reward = (max_val if correct else min_val) * scale``, with correctness from ``verifier`` (the last
    ``\boxed{}`` answer vs ANY reference; over the per-sample timeout counts as incorrect).

    Args:
        scale: RLinf ``reward_scale`` (1.0; the example math config uses 5.0).
        min_val: RLinf ``reward_min_val`` (-1.0), reward of a wrong / missing / timed-out answer.
        max_val: RLinf ``reward_max_val`` (1.0), reward of a correct answer.
        timeout_s: per-sample verification budget in seconds, passed to ``verifier``.
        verifier: decides correctness, e.g. rlinf-core's ``MathVerifier`` process pool (the reward worker
            builds one per rank).

    Example:
        >>> from rlinf_core.rewards import MathVerifier  # doctest: +SKIP
        >>> MathReward(scale=5.0, verifier=MathVerifier()).get_reward([r"\boxed{\frac{1}{2}}"], [["0.5"]])  # doctest: +SKIP
        [5.0]
    """

    def __init__(
        self,
        scale: float = 1.0,
        min_val: float = -1.0,
        max_val: float = 1.0,
        timeout_s: float = 10.0,
        *,
        verifier: AnswerVerifier,
    ) -> None:
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.scale = float(scale)
        self.min_val = float(min_val)
        self.max_val = float(max_val)
        self.timeout_s = float(timeout_s)
        self._verifier = verifier

    def get_reward(self, responses: Sequence[str], references: Sequence[SampleReferences]) -> list[float]:
        """Score each response.

        Args:
            responses: ``[B]`` decoded outputs (``skip_special_tokens=True``).
            references: ``[B]`` accepted answers per response.

        Returns:
            ``[B]`` rewards, each ``max_val * scale`` or ``min_val * scale``.
        """
        correct = self._verifier.verify(responses, references, timeout_s=self.timeout_s)
        return [(self.max_val if ok else self.min_val) * self.scale for ok in correct]
