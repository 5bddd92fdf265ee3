"""Record episodes into a LeRobot dataset: ``uv run apps/embodied/collect.py (--checkpoint DIR | --expert) --out DIR``.

Options: ``--config-name NAME`` / ``--config PATH``, ``--episodes N``, ``--only-success``, ``--num-envs E``,
``--seed S``, ``--sample``, ``--fps F``, ``--task TEXT`` and ``key=value`` overrides; see
``rlinf_runners.apps.collect`` and docs/sft.md.
"""

import sys
from pathlib import Path

from rlinf_runners.apps import collect

if __name__ == "__main__":
    sys.exit(collect(sys.argv[1:], app_dir=Path(__file__).resolve().parent))
