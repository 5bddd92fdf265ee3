"""Every package that defers a heavy public name through `rlinf_core.lazy_exports` really defers it."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("package", "name", "heavy"),
    [
        ("rlinf_envs", "EnvWorker", "rlinf_envs._worker"),
        ("rlinf_rollout", "EmbodiedRolloutWorker", "rlinf_rollout._worker"),
        ("rlinf_rollout.agent", "AgentRolloutWorker", "rlinf_rollout.agent._worker"),
        ("rlinf_rollout.llm", "LLMRolloutWorker", "rlinf_rollout.llm._worker"),
        ("rlinf_models", "EmbodiedActorWorker", "rlinf_models.embodied._actor_worker"),
        ("rlinf_models.embodied", "CHECKPOINT_SUBDIR", "rlinf_models.embodied._actor_worker"),
        ("rlinf_models.llm", "LLMActorWorker", "rlinf_models.llm._actor_worker"),
    ],
)
def test_workspace_packages_defer_their_workers(package: str, name: str, heavy: str) -> None:
    code = f"""
import importlib, sys
pkg = importlib.import_module({package!r})
assert {heavy!r} not in sys.modules and "ray" not in sys.modules, "imported eagerly"
assert {name!r} in pkg.__all__
value = getattr(pkg, {name!r})
assert {heavy!r} in sys.modules and getattr(sys.modules[{heavy!r}], {name!r}) is value
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
