"""Shared test setup for rlinf-scheduler.

Ray reads ``RAY_ENABLE_UV_RUN_RUNTIME_ENV`` when it is imported; under ``uv run`` the default would make every
Ray worker re-enter ``uv run`` with the repository as its working dir. Tests start isolated local instances, so
switch that off before any test module imports Ray.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
