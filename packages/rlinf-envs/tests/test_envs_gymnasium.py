from __future__ import annotations

import pickle
import subprocess
import sys
from typing import Any

import attrs
import gymnasium as gym
import numpy as np
import pytest
from rlinf_envs import VecEnv
from rlinf_envs.gymnasium import GymnasiumVecEnv


def test_discrete_chunk_step_shapes_and_protocol() -> None:
    env = GymnasiumVecEnv("CartPole-v1", 4, group_size=2)
    assert isinstance(env, VecEnv)
    assert env.spec.action_type == "discrete" and env.spec.num_actions == 2 and env.spec.obs_shape == (4,)
    obs = env.reset(seed=3)
    assert obs.shape == (4, 4) and obs.dtype == np.float32
    np.testing.assert_array_equal(obs[0], obs[1])  # same group, same initial state
    assert not np.array_equal(obs[0], obs[2])
    res = env.chunk_step(np.zeros((4, 5), dtype=np.int64))
    assert res.rewards.shape == (4, 5) and res.terminations.shape == (4, 5) and res.obs.shape == (4, 4)
    assert res.rewards.dtype == np.float32 and res.dones.dtype == bool
    env.close()


def test_auto_reset_reports_episodes_and_final_obs() -> None:
    env = GymnasiumVecEnv("CartPole-v1", 2, max_episode_steps=7)
    env.reset(seed=0)
    # Alternate actions keep the pole up: episodes end by the 7-step time limit.
    res = env.chunk_step(np.tile([[0, 1]], (2, 4))[:, :7])
    assert res.truncations[:, 6].all() and not res.dones[:, :6].any()
    assert res.episodes.lengths == [7, 7] and res.episodes.returns == [7.0, 7.0]
    assert not np.allclose(res.final_obs, res.obs)  # obs is the reset state, final_obs the pre-reset one
    res2 = env.chunk_step(np.tile([[0, 1]], (2, 2)))
    assert res2.episodes.lengths == [] and not res2.dones.any()
    np.testing.assert_array_equal(res2.final_obs, res2.obs)  # nothing ended at the chunk's last step
    # An episode ending mid-chunk: the chunk continues in the new episode, final_obs is the current obs.
    res3 = env.chunk_step(np.tile([[0, 1]], (2, 2)))
    assert res3.truncations[:, 2].all() and not res3.dones[:, 3].any()
    np.testing.assert_array_equal(res3.final_obs, res3.obs)


class _Reach(gym.Env[np.ndarray, np.int64]):
    """Ends after 2 steps; reports ``is_success`` (as gymnasium-robotics tasks do) when action 1 came last."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        done = self.t == 2
        info = {"is_success": bool(action == 1)} if done else {}
        return np.zeros(2, np.float32), 0.0, done, False, info


def test_success_is_reported_only_by_envs_that_define_it() -> None:
    if "RlinfTest/Reach-v0" not in gym.registry:
        gym.register("RlinfTest/Reach-v0", entry_point=_Reach)
    env = GymnasiumVecEnv("RlinfTest/Reach-v0", 2)
    env.reset(seed=0)
    assert env.chunk_step(np.array([[0, 1], [1, 0]])).episodes.successes == [True, False]
    cartpole = GymnasiumVecEnv("CartPole-v1", 2, max_episode_steps=2)
    cartpole.reset(seed=0)
    res = cartpole.chunk_step(np.zeros((2, 2), dtype=np.int64))
    assert res.episodes.lengths == [2, 2] and res.episodes.successes == []  # no notion of success


def test_without_auto_reset_finished_envs_stay_done() -> None:
    env = GymnasiumVecEnv("CartPole-v1", 1, auto_reset=False, max_episode_steps=3)
    env.reset(seed=0)
    res = env.chunk_step(np.tile([[0, 1]], (1, 3)))
    assert res.truncations[0, 2] and res.rewards[0, 2] == 1.0
    res = env.chunk_step(np.zeros((1, 2), dtype=np.int64))
    assert res.dones.all() and (res.rewards == 0).all()


def test_continuous_mujoco_actions_are_clipped_and_checked() -> None:
    env = GymnasiumVecEnv("HalfCheetah-v5", 2)
    assert env.spec.action_type == "continuous" and env.spec.action_dim == 6
    env.reset(seed=1)
    res = env.chunk_step(np.full((2, 3, 6), 10.0))
    assert np.isfinite(res.rewards).all()
    with pytest.raises(
        ValueError, match=r"actions must be \[num_envs=2, chunk, action_dim=6\], got shape \(2, 3\)"
    ):
        env.chunk_step(np.zeros((2, 3)))
    env.close()


def test_bad_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="group_size must divide num_envs"):
        GymnasiumVecEnv("CartPole-v1", 3, group_size=2)
    with pytest.raises(ValueError, match="'CartPol-v1' is not registered"):
        GymnasiumVecEnv("CartPol-v1", 1)
    env = GymnasiumVecEnv("CartPole-v1", 1)
    with pytest.raises(RuntimeError, match="reset"):
        env.chunk_step(np.zeros((1, 1), dtype=np.int64))


def test_missing_extra_names_it() -> None:
    code = "import sys; sys.modules['gymnasium'] = None\ntry:\n import rlinf_envs.gymnasium\nexcept ImportError as e: print(e)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert 'pip install "rlinf-envs[gymnasium]"' in out.stdout, out.stderr


def test_env_config_problems_name_unknown_ids_with_the_registered_ones() -> None:
    from rlinf_envs import EnvConfig, VecEnvConfig, env_config_problems

    assert env_config_problems(EnvConfig()) == []
    cfg = EnvConfig(train=VecEnvConfig(env_id="CartPol-v1"), eval=VecEnvConfig(env_id="gym_nothing:Thing-v0"))
    train, evaluation = env_config_problems(cfg)
    assert train.startswith("env.train.env_id: 'CartPol-v1' is not a registered gymnasium environment")
    assert "did you mean 'CartPole-v1'" in train and "Pendulum-v1" in train
    assert evaluation == "env.eval.env_id: module 'gym_nothing' of 'gym_nothing:Thing-v0' is not installed"


def _continue(env: GymnasiumVecEnv, actions: np.ndarray, chunks: int) -> list[tuple[np.ndarray, ...]]:
    out = []
    for _ in range(chunks):
        res = env.chunk_step(actions)
        out.append(
            (res.obs, res.rewards, res.terminations, res.truncations, res.final_obs, res.episodes.returns)
        )
    return out


@pytest.mark.parametrize(
    ("env_id", "actions"),
    [
        ("CartPole-v1", np.tile([[0, 1, 1]], (4, 1))),
        ("HalfCheetah-v5", np.linspace(-1.0, 1.0, 4 * 3 * 6).reshape(4, 3, 6)),
    ],
)
def test_state_round_trip_continues_episodes_bit_for_bit(env_id: str, actions: np.ndarray) -> None:
    """A fresh env given get_state() mid-episode continues exactly like the original (auto-resets included)."""
    original = GymnasiumVecEnv(env_id, 4, group_size=2, max_episode_steps=11)
    original.reset(seed=5)
    _continue(original, actions, 2)
    state = pickle.loads(pickle.dumps(original.get_state()))  # what a checkpoint stores
    copy = GymnasiumVecEnv(env_id, 4, group_size=2, max_episode_steps=11)
    copy.reset(seed=99)  # different episodes, replaced by the state
    copy.set_state(state)
    # 8 more chunks cross the 11-step time limit: auto-resets draw from each env's restored RNG.
    expected, got = _continue(original, actions, 8), _continue(copy, actions, 8)
    for e, g in zip(expected, got, strict=True):
        for a, b in zip(e, g, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert any(e[5] for e in expected)  # episodes did end (and restart) after the restore
    np.testing.assert_array_equal(original.reset(), copy.reset())  # unseeded resets use the restored RNGs


def test_set_state_refuses_another_env() -> None:
    state = GymnasiumVecEnv("CartPole-v1", 2).get_state()
    with pytest.raises(ValueError, match=r"\('CartPole-v1', 2\) cannot be loaded into a GymnasiumVecEnv of"):
        GymnasiumVecEnv("CartPole-v1", 4).set_state(state)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_driver_side_spec_matches_the_vec_env(env_id: str) -> None:
    from rlinf_envs import VecEnvConfig, env_spec_without_worker

    cfg = VecEnvConfig(env_type="gymnasium", env_id=env_id, total_num_envs=2, max_steps_per_rollout_epoch=4)
    assert env_spec_without_worker(cfg) == GymnasiumVecEnv(env_id, 2).spec


def test_single_task_envs_are_described_by_their_config_or_id() -> None:
    from rlinf_envs import VecEnvConfig, describe_tasks

    spec = GymnasiumVecEnv("Pendulum-v1", 2).spec
    assert spec.task_descriptions is None
    cfg = VecEnvConfig(env_id="Pendulum-v1")
    assert describe_tasks(spec, cfg).task_descriptions == ("Pendulum-v1",)
    told = attrs.evolve(cfg, task_description="swing the pendulum up")
    described = describe_tasks(spec, told)
    assert described.task_descriptions == ("swing the pendulum up",)
    assert describe_tasks(described, cfg) == described  # an env's own descriptions are kept


def test_no_driver_side_spec_for_maniskill() -> None:
    from rlinf_envs import VecEnvConfig, env_spec_without_worker

    cfg = VecEnvConfig(
        env_type="maniskill", env_id="PushCube-v1", total_num_envs=2, max_steps_per_rollout_epoch=4
    )
    assert env_spec_without_worker(cfg) is None
