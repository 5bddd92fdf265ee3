"""``python -m rlinf_envs.realworld.dummy_robot``: run a dummy Franka robot server (see ``_server``)."""

from __future__ import annotations

import sys

from ._server import main

if __name__ == "__main__":
    sys.exit(main())
