"""Write RLPD demonstrations from a scripted expert: ``uv run apps/embodied/make_demos.py --config-name NAME``.

Options: ``--episodes N``, ``--out PATH``, ``--num-envs E``, ``--seed S``, ``--keep-failed`` and ``key=value``
overrides; see ``rlinf_runners.apps.make_demos``.
"""

import sys
from pathlib import Path

from rlinf_runners.apps import make_demos

if __name__ == "__main__":
    sys.exit(make_demos(sys.argv[1:], app_dir=Path(__file__).resolve().parent))
