"""Reasoning RL training: ``uv run apps/reasoning/train.py [--config-name NAME | --config PATH] key=value ...``.

With no argument it runs the default CPU config (``config/grpo_smollm2_cpu.yaml``): SmolLM2-135M-Instruct,
a short SFT warm-up on worked chain-sum solutions, then GRPO with the math verifier as reward, evaluating the
greedy accuracy on held-out problems; prints where the checkpoint, ``metrics.jsonl`` and the curves are.
"""

import sys
from pathlib import Path

from rlinf_runners.cli import main

if __name__ == "__main__":
    sys.exit(main("reasoning", sys.argv[1:], mode="train", app_dir=Path(__file__).resolve().parent))
