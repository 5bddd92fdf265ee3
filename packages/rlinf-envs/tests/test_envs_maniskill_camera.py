"""ManiSkill camera observations (rgb / rgbd, privileged state beside them) and frame stacking, on the real sim."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from rlinf_core.protocols import ObsSpec

pytest.importorskip("mani_skill", reason='needs the ManiSkill extra: pip install "rlinf-envs[maniskill]"')

from rlinf_envs import VecEnvConfig, make_vec_env
from rlinf_envs.maniskill import ManiSkillVecEnv

pytestmark = [
    pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning"),
    pytest.mark.usefixtures("vulkan"),
]


def test_rgbd_with_privileged_state_shapes_dtypes_and_groups() -> None:
    env = ManiSkillVecEnv("PushCube-v1", 2, group_size=2, obs_mode="rgbd+state", image_size=(48, 64))
    spec = env.spec
    assert spec.obs_shape == () and spec.obs_dict is not None
    assert spec.obs_dict["rgb"] == ObsSpec((48, 64, 3), "uint8")
    assert spec.obs_dict["depth"] == ObsSpec((48, 64, 1), "int16")
    assert spec.obs_dict["state"] == ObsSpec((18,))  # Panda qpos 9 + qvel 9
    assert "extra" not in spec.obs_dict  # ManiSkill folds the extras into the privileged vector
    assert spec.obs_dict["privileged_state"] == ObsSpec((35,))  # the state-mode vector
    obs = env.reset(seed=3)
    assert set(obs) == set(spec.obs_dict)
    for key, entry in spec.obs_dict.items():
        assert obs[key].shape == (2, *entry.shape) and obs[key].dtype == np.dtype(entry.dtype), key
    rgb = obs["rgb"]
    assert rgb.std() > 5  # a rendered scene, not a blank frame
    np.testing.assert_array_equal(rgb[0], rgb[1])  # one group: the same scene
    assert (obs["depth"] > 0).mean() > 0.5  # millimetres in front of the camera
    res = env.chunk_step(np.zeros((2, 2, spec.action_dim), np.float32))
    assert res.obs["rgb"].shape == (2, 48, 64, 3) and res.final_obs["privileged_state"].shape == (2, 35)
    env.close()


def test_rgb_sees_what_the_state_mode_sees() -> None:
    # The privileged vector beside the images is the state-mode observation of the same episode.
    cam = ManiSkillVecEnv("PushCube-v1", 1, obs_mode="rgb+state", image_size=(32, 32))
    state = ManiSkillVecEnv("PushCube-v1", 1)
    np.testing.assert_allclose(cam.reset(seed=9)["privileged_state"], state.reset(seed=9), atol=1e-6)
    act = np.full((1, 3, 8), 0.3, np.float32)
    np.testing.assert_allclose(
        cam.chunk_step(act).obs["privileged_state"], state.chunk_step(act).obs, atol=1e-5
    )
    cam.close()
    state.close()


def test_state_round_trip_of_a_camera_env_with_frame_stack() -> None:
    cfg = VecEnvConfig(
        env_type="maniskill",
        env_id="PushCube-v1",
        total_num_envs=2,
        obs_mode="rgb",
        image_size=(32, 32),
        frame_stack=3,
        max_episode_steps=4,
    )
    env = make_vec_env(cfg)
    assert env.spec.obs_dict is not None
    assert env.spec.obs_dict["rgb"] == ObsSpec((32, 32, 9), "uint8") and env.spec.obs_dict[
        "state"
    ] == ObsSpec((54,))
    assert env.spec.obs_dict["extra"] == ObsSpec((21,))  # TCP pose x 3 (the goal is seen, not given)
    obs = env.reset(seed=1)
    frames = [obs["rgb"][..., 3 * j : 3 * j + 3] for j in range(3)]
    np.testing.assert_array_equal(frames[0], frames[2])  # a new episode: the first frame three times
    rng = np.random.default_rng(0)
    step = env.chunk_step(rng.uniform(-1, 1, (2, 1, 8)).astype(np.float32))
    # The newest frame moved in last; the older ones are the previous observation's newest ones.
    np.testing.assert_array_equal(step.obs["rgb"][..., :6], obs["rgb"][..., 3:])
    saved = pickle.loads(pickle.dumps(env.get_state()))
    actions = [rng.uniform(-1, 1, (2, 1, 8)).astype(np.float32) for _ in range(4)]
    first = [env.chunk_step(a) for a in actions]  # crosses the 4-step time limit: auto-reset inside
    assert any(r.dones.any() for r in first)
    ended = next(r for r in first if r.dones.any())
    # After the reset the history restarts from the new episode's observation; final_obs keeps the old one.
    fresh = ended.obs["rgb"]
    np.testing.assert_array_equal(fresh[..., :3], fresh[..., 6:])
    assert not np.array_equal(ended.final_obs["rgb"], fresh)
    other = make_vec_env(cfg)
    other.reset(seed=77)
    other.set_state(saved)
    for a, want in zip(actions, first, strict=True):
        got = other.chunk_step(a)
        np.testing.assert_array_equal(got.obs["rgb"], want.obs["rgb"])
        np.testing.assert_allclose(got.obs["state"], want.obs["state"], atol=1e-5)
        np.testing.assert_array_equal(got.dones, want.dones)
    env.close()
    other.close()


def test_bad_obs_mode_is_refused_before_any_worker() -> None:
    from rlinf_envs import EnvConfig, env_config_problems

    cfg = EnvConfig(train=VecEnvConfig(env_type="maniskill", env_id="PushCube-v1", obs_mode="rgbz"))
    (problem,) = env_config_problems(cfg)
    assert problem.startswith(
        "env.train.obs_mode: 'rgbz' is not an observation mode of maniskill; allowed: state, rgb"
    )
