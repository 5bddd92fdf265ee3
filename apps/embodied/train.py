"""Embodied RL training: ``uv run apps/embodied/train.py [--config-name NAME | --config PATH] key=value ...``.

With no argument it trains PPO on CartPole-v1 (``config/cartpole_ppo.yaml``) through the actor, rollout and env
worker groups, then prints where the checkpoint, ``metrics.jsonl`` and the learning-curve PNG are.
"""

import sys
from pathlib import Path

from rlinf_runners.cli import main

if __name__ == "__main__":
    sys.exit(main("embodied", sys.argv[1:], mode="train", app_dir=Path(__file__).resolve().parent))
