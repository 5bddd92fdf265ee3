"""HG-DAgger on the env side: who executed each step, and what, from the rollout's gate and the env's human."""

from __future__ import annotations

import numpy as np
from rlinf_core.protocols import ChunkStepResult, EpisodeStats
from rlinf_envs._worker import _executed
from rlinf_envs.gymnasium import GymnasiumVecEnv


def _result(interventions: np.ndarray | None, actions: np.ndarray | None) -> ChunkStepResult:
    zeros = np.zeros((2, 2), dtype=np.float32)
    return ChunkStepResult(
        np.zeros((2, 1)),
        zeros,
        zeros.astype(bool),
        zeros.astype(bool),
        np.zeros((2, 1)),
        EpisodeStats(),
        interventions=interventions,
        intervention_actions=actions,
    )


def test_the_rollout_gate_and_the_env_human_combine() -> None:
    policy = np.zeros((2, 2, 1), dtype=np.float32)
    human = np.array([[False, True], [False, False]])
    res = _result(human, np.full((2, 2, 1), 7.0, dtype=np.float32))
    actions, flags = _executed(policy, np.array([False, True]), res)
    assert flags is not None and flags.tolist() == [[False, True], [True, True]]
    assert actions[..., 0].tolist() == [[0.0, 7.0], [0.0, 0.0]]  # the human's action where the human acted
    actions, flags = _executed(policy, None, res)
    assert flags is not None and flags.tolist() == human.tolist()
    actions, flags = _executed(policy, None, _result(None, None))
    assert flags is None and actions is policy


def test_an_env_without_a_human_reports_no_interventions() -> None:
    env = GymnasiumVecEnv("Pendulum-v1", 2)
    env.reset(seed=0)
    res = env.chunk_step(np.zeros((2, 3, 1), dtype=np.float32))
    assert res.interventions is None and res.intervention_actions is None
    env.close()
