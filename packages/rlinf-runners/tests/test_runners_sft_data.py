"""SFT samples from LeRobot datasets: dict observations with camera images, held-out episodes, and a CNN policy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from rlinf_core.data.lerobot import LeRobotWriter
from rlinf_core.protocols import EnvSpec, ObsSpec
from rlinf_models.policies import PolicyConfig, build_policy
from rlinf_runners.apps._lerobot import action_feature, observation_features
from rlinf_runners.apps._sft import load_sft_samples

SPEC = EnvSpec(
    (),
    "continuous",
    2,
    action_low=(-1.0, -1.0),
    action_high=(1.0, 1.0),
    obs_dict={
        "rgb": ObsSpec((64, 64, 3), "uint8"),
        "state": ObsSpec((3,)),
        "privileged_state": ObsSpec((5,)),
    },
)


def test_dict_observations_with_images_become_policy_batches(tmp_path: Path) -> None:
    features = observation_features(SPEC)
    assert {k: name for k, (name, _) in features.items()} == {
        "rgb": "observation.images.rgb",
        "state": "observation.state",
        "privileged_state": "observation.privileged_state",
    }
    writer = LeRobotWriter(
        tmp_path / "ds", fps=10, features={**dict(features.values()), "action": action_feature(SPEC)}
    )
    rng = np.random.default_rng(0)
    for n in (5, 4, 6, 3):
        writer.add_episode(
            {
                "observation.images.rgb": rng.integers(0, 256, (n, 64, 64, 3), dtype=np.uint8),
                "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
                "observation.privileged_state": rng.normal(size=(n, 5)).astype(np.float32),
                "action": rng.uniform(-1, 1, (n, 2)).astype(np.float32),
            },
            "push",
        )
    writer.write()
    train, val = load_sft_samples([tmp_path / "ds"], SPEC, ["rgb", "state"], 2, 0.25, 0)
    assert train is not None and val is not None
    assert len(train) + len(val) == 18 and len(val) in (3, 4, 5, 6)  # one whole episode held out
    assert set(train.obs) == {"rgb", "state"} and train.obs["rgb"].dtype == torch.uint8
    assert train.actions.shape == (len(train), 2, 2) and train.mask.shape == (len(train), 2)
    torch.manual_seed(0)
    policy = build_policy(
        SPEC, PolicyConfig(model_type="cnn", obs_keys=("rgb", "state"), num_action_chunks=2)
    )
    loss = policy.imitation_loss(train.obs, train.actions, train.mask)
    assert loss.ndim == 0 and torch.isfinite(loss)


def test_a_narrow_integer_entry_is_stored_widened_and_read_back(tmp_path: Path) -> None:
    # LIBERO's task_index is int16; LeRobot's integer features are int32 / int64.
    spec = EnvSpec(
        (),
        "continuous",
        2,
        action_low=(-1.0, -1.0),
        action_high=(1.0, 1.0),
        obs_dict={"state": ObsSpec((3,)), "task_index": ObsSpec((1,), "int16")},
    )
    features = observation_features(spec)
    assert features["task_index"] == ("observation.task_index", features["task_index"][1])
    assert features["task_index"][1].dtype == "int32"
    writer = LeRobotWriter(
        tmp_path / "ds", fps=10, features={**dict(features.values()), "action": action_feature(spec)}
    )
    for task in (0, 1):
        writer.add_episode(
            {
                "observation.state": np.zeros((4, 3), np.float32),
                "observation.task_index": np.full((4, 1), task, np.int16),
                "action": np.zeros((4, 2), np.float32),
            },
            "push",
        )
    writer.write()
    train, _ = load_sft_samples([tmp_path / "ds"], spec, None, 2, 0.0, 0)
    assert train is not None
    assert sorted(train.obs["task_index"][:, 0].tolist()) == [0] * 4 + [1] * 4
