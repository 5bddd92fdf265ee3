"""rlinf_envs: the vectorised env protocol and simulator backends behind extras.

Backends: ``rlinf_envs.gymnasium`` (``rlinf-envs[gymnasium]``; MuJoCo ids with ``rlinf-envs[mujoco]``).
"""

from importlib.metadata import version as _version

from rlinf_core.protocols import ChunkStepResult, EnvSpec, EpisodeStats, VecEnv

__version__ = _version("rlinf-envs")

__all__ = ["ChunkStepResult", "EnvSpec", "EpisodeStats", "VecEnv", "__version__"]
