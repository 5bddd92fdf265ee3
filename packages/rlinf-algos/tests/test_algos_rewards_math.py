"""Math reward on math-verify: a table of real answers, ANY-reference semantics, the reward arithmetic.

The process pool that bounds each verification in time (rlinf-core's ``MathVerifier``) is tested in
rlinf-core.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

pytest.importorskip("math_verify")

from rlinf_algos.rewards import AnswerVerifier, SampleReferences, get_reward_class
from rlinf_algos.rewards.math import MathReward, verify_math_answer

# (response, references, correct)
TABLE = [
    (r"So the probability is $\boxed{\frac{1}{2}}$.", [r"\frac12"], True),
    (r"\boxed{0.5}", [r"\frac{1}{2}"], True),
    (r"\boxed{\dfrac{3}{4}}", ["0.75"], True),
    (r"\boxed{1/3}", [r"\frac{1}{3}"], True),
    (r"\boxed{-\frac{2}{3}}", [r"Worked solution ... hence \boxed{-\frac{2}{3}}"], True),
    (r"\boxed{2\sqrt{2}}", [r"\sqrt{8}"], True),
    (r"\boxed{(x+1)^2}", ["x^2+2x+1"], True),
    (r"\boxed{\{3, 1, 2\}}", [r"\{1,2,3\}"], True),
    (r"\boxed{[1, 2)}", ["[1,2)"], True),
    (r"\boxed{(1, 2]}", ["[1,2)"], False),
    (r"\boxed{x = 3}", ["3"], True),
    (r"\boxed{10\%}", ["0.1"], True),
    (r"\boxed{1,000}", ["1000"], True),
    (r"\boxed{90^\circ}", ["90"], True),
    (r"\boxed{\begin{pmatrix}1\\2\end{pmatrix}}", [r"\begin{pmatrix}1\\2\end{pmatrix}"], True),
    ("The final answer is $\\frac{3}{4}$. I hope it is correct.", ["0.75"], True),
    (r"first guess \boxed{4}, corrected: \boxed{5}", ["5"], True),
    (r"first guess \boxed{5}, corrected: \boxed{4}", ["5"], False),
    (r"\boxed{4}", ["5"], False),
    (r"\boxed{\frac{1}{3}}", ["0.33"], False),
    (r"\boxed{\pi}", ["3.14159"], False),
    ("The result is 5 but I did not box it", ["5"], False),
    (r"truncated \boxed{\frac{1}{2", [r"\frac{1}{2}"], False),
    (r"\boxed{7}", ["6", "7"], True),  # ANY reference
    (r"\boxed{7}", [], False),
    (r"\boxed{7}", [""], False),
]


class InProcessVerifier:
    """An `AnswerVerifier` without a time limit (fine for these trusted inputs); records the budgets it got."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def verify(
        self, responses: Sequence[str], references: Sequence[SampleReferences], *, timeout_s: float
    ) -> list[bool]:
        self.timeouts.append(timeout_s)
        refs = [[r] if isinstance(r, str | int | float) else list(r) for r in references]
        return [
            verify_math_answer(resp, [str(x) for x in ref]) for resp, ref in zip(responses, refs, strict=True)
        ]


@pytest.mark.parametrize(("response", "references", "correct"), TABLE)
def test_verify_math_answer_in_process(response, references, correct):
    assert verify_math_answer(response, references) is correct


def test_math_reward_scores_the_verifier_verdicts_and_passes_its_timeout():
    verifier = InProcessVerifier()
    checked: AnswerVerifier = verifier
    reward = MathReward(scale=5.0, verifier=checked)
    got = reward.get_reward([r"\boxed{0.5}", r"\boxed{2}", "no answer"], [[r"\frac12"], ["3"], ["1"]])
    assert got == [5.0, -5.0, -5.0]
    custom = MathReward(scale=2.0, min_val=0.0, max_val=1.5, timeout_s=3.0, verifier=verifier)
    assert custom.get_reward([r"\boxed{3}", r"\boxed{4}"], ["3", "3"]) == [3.0, 0.0]
    assert verifier.timeouts == [10.0, 3.0]
    assert get_reward_class("math") is MathReward
    assert get_reward_class("Math") is MathReward
    with pytest.raises(ValueError, match="timeout_s"):
        MathReward(timeout_s=0, verifier=verifier)
    with pytest.raises(TypeError, match="verifier"):
        MathReward(scale=5.0)  # type: ignore[call-arg]  # the missing verifier is the point of the check
