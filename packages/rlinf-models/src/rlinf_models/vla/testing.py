"""LIBERO-shaped env specs and observations for the tiny VLA checkpoints of ``rlinf_models.*.testing`` (tests, benches).

Every tiny writer (π0, SmolVLA, GR00T, OpenVLA, OpenVLA-OFT) fits LIBERO's layout: two cameras (``rgb``,
``wrist_rgb``), an 8-D state, 7-D actions and an instruction picked by ``task_index``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from rlinf_core.protocols import EnvSpec, ObsSpec

__all__ = ["libero_obs", "libero_spec"]


def libero_spec(
    image_size: int = 64, tasks: Sequence[str] = ("pick up the bowl", "open the drawer")
) -> EnvSpec:
    """The spec of a LIBERO camera env with square ``image_size`` images and the instructions ``tasks``."""
    return EnvSpec(
        obs_shape=(),
        action_type="continuous",
        action_dim=7,
        action_low=(-1.0,) * 7,
        action_high=(1.0,) * 7,
        obs_dict={
            "rgb": ObsSpec((image_size, image_size, 3), "uint8"),
            "wrist_rgb": ObsSpec((image_size, image_size, 3), "uint8"),
            "state": ObsSpec((8,)),
            "task_index": ObsSpec((1,), "int16"),
        },
        task_descriptions=tuple(tasks),
    )


def libero_obs(n: int, image_size: int = 64, seed: int = 0) -> dict[str, torch.Tensor]:
    """``n`` random observations of :func:`libero_spec`; row ``i`` asks for instruction ``i % 2``."""
    g = torch.Generator().manual_seed(seed)
    return {
        "rgb": torch.randint(0, 256, (n, image_size, image_size, 3), generator=g, dtype=torch.uint8),
        "wrist_rgb": torch.randint(0, 256, (n, image_size, image_size, 3), generator=g, dtype=torch.uint8),
        "state": torch.randn(n, 8, generator=g),
        "task_index": torch.tensor([[i % 2] for i in range(n)], dtype=torch.int16),
    }
