"""Agent RL training: ``uv run apps/agent/train.py [--config-name NAME | --config PATH] key=value ...``.

With no argument it runs the default CPU config (``config/smollm2_tools.yaml``): SmolLM2-135M-Instruct, a
short SFT warm-up on tool-use demonstrations, then multi-turn GRPO (``grpo_dynamic``) with a calculator and
a search over the local corpus; then it prints where the checkpoint, ``metrics.jsonl`` and the curves are.
Generate the tasks first (they are committed; regenerate with ``uv run apps/agent/prepare_data.py``).
"""

import sys
from pathlib import Path

from rlinf_runners.cli import main

if __name__ == "__main__":
    sys.exit(main("agent", sys.argv[1:], mode="train", app_dir=Path(__file__).resolve().parent))
