"""Gymnasium backend (classic control, MuJoCo, any registered id): ``pip install "rlinf-envs[gymnasium]"``."""

from ._vec import INTERVENTION_ACTION_KEY, INTERVENTION_KEY, GymnasiumVecEnv, gymnasium_spec

__all__ = ["INTERVENTION_ACTION_KEY", "INTERVENTION_KEY", "GymnasiumVecEnv", "gymnasium_spec"]
