"""Evaluate a checkpoint: ``uv run apps/reasoning/eval.py [--config-name NAME] runner.resume_dir=PATH|auto``.

Launches the same worker groups as training, loads the checkpoint (``runner.resume_dir``: a
``global_step_<N>`` directory, or ``auto`` for the latest one under ``runner.logger.log_path``), syncs it to the
rollout and answers the held-out prompts (``data.eval_path``) greedily; prints the ``eval/*`` metrics (accuracy)
as JSON. ``runner.resume_dir=none`` evaluates the model of ``actor.model.model_path`` as it is.
"""

import sys
from pathlib import Path

from rlinf_runners.cli import main

if __name__ == "__main__":
    sys.exit(main("reasoning", sys.argv[1:], mode="eval", app_dir=Path(__file__).resolve().parent))
