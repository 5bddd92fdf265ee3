"""Gymnasium backend (classic control, MuJoCo, any registered id): ``pip install "rlinf-envs[gymnasium]"``."""

from ._vec import GymnasiumVecEnv

__all__ = ["GymnasiumVecEnv"]
