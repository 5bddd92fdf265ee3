"""rlinf_envs: the vectorised env protocol, ``EnvWorker`` and simulator backends behind extras.

Backends: ``rlinf_envs.gymnasium`` (``rlinf-envs[gymnasium]``; MuJoCo ids with ``rlinf-envs[mujoco]``),
``rlinf_envs.maniskill`` (``rlinf-envs[maniskill]``), ``rlinf_envs.libero`` (``rlinf-envs[libero]``) and
``rlinf_envs.metaworld`` (``rlinf-envs[metaworld]``), chosen by ``make_vec_env`` from ``env_type``; and
``rlinf_envs.realworld`` (no extra): robot arms reached over TCP, with a dummy Franka for tests.
"""

from importlib.metadata import version as _version
from typing import TYPE_CHECKING

from rlinf_core import lazy_exports
from rlinf_core.protocols import ChunkStepResult, EnvSpec, EpisodeStats, VecEnv

from ._config import ENV_TYPES, EnvConfig, VecEnvConfig, VideoConfig
from ._factory import describe_tasks, env_config_problems, env_spec_without_worker, make_vec_env
from ._process import prepare_process_env

if TYPE_CHECKING:
    from ._worker import EnvWorker

__version__ = _version("rlinf-envs")

# EnvWorker pulls in Ray and torch: loaded on first use so that `import rlinf_envs` stays light.
__getattr__ = lazy_exports(__name__, {"EnvWorker": "._worker"})


__all__ = [
    "ENV_TYPES",
    "ChunkStepResult",
    "EnvConfig",
    "EnvSpec",
    "EnvWorker",
    "EpisodeStats",
    "VecEnv",
    "VecEnvConfig",
    "VideoConfig",
    "__version__",
    "describe_tasks",
    "env_config_problems",
    "env_spec_without_worker",
    "make_vec_env",
    "prepare_process_env",
]
