"""Evaluate a checkpoint: ``uv run apps/agent/eval.py [--config-name NAME] runner.resume_dir=PATH|auto``.

Launches the same worker groups as training, loads the checkpoint (``runner.resume_dir``: a
``global_step_<N>`` directory, or ``auto`` for the latest one under ``runner.logger.log_path``) and runs the
held-out tasks greedily with the tools; prints the ``eval/*`` metrics (success rate, tool use) as JSON.
"""

import sys
from pathlib import Path

from rlinf_runners.cli import main

if __name__ == "__main__":
    sys.exit(main("agent", sys.argv[1:], mode="eval", app_dir=Path(__file__).resolve().parent))
