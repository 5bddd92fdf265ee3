from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from rlinf_envs import VecEnv

pytest.importorskip("mani_skill", reason='needs the ManiSkill extra: pip install "rlinf-envs[maniskill]"')

import torch
from rlinf_envs.maniskill import (
    ManiSkillVecEnv,
    VulkanUnavailableError,
)

# ManiSkill 3.0.1 calls np.isnan on torch tensors (NumPy 2 deprecation), once per step.
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning")


def _push_policy(obs: np.ndarray) -> np.ndarray:
    """Scripted PushCube pusher for ``pd_ee_delta_pos``: go behind the cube, lower, push it to the goal (+x)."""
    tcp, goal, cube = obs[:, 18:21], obs[:, 25:28], obs[:, 28:31]  # state layout: qpos9 qvel9 tcp7 goal3 obj7
    act = np.zeros((len(obs), 4), np.float32)
    act[:, 3] = -1.0
    for i in range(len(obs)):
        behind = np.array([cube[i, 0] - 0.06, cube[i, 1], 0.02])
        pushing = tcp[i, 0] < cube[i, 0] - 0.02 and abs(tcp[i, 1] - cube[i, 1]) < 0.015 and tcp[i, 2] < 0.04
        if pushing:
            target = np.array([goal[i, 0] + 0.03, cube[i, 1], 0.02])
        elif np.linalg.norm(tcp[i, :2] - behind[:2]) > 0.015:
            target = behind + np.array([0.0, 0.0, 0.08])
        else:
            target = behind
        act[i, :3] = np.clip((target - tcp[i]) / 0.05, -1.0, 1.0)
    return act


@pytest.mark.usefixtures("vulkan")
def test_pushcube_shapes_groups_and_protocol() -> None:
    env = ManiSkillVecEnv("PushCube-v1", 4, group_size=2)
    assert isinstance(env, VecEnv)
    assert env.spec.action_type == "continuous" and env.spec.obs_shape == (35,) and env.spec.action_dim == 8
    assert env.spec.action_low == (-1.0,) * 8 and env.spec.action_high == (1.0,) * 8
    obs = env.reset(seed=5)
    assert obs.shape == (4, 35) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs[0], obs[1])  # same group, same initial state (cube and goal)
    np.testing.assert_array_equal(obs[2], obs[3])
    assert not np.allclose(obs[0, 25:], obs[2, 25:])  # other group: other goal/cube placement
    np.testing.assert_array_equal(env.reset(seed=5), obs)  # seeded resets are reproducible
    res = env.chunk_step(np.random.default_rng(0).uniform(-3, 3, (4, 3, 8)))  # out of range: clipped
    assert res.obs.shape == (4, 35) and res.final_obs.shape == (4, 35) and res.obs.dtype == np.float32
    assert res.rewards.shape == (4, 3) and res.rewards.dtype == np.float32 and res.dones.shape == (4, 3)
    assert ((res.rewards >= 0) & (res.rewards <= 1)).all()  # normalized_dense
    assert not res.dones.any() and res.episodes.lengths == []
    env.close()
    env.close()
    with pytest.raises(RuntimeError, match="closed"):
        env.reset()


@pytest.mark.usefixtures("vulkan")
def test_auto_reset_final_obs_and_episode_stats() -> None:
    env = ManiSkillVecEnv("PushCube-v1", 2, max_episode_steps=3)
    first = env.reset(seed=0)
    zeros = np.zeros((2, 4, 8))
    res = env.chunk_step(zeros)  # the time limit hits at step 3 of 4: the chunk goes on in the new episode
    assert (
        res.truncations[:, 2].all() and not res.truncations[:, [0, 1, 3]].any() and not res.terminations.any()
    )
    assert res.episodes.lengths == [3, 3] and res.episodes.successes == [False, False]
    np.testing.assert_allclose(res.episodes.returns, res.rewards[:, :3].sum(1), rtol=1e-5)
    np.testing.assert_array_equal(res.final_obs, res.obs)  # nothing ended at the chunk's last step
    res2 = env.chunk_step(
        np.zeros((2, 2, 8))
    )  # steps 2 and 3 of the second episode: it ends at the last step
    assert res2.truncations[:, 1].all() and res2.episodes.lengths == [3, 3]
    assert not np.allclose(res2.final_obs, res2.obs)  # pre-reset obs vs the new episode's first obs
    # the new episode starts at rest (zero joint velocities) near the robot's rest pose, as after reset()
    assert (
        (res2.obs[:, 9:18] == 0).all()
        and (first[:, 9:18] == 0).all()
        and (res2.final_obs[:, 9:18] != 0).any()
    )
    np.testing.assert_allclose(res2.obs[:, :9], first[:, :9], atol=0.2)
    env.close()


@pytest.mark.usefixtures("vulkan")
def test_without_auto_reset_finished_envs_stay_done() -> None:
    env = ManiSkillVecEnv("PickCube-v1", 2, auto_reset=False, max_episode_steps=2)
    assert env.spec.obs_shape == (42,)
    env.reset(seed=1)
    res = env.chunk_step(np.zeros((2, 3, 8)))
    assert res.truncations[:, 1].all() and res.terminations[:, 2].all() and (res.rewards[:, 2] == 0).all()
    assert res.episodes.lengths == [2, 2]
    np.testing.assert_array_equal(res.final_obs, res.obs)  # the obs at the end, kept
    res = env.chunk_step(np.zeros((2, 2, 8)))
    assert res.dones.all() and (res.rewards == 0).all() and res.episodes.lengths == []
    env.reset(seed=1)
    assert not env.chunk_step(np.zeros((2, 1, 8))).dones.any()
    env.close()


@pytest.mark.parametrize("reward_mode", ["normalized_dense", "sparse"])
@pytest.mark.usefixtures("vulkan")
def test_success_is_reported_and_terminates(reward_mode: str) -> None:
    env = ManiSkillVecEnv("PushCube-v1", 2, control_mode="pd_ee_delta_pos", reward_mode=reward_mode)
    assert env.spec.action_dim == 4
    obs = env.reset(seed=0)
    successes: list[bool] = []
    for _ in range(25):
        res = env.chunk_step(_push_policy(obs)[:, None])
        obs = res.obs
        successes += res.episodes.successes
        if res.terminations.any():
            i = int(np.flatnonzero(res.terminations[:, 0])[0])
            assert res.rewards[i, 0] == pytest.approx(
                1.0
            )  # success step: 1 in both normalized_dense and sparse
        elif reward_mode == "sparse":
            assert (res.rewards == 0).all()
    assert True in successes, successes
    random_env = ManiSkillVecEnv("PushCube-v1", 1, max_episode_steps=10)
    random_env.reset(seed=0)
    res = random_env.chunk_step(np.zeros((1, 10, 8)))
    assert res.episodes.successes == [False]  # a robot that does not move does not succeed
    env.close()
    random_env.close()


@pytest.mark.usefixtures("vulkan")
def test_ignore_terminations_runs_to_the_time_limit_and_keeps_success() -> None:
    env = ManiSkillVecEnv(
        "PushCube-v1", 2, control_mode="pd_ee_delta_pos", ignore_terminations=True, max_episode_steps=15
    )
    obs = env.reset(seed=0)
    terms, truncs, successes = [], [], []
    for _ in range(15):
        res = env.chunk_step(_push_policy(obs)[:, None])
        obs = res.obs
        terms.append(res.terminations[:, 0])
        truncs.append(res.truncations[:, 0])
        successes += res.episodes.successes
    assert not np.any(terms) and np.all(truncs[-1]) and not np.any(truncs[:-1])
    assert len(successes) == 2 and True in successes  # success at any step of the episode counts
    env.close()


@pytest.mark.usefixtures("vulkan")
def test_async_vector_env_matches_sync() -> None:
    actions = np.random.default_rng(1).uniform(-1, 1, (2, 4, 8))
    out = []
    for mode in ("sync", "async"):
        env = ManiSkillVecEnv("PushCube-v1", 2, vector_mode=mode, max_episode_steps=3, step_timeout_s=60)
        obs = env.reset(seed=7)
        res = env.chunk_step(actions)
        out.append((obs, res.obs, res.final_obs, res.rewards))
        env.close()
    for a, b in zip(*out, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.usefixtures("vulkan")
def test_bad_arguments_and_actions_are_named() -> None:
    with pytest.raises(ValueError, match="group_size must divide num_envs"):
        ManiSkillVecEnv("PushCube-v1", 3, group_size=2)
    with pytest.raises(
        ValueError, match=r"'PushCub-v1' is not a registered ManiSkill task; similar: \['PushCube-v1'"
    ):
        ManiSkillVecEnv("PushCub-v1", 1)
    with pytest.raises(ValueError, match="reward_mode must be one of"):
        ManiSkillVecEnv("PushCube-v1", 1, reward_mode="shaped")
    with pytest.raises(ValueError, match="obs_mode must be one of"):
        ManiSkillVecEnv("PushCube-v1", 1, obs_mode="rgbz")
    with pytest.raises(ValueError, match="sim_backend must be one of"):
        ManiSkillVecEnv("PushCube-v1", 1, sim_backend="bullet")
    with pytest.raises(ValueError, match="vector_mode must be one of"):
        ManiSkillVecEnv("PushCube-v1", 1, vector_mode="threads")
    with pytest.raises(ValueError, match="control_mode 'joint_magic' is not supported"):
        ManiSkillVecEnv("PushCube-v1", 1, control_mode="joint_magic")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA device"):
            ManiSkillVecEnv("PushCube-v1", 1, sim_backend="physx_cuda")
    env = ManiSkillVecEnv("PushCube-v1", 2)
    with pytest.raises(RuntimeError, match="reset"):
        env.chunk_step(np.zeros((2, 1, 8)))
    env.reset(seed=0)
    with pytest.raises(
        ValueError, match=r"actions must be \[num_envs=2, chunk, action_dim=8\], got shape \(2, 8\)"
    ):
        env.chunk_step(np.zeros((2, 8)))
    with pytest.raises(ValueError, match=r"got shape \(2, 1, 7\)"):
        env.chunk_step(np.zeros((2, 1, 7)))
    with pytest.raises(ValueError, match="NaN or inf"):
        env.chunk_step(np.full((2, 1, 8), np.nan))
    env.close()


def test_missing_vulkan_driver_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VK_ICD_FILENAMES", "/nonexistent/lvp_icd.json")
    with pytest.raises(
        VulkanUnavailableError, match=r"(?s)Vulkan driver.*install_vulkan_cpu\.sh.*VK_ICD_FILENAMES"
    ):
        ManiSkillVecEnv("PushCube-v1", 1, render_backend="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU-batched ManiSkill sim needs CUDA")
@pytest.mark.usefixtures("vulkan")
def test_gpu_sim_groups_and_auto_reset() -> None:
    env = ManiSkillVecEnv("PushCube-v1", 8, group_size=4, sim_backend="physx_cuda", max_episode_steps=3)
    obs = env.reset(seed=0)
    assert obs.shape == (8, 35)
    np.testing.assert_allclose(obs[0], obs[3], atol=1e-5)
    assert not np.allclose(obs[0, 25:], obs[4, 25:])
    res = env.chunk_step(np.zeros((8, 4, 8)))
    assert res.truncations[:, 2].all() and res.episodes.lengths == [3] * 8
    env.close()


def test_missing_extra_names_it() -> None:
    code = (
        "import sys; sys.modules['mani_skill'] = None\n"
        "try:\n import rlinf_envs.maniskill\nexcept ImportError as e: print(e)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert 'pip install "rlinf-envs[maniskill]"' in out.stdout, out.stderr


def test_env_config_problems_checks_maniskill_ids_against_its_registry() -> None:
    from rlinf_envs import EnvConfig, VecEnvConfig, env_config_problems

    good = VecEnvConfig(env_type="maniskill", env_id="PushCube-v1")
    assert env_config_problems(EnvConfig(train=good, eval=good)) == []
    bad = VecEnvConfig(env_type="maniskill", env_id="PushCub-v1")
    (problem,) = env_config_problems(EnvConfig(train=good, eval=bad))
    assert problem.startswith("env.eval.env_id: 'PushCub-v1' is not a registered maniskill environment")
    assert "did you mean 'PushCube-v1'" in problem and "PickCube-v1" in problem


@pytest.mark.usefixtures("vulkan")
def test_state_round_trip_continues_episodes_bit_for_bit() -> None:
    """A fresh env given get_state() mid-episode continues like the original: exactly once every env was reset.

    The episode in progress matches to float32 rounding only (SAPIEN recomputes the robot's link poses from the
    restored joint positions, ~1e-7 off the simulated ones); from its auto-reset on, everything is bit-equal.
    """
    import pickle

    actions = np.random.default_rng(2).uniform(-1, 1, (2, 3, 8))
    original = ManiSkillVecEnv("PushCube-v1", 2, max_episode_steps=5)
    original.reset(seed=4)
    original.chunk_step(actions)  # 3 steps into the first episode
    state = pickle.loads(pickle.dumps(original.get_state()))  # what a checkpoint stores
    copy = ManiSkillVecEnv("PushCube-v1", 2, max_episode_steps=5)
    copy.reset(seed=11)  # other episodes, replaced by the state
    copy.set_state(state)
    for k in range(4):  # crosses the 5-step limit twice: auto-resets seeded from the restored generators
        e, g = original.chunk_step(actions), copy.chunk_step(actions)
        np.testing.assert_array_equal(e.dones, g.dones)
        assert e.episodes.lengths == g.episodes.lengths
        for a, b in ((e.obs, g.obs), (e.rewards, g.rewards), (e.final_obs, g.final_obs)):
            if k == 0:  # the episode in progress at the save ends at this chunk's 2nd step
                np.testing.assert_allclose(a, b, rtol=0, atol=1e-5)
            else:
                np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"\('PushCube-v1', 2, 'physx_cpu'\) cannot be loaded"):
        ManiSkillVecEnv("PushCube-v1", 2, sim_backend="cpu").set_state(state)
    for env in (original, copy):
        env.close()
