"""Repository-wide pytest setup (test infrastructure only; libraries never set environment variables)."""

import os

# Ray 2.60 re-wraps every worker in its own `uv run` when the driver runs under uv; the synced venv already
# has everything. The variable is read when ray is imported, so it must be set before any test imports it.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

# A `ray.init()` without an address attaches to the cluster named in /tmp/ray/ray_current_cluster, which a
# `ray.cluster_utils.Cluster` writes while it runs: under xdist, a test in one worker process would attach to
# (and die with) another worker's multi-node test cluster. Tests start private instances unless they name an
# address (explicitly or through RAY_ADDRESS in a subprocess's environment).
os.environ.setdefault("RAY_ADDRESS", "local")

# MuJoCo fixes its GL backend from MUJOCO_GL when it is first imported, by whichever test module (or the module
# it imports) comes first in an xdist worker; the offscreen renderers of the env tests need EGL (Mesa's software
# EGL on a CPU machine, which .ci/run provides). Set before collection, so the order of the files does not matter.
os.environ.setdefault("MUJOCO_GL", "egl")

# Property tests draw the same examples on every run (CI must not flake on a newly found corner); run with
# `--hypothesis-profile=explore` to search afresh.
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile("ci")
