"""The code sandbox stops what untrusted programs try, each with a clear reason; the ``code`` reward on top."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from rlinf_algos.rewards import (
    CodeReward,
    SandboxLimits,
    extract_code,
    get_reward_class,
    run_sandboxed,
)

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the sandbox is Linux-only")

FAST = SandboxLimits(test_timeout_s=1.0, wall_timeout_s=5.0, cpu_s=3)
DOUBLE = "def double(x):\n    return 2 * x\n"


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}```\n"


@pytest.fixture
def listener() -> Iterator[int]:
    """A local TCP server the sandboxed program must not reach."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.1)
    try:
        yield int(server.getsockname()[1])
        with pytest.raises(TimeoutError):  # nobody ever connected
            server.accept()
    finally:
        server.close()


def test_correct_solution_scores_one() -> None:
    result = run_sandboxed(DOUBLE, ["assert double(2) == 4", "assert double(-3) == -6"], FAST)
    assert [t.status for t in result.tests] == ["passed", "passed"]
    assert result.pass_rate == 1.0 and result.reason == ""
    assert CodeReward().get_reward([fenced(DOUBLE)], [["assert double(2) == 4"]]) == [1.0]


def test_wrong_answer_and_syntax_error() -> None:
    result = run_sandboxed(DOUBLE, ["assert double(2) == 4", "assert double(2) == 5"], FAST)
    assert [(t.status, t.reason) for t in result.tests] == [("passed", ""), ("failed", "wrong answer")]
    broken = run_sandboxed("def double(x:\n", ["assert double(1) == 2"], FAST)
    assert [(t.status, t.reason) for t in broken.tests] == [("error", "syntax error")]


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        ("import os\nwhile True:\n    os.fork()\n", "fork limit"),
        ("import subprocess\nsubprocess.run(['sh', '-c', ':(){ :|:& };:'])\n", "fork limit"),
        ("def spin():\n    while True:\n        pass\nspin()\n", "timeout"),
        ("buffer = bytearray(10 * 2**30)\n", "memory"),
        ("import os\nos.remove('/etc/hostname')\n", "write outside sandbox"),
    ],
    ids=["fork-bomb", "shell-fork-bomb", "infinite-loop", "10GB-allocation", "delete-outside"],
)
def test_sandbox_stops_it_with_reward_zero(code: str, reason: str) -> None:
    start = time.monotonic()
    [score] = CodeReward(test_timeout_s=1.0, wall_timeout_s=5.0).score([fenced(code)], [["assert True"]])
    assert score.reward == 0.0
    assert score.reason == reason
    assert time.monotonic() - start < 5.0


def test_network_connection_is_blocked(listener: int) -> None:
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=1).sendall(b'hi')\n"
    [score] = CodeReward().score([fenced(code)], [["assert True"]])
    assert (score.reward, score.reason) == (0.0, "network blocked")


def test_write_outside_its_directory_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "escaped.txt"
    code = f"open({str(target)!r}, 'w').write('pwned')\n"
    [score] = CodeReward().score([fenced(code)], [["assert True"]])
    assert (score.reward, score.reason) == (0.0, "write outside sandbox")
    assert not target.exists()
    inside = run_sandboxed(
        "open('notes.txt', 'w').write('ok')\n", ["assert open('notes.txt').read() == 'ok'"]
    )
    assert inside.tests[0].passed  # its own directory is writable


def test_a_swallowed_refusal_still_counts() -> None:
    code = "import socket\ntry:\n    socket.socket()\nexcept BaseException:\n    pass\n"
    result = run_sandboxed(code, ["assert True"], FAST)
    assert (result.tests[0].status, result.tests[0].reason) == ("error", "network blocked")


def test_a_program_that_catches_or_ignores_the_timer_still_times_out() -> None:
    catches = "def f():\n    while True:\n        try:\n            while True: pass\n        except BaseException: pass\n"
    result = run_sandboxed(catches, ["f()", "assert True"], FAST)
    assert [t.reason for t in result.tests] == ["timeout", ""]
    ignores = "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass\n"
    start = time.monotonic()
    result = run_sandboxed(ignores, ["assert True"], SandboxLimits(test_timeout_s=0.5, wall_timeout_s=1.5))
    assert [t.reason for t in result.tests] == ["timeout"]  # the parent's deadline killed the process group
    assert time.monotonic() - start < 3.0


@pytest.mark.parametrize(
    ("code", "needs", "reasons"),
    [
        ("import os\nos.fork()\n", "process limit", ("fork limit",)),
        (
            "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n",
            "network namespace",
            ("network blocked",),
        ),
        ("open('/etc/rlinf-sandbox-probe', 'w')\n", "read-only mounts", ("write outside sandbox",)),
    ],
    ids=["nproc", "netns", "read-only"],
)
def test_the_os_layers_hold_without_the_audit_hook(code: str, needs: str, reasons: tuple[str, ...]) -> None:
    limits = SandboxLimits(audit_hook=False, max_processes=1, test_timeout_s=1.0, wall_timeout_s=5.0)
    probe = run_sandboxed("", ["assert True"], limits)
    if needs not in probe.mechanisms:
        pytest.skip(f"{needs} is not available here (mechanisms: {probe.mechanisms})")
    fork_all = "import os\nfor _ in range(64):\n    if os.fork() == 0:\n        import time; time.sleep(30)\n"
    result = run_sandboxed(fork_all if needs == "process limit" else code, ["assert True"], limits)
    assert result.tests[0].reason in reasons


def test_extract_code_takes_the_last_closed_block() -> None:
    text = "```python\nx = 1\n```\nthen\n```py\nx = 2\n```\n```python\nx = 3"
    assert extract_code(text) == "x = 2\n"
    assert extract_code("no code") is None
    assert extract_code("```\nprint(1)\n```") == "print(1)\n"


def test_no_code_block_and_partial_credit() -> None:
    tests = ["assert double(1) == 2", "assert double(2) == 5"]
    reward = CodeReward(partial_credit=True, scale=2.0)
    scores = reward.score(["no code here", fenced(DOUBLE)], [tests, tests])
    assert [(s.reward, s.reason) for s in scores] == [(0.0, "no code block"), (1.0, "wrong answer")]
    assert CodeReward().get_reward([fenced(DOUBLE)], [tests]) == [0.0]


def test_code_reward_through_the_registry() -> None:
    cls = get_reward_class("code")
    assert cls is CodeReward
    reward = cls(partial_credit=False, num_workers=2)
    responses = [fenced(DOUBLE), fenced("def double(x):\n    return x\n"), fenced(DOUBLE)]
    tests = [["assert double(3) == 6"]] * 3
    assert reward.get_reward(responses, tests) == [1.0, 0.0, 1.0]
    assert reward.get_reward(responses, tests) == [1.0, 0.0, 1.0]  # deterministic
    with pytest.raises(ValueError, match="2 responses but 1 test lists"):
        reward.get_reward(responses[:2], tests[:1])
