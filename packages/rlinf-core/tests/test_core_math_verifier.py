"""The math verifier's process pool: the same verdicts as in-process, per-sample timeouts, worker recovery."""

from __future__ import annotations

import math
import os
import signal
import threading
import time

import pytest

pytest.importorskip("math_verify")

from rlinf_algos.rewards import get_reward_class
from rlinf_algos.rewards.math import MathReward, verify_math_answer
from rlinf_core.rewards import MathVerifier, math_verify_call

PATHOLOGICAL = r"The answer is \boxed{9^{9^{9^{9}}}}"  # sympy evaluates the power tower in C: never returns

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


@pytest.fixture(scope="module")
def verifier():
    with MathVerifier(num_workers=2, startup_timeout_s=120.0) as v:
        yield v


def test_pool_matches_in_process_table(verifier):
    responses = [r for r, _, _ in TABLE]
    references = [refs for _, refs, _ in TABLE]
    assert verifier.verify(responses, references, timeout_s=20.0) == [c for _, _, c in TABLE]
    assert [verify_math_answer(r, refs) for r, refs, _ in TABLE] == [c for _, _, c in TABLE]


def test_math_reward_values_and_registry(verifier):
    reward = MathReward(scale=5.0, verifier=verifier)
    got = reward.get_reward([r"\boxed{0.5}", r"\boxed{2}", "no answer"], [[r"\frac12"], ["3"], ["1"]])
    assert got == [5.0, -5.0, -5.0]
    custom = MathReward(scale=2.0, min_val=0.0, max_val=1.5, verifier=verifier)
    assert custom.get_reward([r"\boxed{3}", r"\boxed{4}"], ["3", "3"]) == [3.0, 0.0]
    assert get_reward_class("math") is MathReward
    assert get_reward_class("Math") is MathReward
    with pytest.raises(ValueError, match="timeout_s"):
        MathReward(timeout_s=0, verifier=verifier)


def test_length_mismatch_and_empty(verifier):
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        verifier.verify(["a", "b"], [["a"]])
    assert verifier.verify([], []) == []


def test_numeric_references_are_accepted(verifier):
    assert verifier.verify(
        [r"\boxed{42}", r"\boxed{2.5}", r"\boxed{3}"], [42, [2.5, "x"], (4,)], timeout_s=30.0
    ) == [
        True,
        True,
        False,
    ]


def test_pathological_sample_times_out_to_false_quickly(verifier):
    verifier.verify([r"\boxed{1}"], [["1"]], timeout_s=30.0)  # warm: both workers ready
    pids_before = set(verifier.worker_pids)
    start = time.monotonic()
    got = verifier.verify([PATHOLOGICAL, r"\boxed{2}", r"\boxed{3}"], [["1"], ["2"], ["4"]], timeout_s=1.0)
    elapsed = time.monotonic() - start
    assert got == [False, True, False]
    assert elapsed < 8.0, f"the timed-out sample held the caller for {elapsed:.1f} s"
    # the stuck worker was killed and replaced; the pool keeps working
    assert len(pids_before - set(verifier.worker_pids)) == 1
    assert verifier.verify([r"\boxed{2}"], [["2"]], timeout_s=30.0) == [True]


def test_timeouts_do_not_accumulate_beyond_budget(verifier):
    # 4 pathological samples on 2 workers: two rounds of ~timeout each, plus worker restarts.
    start = time.monotonic()
    got = verifier.verify([PATHOLOGICAL] * 4, [["1"]] * 4, timeout_s=0.5)
    assert got == [False] * 4
    assert time.monotonic() - start < 20.0


def test_worker_killed_from_outside_is_replaced(verifier):
    verifier.verify([r"\boxed{1}"], [["1"]], timeout_s=30.0)
    os.kill(verifier.worker_pids[0], signal.SIGKILL)
    time.sleep(0.2)
    assert verifier.verify([r"\boxed{1}", r"\boxed{2}"], [["1"], ["2"]], timeout_s=30.0) == [True, True]


def test_math_verify_call_from_a_thread_with_timeout():
    # math-verify's own signal timeout fails outside the main thread; our pool does not care.
    out: list[list[bool]] = []
    thread = threading.Thread(
        target=lambda: out.append(
            math_verify_call([PATHOLOGICAL, r"\boxed{\frac{2}{4}}"], [["1"], ["0.5"]], timeout=1.0)
        )
    )
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive()
    assert out == [[False, True]]


def test_close_stops_workers():
    v = MathVerifier(num_workers=1)
    assert v.verify([r"\boxed{1}"], ["1"], timeout_s=30.0) == [True]
    (pid,) = v.worker_pids
    v.close()
    assert v.worker_pids == []
    with pytest.raises(ProcessLookupError):  # killed and reaped by close()
        os.kill(pid, 0)


def test_worker_crash_mid_sample_is_retried_on_a_fresh_worker():
    # A sample whose worker dies (not a timeout) is retried once: the answer must still come back correct.
    expanded = "+".join(f"{math.comb(80, k)}x^{{{k}}}" for k in range(80, 0, -1)) + "+1"
    with MathVerifier(num_workers=1) as v:
        assert v.verify([r"\boxed{1}"], ["1"], timeout_s=30.0) == [True]
        (pid,) = v.worker_pids
        killer = threading.Timer(0.5, os.kill, args=(pid, signal.SIGKILL))
        killer.start()
        try:
            got = v.verify([r"\boxed{(x+1)^{80}}"], [[expanded]], timeout_s=60.0)
        finally:
            killer.cancel()
        assert got == [True]
        assert v.worker_pids != [pid]


def test_pool_created_in_a_short_lived_thread_keeps_working():
    v = MathVerifier(num_workers=1)
    try:
        thread = threading.Thread(target=v.verify, args=([r"\boxed{1}"], ["1"]))
        thread.start()
        thread.join(timeout=120)
        time.sleep(0.2)  # on Linux the workers may die with their creating thread (PR_SET_PDEATHSIG)
        assert v.verify([r"\boxed{2}", r"\boxed{3}"], ["2", "4"], timeout_s=30.0) == [True, False]
    finally:
        v.close()
