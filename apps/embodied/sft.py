"""Supervised fine-tuning on LeRobot datasets: ``uv run apps/embodied/sft.py [--config-name NAME] key=value ...``.

Trains the config's ``actor.model`` on ``data.train_data_paths`` and writes checkpoints in the layout of the RL
runners (``<log_path>/checkpoints/global_step_<N>/actor/model.pt``), so that ``train.py
actor.model.model_path=<checkpoint>`` starts RL from it; see ``rlinf_runners.apps.sft`` and docs/sft.md.
"""

import sys
from pathlib import Path

from rlinf_runners.apps import sft

if __name__ == "__main__":
    sys.exit(sft(sys.argv[1:], app_dir=Path(__file__).resolve().parent))
