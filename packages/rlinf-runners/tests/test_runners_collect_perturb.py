"""``record_episodes``' action perturbation (DART): the env executes perturbed actions, the episodes keep the
chooser's own."""

from __future__ import annotations

import numpy as np
from rlinf_envs import VecEnvConfig, make_vec_env
from rlinf_runners.apps._collect import _noise, record_episodes


def test_perturbed_actions_are_executed_and_the_clean_ones_recorded() -> None:
    split = VecEnvConfig(env_id="Pendulum-v1", total_num_envs=2, max_episode_steps=5)
    env = make_vec_env(split, 2)
    executed: list[np.ndarray] = []
    perturb = _noise(env.spec, 0.5, seed=0)

    def spy(actions: np.ndarray) -> np.ndarray:
        out = perturb(actions)
        executed.append(out)
        return out

    def choose(obs: np.ndarray) -> np.ndarray:
        return np.full((len(obs), 1, 1), 0.25, dtype=np.float32)

    kept, outcomes = record_episodes(
        env, choose, chunks=1, episodes=2, seed=0, only_success=False, perturb=spy
    )
    env.close()
    assert len(kept) == 2 and outcomes == [None, None]
    for episode in kept:
        assert np.all(np.asarray(episode["action"]) == 0.25)  # the labels: the chooser's actions
    moved = np.concatenate(executed).reshape(-1)
    assert not np.allclose(moved, 0.25)  # what ran: noisy, within Pendulum's bounds [-2, 2]
    assert np.all(np.abs(moved) <= 2.0)
