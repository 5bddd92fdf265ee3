"""Meta-World v3 backend (MT1/ML1 single tasks, MT10, MT25, MT50; state or camera observations).

Install with ``pip install "rlinf-envs[metaworld]"``. Camera observations render offscreen through OpenGL:
``MUJOCO_GL=egl`` (the default when unset; Mesa's software EGL works without a GPU) or ``osmesa``.
"""

from ._render import GL_BACKENDS, CameraRenderer, gl_backend
from ._vec import (
    CAMERAS,
    DEFAULT_CAMERA,
    DEFAULT_IMAGE_SIZE,
    MULTI_TASK_BENCHMARKS,
    NUM_VARIATIONS,
    OBS_MODES,
    REWARD_MODES,
    SINGLE_TASK_BENCHMARKS,
    VECTOR_MODES,
    MetaWorldVecEnv,
    benchmark_tasks,
    env_ids,
    metaworld_spec,
    task_and_variation,
)

__all__ = [
    "CAMERAS",
    "DEFAULT_CAMERA",
    "DEFAULT_IMAGE_SIZE",
    "GL_BACKENDS",
    "MULTI_TASK_BENCHMARKS",
    "NUM_VARIATIONS",
    "OBS_MODES",
    "REWARD_MODES",
    "SINGLE_TASK_BENCHMARKS",
    "VECTOR_MODES",
    "CameraRenderer",
    "MetaWorldVecEnv",
    "benchmark_tasks",
    "env_ids",
    "gl_backend",
    "metaworld_spec",
    "task_and_variation",
]
