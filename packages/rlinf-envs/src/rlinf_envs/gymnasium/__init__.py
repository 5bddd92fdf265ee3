"""Gymnasium backend (classic control, MuJoCo, any registered id): ``pip install "rlinf-envs[gymnasium]"``."""

from ._vec import GymnasiumVecEnv, gymnasium_spec

__all__ = ["GymnasiumVecEnv", "gymnasium_spec"]
