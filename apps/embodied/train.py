"""Embodied RL entry point: `uv run apps/embodied/train.py [--config-name NAME] key=value ...`.

The embodied stack (rlinf-core runners, rlinf-envs, rlinf-models, rlinf-rollout) is not built yet; until it
lands this script says so plainly and exits non-zero rather than pretending to train.
"""

import sys

MISSING = """\
RLinf embodied training is not available in this version yet.

What exists today:
  - rlinf-algos:     advantages, policy/critic/off-policy losses, KL, aggregators (numpy + torch)
  - rlinf-scheduler: Cluster, Worker, WorkerGroup, Channel, placement on Ray

What this command will run once the embodied issue lands: PPO on CartPole-v1 through actor, rollout and
env worker groups, ending with a solved policy, a checkpoint, metrics and a learning-curve picture.
"""


def main() -> int:
    print(MISSING, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
