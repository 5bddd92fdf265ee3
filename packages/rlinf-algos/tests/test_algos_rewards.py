"""Reward registry, answer extraction and Search-R1 scoring (no math-verify needed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
from rlinf_algos.rewards import (
    SearchR1Reward,
    extract_final_answer,
    extract_reference_answer,
    get_reward_class,
    get_rule_based_reward_class,
    normalize_answer,
    register_reward,
    reward_registry,
    searchr1_score,
)

# ------------------------------------------------------------------------------------------------------
# answer extraction
# ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        (r"The area is $\boxed{12}$.", "12"),
        (r"first \boxed{1}, then corrected: \boxed{\frac{1}{\sqrt{2}}}", r"\frac{1}{\sqrt{2}}"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),
        (r"so \boxed 5$ done", "5"),
        (r"truncated \boxed{\frac{1}{2", None),
        (r"empty \boxed{}", None),
        ("The final answer is $\\frac{3}{4}$. I hope it is correct.", r"\frac{3}{4}"),
        ("Therefore the answer is 42.", "42"),
        ("My final answer is: 7/", "7"),
        ("所以答案是 8\n\n解释", "8"),
        ("I don't know.", None),
        ("", None),
        ("\\boxed{x\n  + 1}", "x+ 1"),
    ],
)
def test_extract_final_answer(response, expected):
    assert extract_final_answer(response) == expected


def test_extract_reference_falls_back_to_whole_text():
    assert extract_reference_answer(r"\frac{1}{2}") == r"\frac{1}{2}"
    assert extract_reference_answer(r"Worked solution ... so \boxed{-\frac{2}{3}}") == r"-\frac{2}{3}"
    assert extract_reference_answer("  ") is None


# ------------------------------------------------------------------------------------------------------
# Search-R1
# ------------------------------------------------------------------------------------------------------


def test_normalize_answer():
    assert normalize_answer("  The Eiffel-Tower!  ") == "eiffeltower"
    assert normalize_answer("An apple, a day") == "apple day"


@pytest.mark.parametrize(
    ("response", "golden", "expected"),
    [
        ("<answer> Paris </answer>", ["paris"], 1.0),
        ("<answer>London</answer> ... <answer>The Paris.</answer>", ["Paris", "France"], 1.0),
        ("<answer>Paris</answer> <answer>Lyon</answer>", ["paris"], 0.0),
        ("Paris", ["paris"], 0.0),
        ("<answer>Berlin</answer>", "berlin", 1.0),
        ("<answer>x</answer>" * 11 + "<answer>Rome</answer>", ["rome"], 0.25),
        ("<answer>\nmulti\nline\n</answer>", ["multi line"], 1.0),
    ],
)
def test_searchr1_score_table(response, golden, expected):
    assert searchr1_score(response, golden) == expected


def test_searchr1_reward_class():
    reward = SearchR1Reward(format_score=0.1)
    got = reward.get_reward(["<answer>a</answer>", "<answer>b</answer>", "none"], [["A"], ["c"], ["x"]])
    assert got == [1.0, 0.1, 0.0]
    with pytest.raises(ValueError, match="same length, got 1 and 2"):
        reward.get_reward(["x"], [["a"], ["b"]])


# ------------------------------------------------------------------------------------------------------
# registry
# ------------------------------------------------------------------------------------------------------


def test_registry_builtins_and_aliases():
    assert set(reward_registry) >= {"math", "searchr1", "code"}
    assert get_reward_class("searchr1") is SearchR1Reward
    assert get_reward_class("SearchR1") is SearchR1Reward
    assert get_rule_based_reward_class is get_reward_class
    assert "MATH" in reward_registry


def test_registry_register_and_refuse_duplicates():
    class Mine:
        def get_reward(self, responses, references):
            return [0.0] * len(responses)

    try:
        assert register_reward("my_reward_test", Mine) is Mine
        assert get_reward_class("My_Reward_Test") is Mine
        register_reward("my_reward_test", Mine)  # same class again: idempotent
        with pytest.raises(ValueError, match="already registered"):
            register_reward("my_reward_test", SearchR1Reward)
        with pytest.raises(ValueError, match="already registered"):
            register_reward("math", Mine)

        @register_reward("my_decorated_reward_test")
        class Decorated(Mine):
            pass

        assert get_reward_class("my_decorated_reward_test") is Decorated
    finally:
        for name in ("my_reward_test", "my_decorated_reward_test"):
            if name in reward_registry:
                reward_registry.unregister(name)


def test_registry_miss_lists_valid_names():
    with pytest.raises(ValueError, match=r"unknown reward 'nope'; valid names: .*math.*searchr1"):
        get_reward_class("nope")


def _run_without_math_verify(code: str) -> subprocess.CompletedProcess[str]:
    prelude = "import sys\nsys.modules['math_verify'] = None  # behave as if the extra were not installed\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_rewards_import_without_math_extra():
    proc = _run_without_math_verify(
        """
        import rlinf_algos.rewards as r
        assert r.get_reward_class("searchr1") is r.SearchR1Reward
        try:
            r.get_reward_class("math")
        except ImportError as e:
            print("LOOKUP:", e)
        try:
            import rlinf_algos.rewards.math
        except ImportError as e:
            print("IMPORT:", e)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        'LOOKUP: rlinf_algos.rewards.math needs math-verify: pip install "rlinf-algos[math]"' in proc.stdout
    )
    assert (
        'IMPORT: rlinf_algos.rewards.math needs math-verify: pip install "rlinf-algos[math]"' in proc.stdout
    )
