"""MetaWorldVecEnv against the real Meta-World v3 package (MuJoCo; images through headless EGL)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from typing import Any

import attrs
import numpy as np
import pytest
from rlinf_envs import EnvConfig, VecEnv, VecEnvConfig, env_config_problems, prepare_process_env

pytest.importorskip("metaworld", reason='needs the Meta-World extra: pip install "rlinf-envs[metaworld]"')

import mujoco
from rlinf_envs.metaworld import (
    CAMERAS,
    MULTI_TASK_BENCHMARKS,
    NUM_VARIATIONS,
    MetaWorldVecEnv,
    metaworld_spec,
    task_and_variation,
)

MT10 = MULTI_TASK_BENCHMARKS["MT10"]
MT50 = MULTI_TASK_BENCHMARKS["MT50"]


def _actions(n: int, c: int, seed: int = 0, group_size: int = 1) -> np.ndarray:
    """Random actions, equal within each group of ``group_size`` consecutive envs."""
    a = np.random.default_rng(seed).uniform(-1.0, 1.0, (n // group_size, c, 4)).astype(np.float32)
    return np.repeat(a, group_size, axis=0)


def _trace(env: MetaWorldVecEnv, chunks: int, c: int = 3, seed: int = 0) -> list[Any]:
    out = []
    for k in range(chunks):
        res = env.chunk_step(_actions(env.num_envs, c, seed + k))
        out.append(
            (
                res.obs,
                res.rewards,
                res.terminations,
                res.truncations,
                res.final_obs,
                res.episodes.returns,
                res.episodes.lengths,
                res.episodes.successes,
            )
        )
    return out


def _assert_same(a: Any, b: Any) -> None:
    """Bit-identical nested tuples/lists/dicts of arrays and scalars."""
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def test_state_obs_groups_determinism_and_protocol() -> None:
    env = MetaWorldVecEnv("MT1/reach-v3", 4, group_size=2)
    assert isinstance(env, VecEnv)
    assert env.spec == metaworld_spec("state")
    assert env.spec.obs_shape == (39,) and env.spec.action_type == "continuous" and env.spec.action_dim == 4
    assert env.spec.action_low == (-1.0,) * 4 and env.spec.action_high == (1.0,) * 4
    obs = env.reset(seed=3)
    assert isinstance(obs, np.ndarray) and obs.shape == (4, 39) and obs.dtype == np.float32
    assert env.tasks() == [("reach-v3", 3)] * 2 + [("reach-v3", 4)] * 2
    np.testing.assert_array_equal(obs[0], obs[1])  # same group: same variation
    np.testing.assert_array_equal(obs[2], obs[3])
    assert not np.allclose(obs[0, 36:], obs[2, 36:])  # other variation: other goal
    targets = [e._target_pos for e in env.task_envs()]
    np.testing.assert_allclose(obs[:, 36:], np.stack(targets), rtol=1e-6)  # MT1: the goal is observed
    np.testing.assert_array_equal(env.reset(seed=3), obs)  # seeded resets are reproducible
    acts = _actions(4, 3, group_size=2) * 3.0  # out of range: clipped
    res = env.chunk_step(acts)
    assert res.obs.shape == (4, 39) and res.final_obs.shape == (4, 39) and res.rewards.shape == (4, 3)
    assert res.rewards.dtype == np.float32 and res.dones.shape == (4, 3) and not res.dones.any()
    assert ((res.rewards >= 0) & (res.rewards <= 10)).all()  # dense: Meta-World's [0, 10]
    np.testing.assert_array_equal(res.obs[0], res.obs[1])  # equal state, equal actions: equal outcome
    other = MetaWorldVecEnv("MT1/reach-v3", 4, group_size=2)
    np.testing.assert_array_equal(other.reset(seed=3), obs)
    _assert_same(other.chunk_step(acts).obs, res.obs)  # another instance, same seed and actions
    for e in (env, other):
        e.close()
        e.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


def test_rgb_obs_shapes_dtypes_and_proprio() -> None:
    env = MetaWorldVecEnv("MT1/pick-place-v3", 2, obs_mode="rgb")
    state_env = MetaWorldVecEnv("MT1/pick-place-v3", 2)
    assert env.spec.obs_shape == () and env.spec.obs_dict is not None
    assert env.spec.obs_dict["rgb"].shape == (128, 128, 3) and env.spec.obs_dict["rgb"].dtype == "uint8"
    assert env.spec.obs_dict["state"].shape == (4,) and env.spec.obs_dict["state"].dtype == "float32"
    obs = env.reset(seed=0)
    states = state_env.reset(seed=0)
    assert isinstance(obs, dict) and list(obs) == ["rgb", "state"]
    assert obs["rgb"].shape == (2, 128, 128, 3) and obs["rgb"].dtype == np.uint8
    assert obs["state"].shape == (2, 4) and obs["state"].dtype == np.float32
    np.testing.assert_array_equal(obs["state"], states[:, :4])  # hand xyz + gripper of the state vector
    assert obs["rgb"].std() > 20  # a scene, not a blank frame
    assert not np.array_equal(obs["rgb"][0], obs["rgb"][1])  # two variations: object and goal elsewhere
    res = env.chunk_step(_actions(2, 4))
    assert isinstance(res.obs, dict) and isinstance(res.final_obs, dict)
    assert res.obs["rgb"].shape == (2, 128, 128, 3) and not np.array_equal(res.obs["rgb"], obs["rgb"])
    env.close()
    state_env.close()
    small = MetaWorldVecEnv("MT1/reach-v3", 1, obs_mode="rgb", image_size=(48, 64), camera_name="gripperPOV")
    img = small.reset(seed=0)["rgb"]  # type: ignore[index]
    assert img.shape == (1, 48, 64, 3) and img.std() > 5
    small.close()


_HAND_BODIES = ("hand", "rightclaw", "leftclaw", "rightpad", "leftpad")


def test_rendering_moves_between_threads() -> None:
    """Env workers run calls on a thread pool: an env built in one thread renders in others."""
    from concurrent.futures import ThreadPoolExecutor

    env = MetaWorldVecEnv("MT1/reach-v3", 1, obs_mode="rgb", image_size=(32, 32))
    first = env.reset(seed=0)["rgb"]  # type: ignore[index]
    for k in range(3):
        with ThreadPoolExecutor(1) as pool:  # a new thread each time
            res = pool.submit(env.chunk_step, _actions(1, 2, seed=k)).result()
        assert res.obs["rgb"].shape == (1, 32, 32, 3)  # type: ignore[index]
    np.testing.assert_array_equal(env.reset(seed=0)["rgb"], first)  # type: ignore[index]
    env.close()


def test_gymnasium_renderers_in_the_same_thread_keep_their_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """gymnasium's MuJoCo renderer makes its context current once; our renders must leave it current."""
    import gymnasium as gym

    monkeypatch.setenv("MUJOCO_GL", "egl")  # read by gymnasium when its renderer is built
    raw = gym.make(
        "Meta-World/MT1",
        env_name="reach-v3",
        seed=0,
        render_mode="rgb_array",
        width=32,
        height=32,
        disable_env_checker=True,
    )
    raw.reset(seed=0)
    before = raw.render()
    env = MetaWorldVecEnv("MT1/reach-v3", 1, obs_mode="rgb", image_size=(32, 32))
    env.reset(seed=0)
    env.chunk_step(_actions(1, 2))
    after = raw.render()
    assert before.std() > 5
    np.testing.assert_array_equal(after, before)
    env.close()
    raw.close()


def _green_hand_row(env: MetaWorldVecEnv, dz: float) -> float:
    """Move the hand up or down for 25 steps; the mean image row of its (painted green) gripper."""
    res = env.chunk_step(np.tile(np.array([0.0, 0.0, dz, 0.0], np.float32), (1, 25, 1)))
    img = res.obs["rgb"][0].astype(np.int64)  # type: ignore[index]
    green = (img[..., 1] > 120) & (img[..., 0] < 80) & (img[..., 2] < 80)
    assert green.sum() > 5, "the gripper is not in view"
    return float(np.nonzero(green)[0].mean())


@pytest.mark.parametrize("camera", ["corner4", "corner", "corner3"])
def test_images_are_upright(camera: str) -> None:
    env = MetaWorldVecEnv("MT1/reach-v3", 1, obs_mode="rgb", camera_name=camera)
    env.reset(seed=0)
    model = env.task_envs()[0].model
    hand = {mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, b) for b in _HAND_BODIES}
    for g in range(model.ngeom):
        if model.geom_bodyid[g] in hand:
            model.geom_rgba[g] = (0.0, 1.0, 0.0, 1.0)
            model.geom_matid[g] = -1
    low = _green_hand_row(env, -1.0)
    high = _green_hand_row(env, 1.0)
    assert high < low - 5  # the raised hand is higher up in the image: rows grow downwards
    env.close()


def test_cameras_are_the_scene_cameras() -> None:
    env = MetaWorldVecEnv("MT1/reach-v3", 1)
    env.reset(seed=0)
    model = env.task_envs()[0].model
    names = tuple(mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_CAMERA, i) for i in range(model.ncam))
    assert names == CAMERAS
    env.close()


def test_task_and_variation_enumerates_every_pair_once() -> None:
    pairs = {task_and_variation(s, 10, NUM_VARIATIONS) for s in range(7, 7 + 10 * NUM_VARIATIONS)}
    assert len(pairs) == 10 * NUM_VARIATIONS
    assert [task_and_variation(s, 10, 50) for s in (0, 9, 10, 501)] == [(0, 0), (9, 0), (0, 1), (1, 0)]


def test_multi_task_assignment_round_robin_by_group() -> None:
    env = MetaWorldVecEnv("MT10", 4, group_size=2)
    obs = env.reset(seed=9)  # group seeds 9 and 10: the last task in variation 0, the first in variation 1
    assert env.tasks() == [(MT10[9], 0)] * 2 + [(MT10[0], 1)] * 2
    np.testing.assert_array_equal(obs[0], obs[1])
    assert [type(e).__name__ for e in env.task_envs()] == ["SawyerWindowCloseEnvV3"] * 2 + [
        "SawyerReachEnvV3"
    ] * 2
    env.reset(seed=10)  # a seeded reset moves every group on: the env slots rebuild their task envs
    assert env.tasks() == [(MT10[0], 1)] * 2 + [(MT10[1], 1)] * 2
    env.close()
    mt50 = MetaWorldVecEnv("MT50", 2)
    mt50.reset(seed=49)
    assert mt50.tasks() == [(MT50[49], 0), (MT50[0], 1)]
    mt50.close()


def test_auto_reset_keeps_the_task_and_shares_variations_in_groups() -> None:
    env = MetaWorldVecEnv("MT10", 4, group_size=2, max_episode_steps=3)
    env.reset(seed=4)
    before = env.tasks()
    res = env.chunk_step(_actions(4, 4, group_size=2))  # the time limit hits at step 3 of 4
    assert res.truncations[:, 2].all() and not res.truncations[:, [0, 1, 3]].any()
    assert not res.terminations.any() and res.episodes.lengths == [3] * 4
    assert res.episodes.successes == [False] * 4 and res.episodes.successes_at_end == [False] * 4
    assert res.episodes.tasks == [t for t, _ in before]  # the task names, per finished episode
    np.testing.assert_allclose(res.episodes.returns, res.rewards[:, :3].sum(1), rtol=1e-5)
    after = env.tasks()
    assert [t for t, _ in after] == [t for t, _ in before]  # same task, a new variation drawn
    assert after[0] == after[1] and after[2] == after[3]  # group members draw the same variation
    np.testing.assert_array_equal(res.final_obs, res.obs)  # nothing ended at the chunk's last step
    res2 = env.chunk_step(_actions(4, 2, seed=1))  # ends at the last step of this chunk
    assert res2.truncations[:, 1].all()
    assert not np.allclose(res2.final_obs, res2.obs)  # the pre-reset obs vs the new episode's first one
    env.close()


def test_ml1_hides_the_goal_of_the_same_variations() -> None:
    ml1, mt1 = MetaWorldVecEnv("ML1/push-v3", 2), MetaWorldVecEnv("MT1/push-v3", 2)
    hidden, shown = ml1.reset(seed=5), mt1.reset(seed=5)
    assert not hidden[:, 36:].any() and np.abs(shown[:, 36:]).sum() > 0
    np.testing.assert_array_equal(hidden[:, :36], shown[:, :36])  # the same object positions
    ml1.close()
    mt1.close()


def test_success_terminates_with_sparse_reward() -> None:
    env = MetaWorldVecEnv("MT1/push-v3", 2, reward_mode="sparse", max_episode_steps=20)
    env.reset(seed=0)
    puck = env.task_envs()[0]
    puck._set_obj_xyz(puck._target_pos)  # the puck on its goal, through the simulator state
    res = env.chunk_step(np.zeros((2, 3, 4), np.float32))
    assert res.terminations[0, 0] and not res.terminations[0, 1:].any() and not res.dones[1].any()
    assert res.rewards[0, 0] == 1.0 and res.rewards[1].sum() == 0.0
    assert res.episodes.successes == [True] and res.episodes.lengths == [1] and res.episodes.returns == [1.0]
    assert res.episodes.successes_at_end == [True] and res.episodes.tasks == ["push-v3"]
    env.close()


def test_ignore_terminations_runs_to_the_time_limit_and_reports_success() -> None:
    env = MetaWorldVecEnv("MT1/push-v3", 1, ignore_terminations=True, max_episode_steps=3)
    env.reset(seed=0)
    puck = env.task_envs()[0]
    puck._set_obj_xyz(puck._target_pos)
    res = env.chunk_step(np.zeros((1, 3, 4), np.float32))
    assert not res.terminations.any() and res.truncations[0, 2]
    assert res.episodes.successes == [True] and res.episodes.lengths == [3]
    assert (res.rewards > 5).all()  # dense reward near its maximum while the puck sits on the goal
    env.close()


@pytest.mark.filterwarnings("ignore:Constant.*may be too high:UserWarning")  # the policy's own gain warning
def test_scripted_reach_policy_succeeds() -> None:
    from metaworld.policies import SawyerReachV3Policy

    env = MetaWorldVecEnv("MT1/reach-v3", 1, reward_mode="normalized_dense")
    obs = env.reset(seed=2)
    policy = SawyerReachV3Policy()
    for _ in range(100):
        res = env.chunk_step(policy.get_action(obs[0])[None, None].astype(np.float32))
        assert ((res.rewards >= 0) & (res.rewards <= 1)).all()
        obs = res.obs
        if res.episodes.lengths:
            break
    assert res.terminations[0, 0] and res.episodes.successes == [True] and res.episodes.lengths[0] < 100
    env.close()


def test_without_auto_reset_finished_envs_stay_done() -> None:
    env = MetaWorldVecEnv("MT1/reach-v3", 2, auto_reset=False, max_episode_steps=2)
    env.reset(seed=0)
    res = env.chunk_step(_actions(2, 4))
    assert res.truncations[:, 1].all() and res.terminations[:, 2:].all() and (res.rewards[:, 2:] == 0).all()
    assert res.episodes.lengths == [2, 2]
    res2 = env.chunk_step(_actions(2, 2))
    assert res2.terminations.all() and (res2.rewards == 0).all() and res2.episodes.lengths == []
    env.close()


@pytest.mark.parametrize("obs_mode", ["state", "rgb"])
def test_state_round_trip_continues_episodes_bit_for_bit(obs_mode: str) -> None:
    def make() -> MetaWorldVecEnv:
        return MetaWorldVecEnv("MT10", 2, obs_mode=obs_mode, max_episode_steps=5, image_size=(32, 32))

    env = make()
    env.reset(seed=8)
    env.chunk_step(_actions(2, 3))
    blob = pickle.dumps(env.get_state())
    expected = _trace(env, 3, seed=10)  # crosses an auto-reset (5-step episodes)
    fresh = make()
    fresh.set_state(pickle.loads(blob))
    _assert_same(_trace(fresh, 3, seed=10), expected)
    env.set_state(pickle.loads(blob))  # back in time on the same env, whose slots moved on
    _assert_same(_trace(env, 3, seed=10), expected)
    with pytest.raises(ValueError, match="cannot be loaded"):
        MetaWorldVecEnv("MT10", 4).set_state(pickle.loads(blob))
    env.close()
    fresh.close()


@pytest.mark.slow
def test_sync_and_async_are_identical() -> None:
    kwargs: dict[str, Any] = {
        "group_size": 2,
        "obs_mode": "rgb",
        "image_size": (32, 32),
        "max_episode_steps": 4,
    }
    sync = MetaWorldVecEnv("MT10", 4, **kwargs)
    asyn = MetaWorldVecEnv("MT10", 4, vector_mode="async", **kwargs)
    try:
        _assert_same(asyn.reset(seed=1), sync.reset(seed=1))
        assert asyn.tasks() == sync.tasks()
        _assert_same(_trace(asyn, 3), _trace(sync, 3))
        state = asyn.get_state()  # an async state resumes in a sync env
        expected = _trace(asyn, 2, seed=5)
        sync.set_state(pickle.loads(pickle.dumps(state)))
        _assert_same(_trace(sync, 2, seed=5), expected)
        with pytest.raises(RuntimeError, match="async"):
            asyn.task_envs()
    finally:
        sync.close()
        asyn.close()


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="did you mean 'MT1/reach-v3'"):
        MetaWorldVecEnv("MT1/reach-v2", 1)
    with pytest.raises(ValueError, match="obs_mode"):
        MetaWorldVecEnv("MT10", 1, obs_mode="depth")
    with pytest.raises(ValueError, match="camera_name must be one of topview, corner"):
        MetaWorldVecEnv("MT10", 1, camera_name="front")
    with pytest.raises(ValueError, match="group_size"):
        MetaWorldVecEnv("MT10", 3, group_size=2)
    with pytest.raises(ValueError, match="image_size"):
        MetaWorldVecEnv("MT10", 1, obs_mode="rgb", image_size=(0, 8))
    env = MetaWorldVecEnv("MT10", 1)
    with pytest.raises(RuntimeError, match="reset"):
        env.chunk_step(np.zeros((1, 1, 4)))
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action_dim=4"):
        env.chunk_step(np.zeros((1, 1, 3)))
    env.close()


def test_env_config_problems_list_the_allowed_values() -> None:
    train = VecEnvConfig(env_type="metaworld", env_id="MT1/reach-v2")
    evaluation = VecEnvConfig(env_type="metaworld", env_id="MT10", camera_name="front")
    bad_id, bad_camera = env_config_problems(EnvConfig(train=train, eval=evaluation))
    assert bad_id.startswith("env.train.env_id: 'MT1/reach-v2' is not a registered metaworld environment")
    assert "did you mean 'MT1/reach-v3'" in bad_id and "MT50" in bad_id and "ML1/push-v3" in bad_id
    assert bad_camera == (
        "env.eval.camera_name: 'front' is not a Meta-World camera; allowed: topview, corner, corner2, corner3, "
        "corner4, behindGripper, gripperPOV"
    )
    depth = VecEnvConfig(env_type="metaworld", env_id="MT10", obs_mode="depth")
    assert env_config_problems(EnvConfig(train=depth, eval=VecEnvConfig())) == [
        "env.train.obs_mode: 'depth' is not an observation mode of metaworld; allowed: state, rgb"
    ]
    good = VecEnvConfig(env_type="metaworld", env_id="MT1/reach-v3", obs_mode="rgb", camera_name="corner2")
    assert env_config_problems(EnvConfig(train=good, eval=good)) == []
    with pytest.raises(ValueError, match="image_size"):
        VecEnvConfig(env_type="metaworld", image_size=(0, 128))


def test_config_builds_the_env_and_the_driver_spec() -> None:
    from rlinf_envs import env_spec_without_worker, make_vec_env

    cfg = VecEnvConfig(
        env_type="metaworld", env_id="MT1/reach-v3", total_num_envs=2, obs_mode="rgb", image_size=(40, 48)
    )
    env = make_vec_env(cfg)
    assert isinstance(env, MetaWorldVecEnv) and env.spec == env_spec_without_worker(cfg)
    assert env.reset(seed=0)["rgb"].shape == (2, 40, 48, 3)  # type: ignore[index]
    env.close()
    stacked = attrs.evolve(cfg, frame_stack=2)
    env = make_vec_env(stacked)
    assert env.spec == env_spec_without_worker(stacked) and env.spec.obs_dict["rgb"].shape == (40, 48, 6)  # type: ignore[index]
    assert env.reset(seed=0)["rgb"].shape == (2, 40, 48, 6)  # type: ignore[index]
    env.close()


def test_render_draws_the_camera_in_any_obs_mode() -> None:
    state_env = MetaWorldVecEnv("MT1/pick-place-v3", 2, image_size=(48, 48))
    rgb_env = MetaWorldVecEnv("MT1/pick-place-v3", 2, obs_mode="rgb", image_size=(48, 48))
    state_env.reset(seed=3)
    obs = rgb_env.reset(seed=3)
    frames = state_env.render()
    assert frames.shape == (2, 48, 48, 3) and frames.dtype == np.uint8
    np.testing.assert_array_equal(frames, obs["rgb"])  # type: ignore[index]
    np.testing.assert_array_equal(rgb_env.render(), obs["rgb"])  # type: ignore[index]
    state_env.close()
    rgb_env.close()


def test_rgb_configs_select_headless_egl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MUJOCO_GL", raising=False)
    state = VecEnvConfig(env_type="metaworld", env_id="MT10")
    assert prepare_process_env(EnvConfig(train=state, eval=state)) == {}
    rgb = VecEnvConfig(env_type="metaworld", env_id="MT10", obs_mode="rgb")
    assert prepare_process_env(EnvConfig(train=rgb, eval=state)) == {"MUJOCO_GL": "egl"}
    assert os.environ["MUJOCO_GL"] == "egl"
    monkeypatch.setenv("MUJOCO_GL", "osmesa")  # the user's choice is kept
    assert prepare_process_env(EnvConfig(train=rgb, eval=rgb)) == {}


def test_missing_extra_names_it() -> None:
    code = "import sys; sys.modules['metaworld'] = None\ntry:\n import rlinf_envs.metaworld\nexcept ImportError as e: print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert 'pip install "rlinf-envs[metaworld]"' in out.stdout, out.stderr
