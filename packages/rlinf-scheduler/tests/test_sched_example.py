"""The runnable example of docs/scheduler.md ("Compose your own workers") really runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "compose_workers.py"


@pytest.mark.ray
@pytest.mark.slow
def test_compose_workers_example_runs() -> None:
    pytest.importorskip("torch")
    env = dict(os.environ, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE)], capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "consumer totals [75.0, 75.0]" in proc.stdout
