"""Rule-based rewards and the reward registry (RLinf ``rlinf.algorithms.rewards``).

``rlinf_algos.rewards`` imports without optional dependencies. The math reward lives in
`rlinf_algos.rewards.math` and needs the ``rlinf-algos[math]`` extra (math-verify); it is also reachable as
``get_reward_class("math")``, which imports it on first use. The process pool that bounds each
verification in time lives next to the reward worker, in rlinf-core. The code reward (`CodeReward`,
``"code"``) runs the response's program against its tests in `run_sandboxed` (standard library only, Linux).
"""

from ._code import CodeReward, CodeScore, extract_code
from ._extract import extract_final_answer, extract_reference_answer
from ._reward_registry import (
    RewardRegistry,
    get_reward_class,
    get_rule_based_reward_class,
    register_reward,
    reward_registry,
)
from ._sandbox import SandboxLimits, SandboxResult, TestResult, run_sandboxed
from ._searchr1 import SEARCHR1_METRICS, SearchR1Reward, answer_f1, normalize_answer, searchr1_score
from ._verifier import AnswerVerifier, SampleReferences
from ._vqa import VQA_REWARD_TERMS, VQAReward, normalize_vqa_answer, vqa_accuracy, vqa_format_scores

__all__ = [
    "SEARCHR1_METRICS",
    "VQA_REWARD_TERMS",
    "AnswerVerifier",
    "CodeReward",
    "CodeScore",
    "RewardRegistry",
    "SampleReferences",
    "SandboxLimits",
    "SandboxResult",
    "SearchR1Reward",
    "TestResult",
    "VQAReward",
    "answer_f1",
    "extract_code",
    "extract_final_answer",
    "extract_reference_answer",
    "get_reward_class",
    "get_rule_based_reward_class",
    "normalize_answer",
    "normalize_vqa_answer",
    "register_reward",
    "reward_registry",
    "run_sandboxed",
    "searchr1_score",
    "vqa_accuracy",
    "vqa_format_scores",
]
