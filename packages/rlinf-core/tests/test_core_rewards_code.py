"""The ``code`` reward built from config by the real `RewardWorker` (compute called in-process)."""

from __future__ import annotations

import sys

import pytest
from rlinf_algos.rewards import CodeReward
from rlinf_core.rewards import RewardConfig, RewardWorker

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")


def test_reward_worker_runs_the_code_reward() -> None:
    cfg = RewardConfig(
        reward_type="code", correct_threshold=1.0, kwargs={"num_workers": 2, "test_timeout_s": 1.0}
    )
    worker = RewardWorker(cfg)
    assert isinstance(worker.reward, CodeReward)
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    wrong = "```python\ndef add(a, b):\n    return a - b\n```"
    bomb = "```python\nimport os\nwhile True:\n    os.fork()\n```"
    tests = ["assert add(1, 2) == 3", "assert add(0, 0) == 0"]
    out = worker.compute([good, wrong, bomb, "no code"], [tests] * 4)
    assert out == {"rewards": [1.0, 0.0, 0.0, 0.0], "correct": [True, False, False, False]}


def test_partial_credit_from_config() -> None:
    cfg = RewardConfig(reward_type="code", kwargs={"partial_credit": True})
    worker = RewardWorker(cfg)
    half = "```python\ndef add(a, b):\n    return 3\n```"
    out = worker.compute([half], [["assert add(1, 2) == 3", "assert add(0, 0) == 0"]])
    assert out["rewards"] == [0.5]
