"""The parts of LeRobot's ``config.json`` that π0 and SmolVLA write and read alike; importing it does not import torch."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["lerobot_features", "square_side"]


def lerobot_features(
    *, image_size: int, state_dim: int, action_dim: int, camera_names: tuple[str, ...]
) -> dict[str, Any]:
    """``config.json``'s ``input_features`` (square cameras, the state) and ``output_features`` (the action)."""
    features: dict[str, Any] = {
        f"observation.images.{name}": {"type": "VISUAL", "shape": [3, image_size, image_size]}
        for name in camera_names
    }
    features["observation.state"] = {"type": "STATE", "shape": [state_dim]}
    return {
        "input_features": features,
        "output_features": {"action": {"type": "ACTION", "shape": [action_dim]}},
    }


def square_side(resolution: Sequence[int], key: str) -> int:
    """The side of ``config.json``'s square image resolution ``[side, side]`` under ``key``, or a ValueError."""
    if len(resolution) != 2 or resolution[0] != resolution[1]:
        raise ValueError(f"config.json {key!r} must be square, got {resolution}")
    return resolution[0]
