"""What a math reward needs from its verifier: the reference type and the `AnswerVerifier` protocol."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["AnswerVerifier", "SampleReferences"]

SampleReferences = str | float | Sequence[str | float]
"""The accepted answers of one sample: a single answer (string or number) or a sequence of them."""


class AnswerVerifier(Protocol):
    """Decides, per response, whether its final answer matches ANY of its references, within a time budget.

    rlinf-core's ``MathVerifier`` (math-verify in a pool of worker processes, each sample SIGKILLed past
    ``timeout_s``) is the implementation the reward worker uses.
    """

    def verify(
        self, responses: Sequence[str], references: Sequence[SampleReferences], *, timeout_s: float
    ) -> list[bool]:
        """``[B]`` responses and their ``[B]`` references -> ``[B]`` booleans; a sample over budget is False."""
        ...
