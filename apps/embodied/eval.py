"""Evaluate a checkpoint: ``uv run apps/embodied/eval.py [--config-name NAME] runner.resume_dir=PATH|auto|none``.

Launches the same worker groups as training, loads the checkpoint (``runner.resume_dir``: a
``global_step_<N>`` directory, or ``auto`` for the latest one under ``runner.logger.log_path``; ``none``: the
policy as the config builds it, untrained or from ``actor.model.model_path``) and runs one evaluation of
``env.eval`` with deterministic actions; prints the ``eval/*`` metrics as JSON.
"""

import sys
from pathlib import Path

from rlinf_runners.cli import main

if __name__ == "__main__":
    sys.exit(main("embodied", sys.argv[1:], mode="eval", app_dir=Path(__file__).resolve().parent))
