"""rlinf_envs: the vectorised env protocol, ``EnvWorker`` and simulator backends behind extras.

Backends: ``rlinf_envs.gymnasium`` (``rlinf-envs[gymnasium]``; MuJoCo ids with ``rlinf-envs[mujoco]``) and
``rlinf_envs.maniskill`` (``rlinf-envs[maniskill]``), chosen by ``make_vec_env`` from ``env_type``.
"""

from importlib.metadata import version as _version
from typing import Any

from rlinf_core.protocols import ChunkStepResult, EnvSpec, EpisodeStats, VecEnv

from ._config import ENV_TYPES, EnvConfig, VecEnvConfig
from ._factory import env_config_problems, make_vec_env

__version__ = _version("rlinf-envs")


def __getattr__(name: str) -> Any:
    # EnvWorker pulls in Ray and torch: load it on first use so that `import rlinf_envs` stays light.
    if name == "EnvWorker":
        from ._worker import EnvWorker

        return EnvWorker
    raise AttributeError(f"module 'rlinf_envs' has no attribute {name!r}")


__all__ = [
    "ENV_TYPES",
    "ChunkStepResult",
    "EnvConfig",
    "EnvSpec",
    "EnvWorker",
    "EpisodeStats",
    "VecEnv",
    "VecEnvConfig",
    "__version__",
    "env_config_problems",
    "make_vec_env",
]
