"""Code-execution reward: run the response's Python code against hidden tests in a sandbox (``"code"``).

The references of a sample ARE its tests: each reference string is one Python snippet (usually an
``assert``) run after the program in the same namespace, in `run_sandboxed`. So a coding data set needs no
new field: its ``answer`` is the list of test snippets.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from ._sandbox import SandboxLimits, SandboxResult, run_sandboxed

__all__ = ["CodeReward", "CodeScore", "extract_code"]

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(response: str) -> str | None:
    """The last fenced code block of ``response`` (```` ```python ````, ```` ```py ```` or untagged).

    Returns:
        The block's text, or None when the response has no closed code block (a truncated one does not count).
    """
    blocks = [m.group(2) for m in _FENCE.finditer(response)]
    return blocks[-1] if blocks and blocks[-1].strip() else None


@dataclass(frozen=True)
class CodeScore:
    """One response's reward and why (``reason`` is ``""`` when every test passed)."""

    reward: float
    reason: str
    result: SandboxResult | None
    """Per-test results; None when there was nothing to run (no code block)."""


class CodeReward:
    r"""Reward of a Python program by its hidden tests, run in a sandbox (registered as ``"code"``).

    ``reward = scale * (fraction of tests passed)`` with ``partial_credit``, else ``scale`` only when every
    test passes and 0.0 otherwise. No code block, a syntax error, a timeout or a sandbox refusal scores 0.0.

    Args:
        partial_credit: reward the fraction of passed tests instead of all-or-nothing.
        scale: reward of a program that passes every test.
        num_workers: sandboxed processes run at once (threads waiting on them).
        test_timeout_s: seconds for loading the program and for each test (`SandboxLimits`).
        wall_timeout_s: seconds for one program with all its tests.
        memory_mb: address-space limit of a sandboxed process, in MiB.
        namespaces: use Linux namespaces when the kernel allows them.

    Example:
        >>> reward = CodeReward()
        >>> reward.get_reward(["```python\ndef f(x):\n    return x + 1\n```"], [["assert f(1) == 2"]])
        [1.0]
    """

    def __init__(
        self,
        *,
        partial_credit: bool = False,
        scale: float = 1.0,
        num_workers: int = 2,
        test_timeout_s: float = 2.0,
        wall_timeout_s: float = 15.0,
        memory_mb: int = 512,
        namespaces: bool = True,
    ) -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers!r}")
        self.partial_credit = bool(partial_credit)
        self.scale = float(scale)
        self.num_workers = int(num_workers)
        self.limits = SandboxLimits(
            test_timeout_s=float(test_timeout_s),
            wall_timeout_s=float(wall_timeout_s),
            memory_bytes=int(memory_mb) * 2**20,
            namespaces=bool(namespaces),
        )

    def _score_one(self, response: str, tests: Sequence[str]) -> CodeScore:
        code = extract_code(response)
        if code is None:
            return CodeScore(0.0, "no code block", None)
        if not tests:
            return CodeScore(0.0, "no tests", None)
        result = run_sandboxed(code, tests, self.limits)
        passed = result.pass_rate if self.partial_credit else float(result.pass_rate == 1.0)
        return CodeScore(self.scale * passed, result.reason, result)

    def score(self, responses: Sequence[str], references: Sequence[str | Sequence[str]]) -> list[CodeScore]:
        """Rewards with their reasons and per-test results, in order.

        Args:
            responses: ``[B]`` decoded outputs.
            references: ``[B]`` tests per response (a lone string is one test).

        Returns:
            ``[B]`` scores.

        Raises:
            ValueError: if the lengths differ.
        """
        if len(responses) != len(references):
            raise ValueError(f"{len(responses)} responses but {len(references)} test lists")
        tests = [[r] if isinstance(r, str) else [str(t) for t in r] for r in references]
        with ThreadPoolExecutor(max_workers=min(self.num_workers, max(1, len(responses)))) as pool:
            return list(pool.map(self._score_one, responses, tests))

    def get_reward(self, responses: Sequence[str], references: Sequence[str | Sequence[str]]) -> list[float]:
        """``[B]`` rewards (see `score` for the reasons)."""
        return [s.reward for s in self.score(responses, references)]
