"""HG-DAgger's real-human path on gym-hil: its keyboard-takeover wrapper's step info reaches the trajectory.

gym-hil's ``InputsControlWrapper`` executes the person's action while the intervention key is toggled and
reports ``is_intervention`` / ``teleop_action``. The keyboard listener runs on pynput's ``dummy`` backend (no
display); the test toggles the controller's intervention state as its key handler does.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

# Read when MuJoCo's renderer module and pynput are first imported (gym-hil imports them): set before.
os.environ.setdefault("MUJOCO_GL", "egl")  # the env builds an offscreen renderer
os.environ.setdefault("PYNPUT_BACKEND", "dummy")  # the keyboard listener without a display
pytest.importorskip("gym_hil", reason='needs gym-hil: pip install "rlinf-envs[hil]"')

import gymnasium as gym
import torch._dynamo  # noqa: F401  (Triton's LLVM before Mesa's: loaded after MuJoCo's EGL context it segfaults)
from rlinf_envs._worker import _executed
from rlinf_envs.gymnasium import GymnasiumVecEnv

ENV_ID = "rlinf_test/HilPickCubeKeyboardFlat-v0"


def _flat_keyboard_pick_cube(**kwargs: Any) -> gym.Env[Any, Any]:
    env = gym.make(
        "gym_hil/PandaPickCube-v0",
        use_inputs_control=True,
        use_gamepad=False,
        use_viewer=False,
        reset_delay_seconds=0.0,
        **kwargs,
    )
    return gym.wrappers.FlattenObservation(env)


@pytest.fixture
def hil_env() -> Iterator[GymnasiumVecEnv]:
    import mujoco

    backend = mujoco.gl_context.GLContext.__module__
    if backend.startswith("mujoco.glfw"):  # imported before this module set MUJOCO_GL: no offscreen renderer
        pytest.skip(
            f"MuJoCo's GL backend is {backend} (MUJOCO_GL was not egl or osmesa when mujoco was first imported)"
        )
    if ENV_ID not in gym.registry:
        gym.register(ENV_ID, entry_point=_flat_keyboard_pick_cube, max_episode_steps=100)
    env = GymnasiumVecEnv(ENV_ID, 2)
    try:
        yield env
    finally:
        env.close()


def _controller(env: GymnasiumVecEnv, i: int) -> Any:
    inner = env._envs[i]
    while not hasattr(inner, "controller"):
        inner = inner.env
    return inner.controller


# pynput's dummy backend has no listener: its thread ends with NotImplementedError (the state is set directly).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_keyboard_takeover_is_reported_with_the_humans_action(hil_env: GymnasiumVecEnv) -> None:
    hil_env.reset(seed=0)
    policy = np.full((2, 3, 4), 0.5, dtype=np.float32)
    res = hil_env.chunk_step(policy)
    assert res.interventions is not None and not res.interventions.any()
    assert res.intervention_actions is not None
    np.testing.assert_array_equal(res.intervention_actions, policy)
    _controller(hil_env, 1).key_states["intervention"] = True  # the space bar on env 1's keyboard
    res = hil_env.chunk_step(policy)
    assert res.interventions is not None and res.intervention_actions is not None
    assert res.interventions.tolist() == [[False] * 3, [True] * 3]
    np.testing.assert_array_equal(res.intervention_actions[0], policy[0])
    # No movement key held: the human's action is "stay, gripper unchanged" (gym-hil's keyboard mapping).
    np.testing.assert_array_equal(res.intervention_actions[1], np.tile([0.0, 0.0, 0.0, 1.0], (3, 1)))
    actions, flags = _executed(policy, None, res)
    assert flags is not None and flags.tolist() == res.interventions.tolist()
    np.testing.assert_array_equal(actions[1], res.intervention_actions[1])
    np.testing.assert_array_equal(actions[0], policy[0])


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_humans_chunks_become_the_learners_labels(hil_env: GymnasiumVecEnv) -> None:
    """gym-hil's takeovers, recorded as the env worker does, aggregated by the HG-DAgger trainer."""
    import torch
    from rlinf_core.config import AlgorithmConfig, ReplayBufferConfig
    from rlinf_models import EmbodiedActorConfig, ExpertConfig
    from rlinf_models.offpolicy import DAggerTrainer
    from rlinf_models.policies import PolicyConfig, SquashedGaussianPolicy

    model = PolicyConfig(hidden_sizes=(16,), add_value_head=False, add_q_head=True, num_action_chunks=2)
    actor = EmbodiedActorConfig(
        model=model,
        expert=ExpertConfig(gating="intervention", obs_key=None),
        global_batch_size=4,
        micro_batch_size=4,
    )
    alg = AlgorithmConfig(
        loss_type="embodied_dagger",
        adv_type="embodied_dagger",
        update_epoch=2,
        replay_buffer=ReplayBufferConfig(cache_size=16, min_buffer_size=1),
    )
    trainer = DAggerTrainer(SquashedGaussianPolicy(hil_env.spec, model), hil_env.spec, actor, alg)
    obs = hil_env.reset(seed=0)
    policy = np.full((2, 2, 4), 0.5, dtype=np.float32)
    rec: dict[str, list[np.ndarray]] = {"obs": [], "actions": [], "interventions": [], "dones": []}
    rec["dones"].append(np.zeros((2, 2), dtype=bool))
    for t in range(3):
        _controller(hil_env, 0).key_states["intervention"] = t == 1  # env 0's person takes over for chunk 1
        res = hil_env.chunk_step(policy)
        actions, flags = _executed(policy, None, res)
        assert flags is not None
        for key, value in (
            ("obs", obs),
            ("actions", actions),
            ("interventions", flags),
            ("dones", res.dones),
        ):
            rec[key].append(value)
        obs = res.obs
    traj = {k: torch.from_numpy(np.stack(v)) for k, v in rec.items()}
    assert trainer.add_trajectory(traj) == 6
    assert len(trainer.buffer) == 1  # one chunk of one env was the human's
    stored = trainer.buffer.contents()
    torch.testing.assert_close(stored["obs"][0], traj["obs"][1, 0])
    # The human's "stay, gripper unchanged" [0, 0, 0, 1] normalised over the bounds [-1, -1, -1, 0]..[1, 1, 1, 2].
    torch.testing.assert_close(stored["expert_actions"][0], torch.zeros(2, 4))
    metrics = trainer.update(2)
    assert (
        metrics["hgdagger/intervention_rate"] == pytest.approx(2 / 12) and metrics["hgdagger/takeovers"] == 1
    )
    assert metrics["dagger/num_updates"] == 2 and metrics["hgdagger/discrepancy"] > 0
