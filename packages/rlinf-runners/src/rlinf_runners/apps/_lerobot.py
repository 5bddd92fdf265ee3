"""How an env's observations and actions map to LeRobot features (shared by SFT and the episode recorder).

An array observation is ``observation.state`` (``observation.image`` when it is one ``uint8 [H, W, C]``
image); a dict observation's entry ``k`` is ``observation.images.<k>`` for images and ``observation.<k>``
otherwise (so ManiSkill's ``state`` is ``observation.state``; integer entries narrower than ``int32``, such as
LIBERO's ``task_index``, are stored as ``int32``). Actions are ``action`` (``[action_dim]``
floats, or one ``int64`` for discrete actions), rewards ``next.reward`` and episode ends ``next.done``.
"""

from __future__ import annotations

from collections.abc import Sequence

from rlinf_core.data.lerobot import LeRobotFeature
from rlinf_core.protocols import EnvSpec, ObsSpec

__all__ = ["ACTION", "DONE", "REWARD", "SUCCESS", "action_feature", "observation_features"]

ACTION = "action"
REWARD = "next.reward"
DONE = "next.done"
SUCCESS = "next.success"


# LeRobot's integer features are int32 / int64: narrower integer entries (LIBERO's int16 task_index) are widened.
_WIDER_INTS = {"int8": "int32", "int16": "int32", "uint8": "int32", "uint16": "int32"}


def _is_image(entry: ObsSpec) -> bool:
    return entry.dtype == "uint8" and len(entry.shape) == 3


def _feature(entry: ObsSpec) -> LeRobotFeature:
    if _is_image(entry):
        return LeRobotFeature("image", entry.shape, ["height", "width", "channel"])
    dtype = "float32" if entry.dtype.startswith("float") else _WIDER_INTS.get(entry.dtype, entry.dtype)
    return LeRobotFeature(dtype, entry.shape or (1,))


def observation_features(
    spec: EnvSpec, keys: Sequence[str] | None = None
) -> dict[str | None, tuple[str, LeRobotFeature]]:
    """The observation's LeRobot features: observation entry (``None`` for an array observation) → (name, feature).

    Args:
        spec: the env.
        keys: dict observations: only these entries (``actor.model.obs_keys``; default all).

    Raises:
        ValueError: for a key the observation does not have.
    """
    if spec.obs_dict is None:
        entry = ObsSpec(spec.obs_shape, spec.obs_dtype)
        return {None: ("observation.image" if _is_image(entry) else "observation.state", _feature(entry))}
    wanted = list(spec.obs_dict) if keys is None else list(keys)
    unknown = [k for k in wanted if k not in spec.obs_dict]
    if unknown:
        raise ValueError(
            f"observation entries {unknown} are not in the env's observation ({list(spec.obs_dict)})"
        )
    out: dict[str | None, tuple[str, LeRobotFeature]] = {}
    for key in wanted:
        entry = spec.obs_dict[key]
        out[key] = (
            f"observation.images.{key}" if _is_image(entry) else f"observation.{key}",
            _feature(entry),
        )
    return out


def action_feature(spec: EnvSpec) -> LeRobotFeature:
    """The ``action`` feature of one env step."""
    if spec.action_type == "discrete":
        return LeRobotFeature("int64", (1,))
    return LeRobotFeature("float32", (spec.action_dim,))
