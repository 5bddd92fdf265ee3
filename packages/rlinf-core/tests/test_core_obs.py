"""Dict observations: the spec and the helpers every stage uses on arrays and dicts alike."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rlinf_core.protocols import (
    EnvSpec,
    ObsSpec,
    flatten_obs,
    obs_concat,
    obs_index,
    obs_len,
    obs_map,
    obs_stack,
    obs_zeros,
    unflatten_obs,
)

DICT_SPEC = EnvSpec(
    (), "continuous", 2, obs_dict={"rgb": ObsSpec((8, 6, 3), "uint8"), "state": ObsSpec((4,))}
)


def test_spec_layouts_and_validation() -> None:
    assert EnvSpec((4,), "discrete", 1, num_actions=2).observation == ObsSpec((4,), "float32")
    assert DICT_SPEC.observation["rgb"].is_image and not DICT_SPEC.observation["state"].is_image  # type: ignore[index]
    with pytest.raises(ValueError, match=r"dict observations have obs_shape \(\), got \(4,\)"):
        EnvSpec((4,), "continuous", 2, obs_dict={"state": ObsSpec((4,))})
    with pytest.raises(
        ValueError, match=r"ObsSpec\.dtype: 'float64' is not allowed; choose one of float32, uint8, int16"
    ):
        ObsSpec((3,), "float64")


def test_helpers_on_numpy_torch_and_dicts() -> None:
    a, b = obs_zeros(DICT_SPEC.observation, 2), obs_zeros(DICT_SPEC.observation, 3)
    assert a["rgb"].dtype == np.uint8 and a["state"].dtype == np.float32
    b["state"][:] = 1.0
    cat = obs_concat([a, b])
    assert obs_len(cat) == 5 and cat["rgb"].shape == (5, 8, 6, 3)
    np.testing.assert_array_equal(obs_index(cat, slice(2, 5))["state"], b["state"])
    t = obs_map(torch.from_numpy, cat)
    stacked = obs_stack([t, t], axis=0)
    assert isinstance(stacked["rgb"], torch.Tensor) and stacked["rgb"].shape == (2, 5, 8, 6, 3)
    assert obs_concat([np.ones((2, 3)), np.zeros((1, 3))]).shape == (3, 3)  # plain arrays too
    with pytest.raises(ValueError, match="observation keys differ"):
        obs_concat([a, {"rgb": a["rgb"]}])
    with pytest.raises(ValueError, match="different leading sizes"):
        obs_len({"x": np.zeros((2, 1)), "y": np.zeros((3, 1))})


def test_nested_batches_map_and_flatten() -> None:
    batch = {
        "obs": {"rgb": np.zeros((4, 2, 2, 3)), "state": np.arange(8.0).reshape(4, 2)},
        "rewards": np.arange(4.0),
    }
    picked = obs_map(lambda x: x[[3, 0]], batch)
    np.testing.assert_array_equal(picked["obs"]["state"], [[6.0, 7.0], [0.0, 1.0]])
    flat = flatten_obs(batch)
    assert sorted(flat) == ["obs/rgb", "obs/state", "rewards"]
    back = unflatten_obs(flat)
    assert back["obs"]["state"] is batch["obs"]["state"] and back["rewards"] is batch["rewards"]
    with pytest.raises(ValueError, match="contains '/'"):
        flatten_obs({"a/b": np.zeros(1)})
