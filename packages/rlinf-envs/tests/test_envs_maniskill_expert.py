"""The scripted ManiSkill experts (demonstrations for RLPD) and the control-mode check before any env is built."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("mani_skill", reason='needs the ManiSkill extra: pip install "rlinf-envs[maniskill]"')

from rlinf_envs import EnvConfig, VecEnvConfig, env_config_problems
from rlinf_envs.maniskill import ManiSkillVecEnv, scripted_expert, supported_control_modes

# ManiSkill 3.0.1 calls np.isnan on torch tensors (NumPy 2 deprecation), once per step.
pytestmark = pytest.mark.filterwarnings("ignore:__array_wrap__ must accept context:DeprecationWarning")


@pytest.mark.usefixtures("vulkan")
def test_pickcube_expert_solves_most_seeds() -> None:
    env = ManiSkillVecEnv(
        "PickCube-v1", 4, control_mode="pd_ee_delta_pos", ignore_terminations=True, max_episode_steps=50
    )
    expert = scripted_expert("PickCube-v1", "pd_ee_delta_pos")
    try:
        tasks = env.task_envs()
        env.reset(seed=123)
        successes: list[bool] = []
        for _ in range(50):
            actions = np.stack([expert(task) for task in tasks])
            assert actions.shape == (4, 4) and np.abs(actions).max() <= 1.0
            successes += env.chunk_step(actions[:, None]).episodes.successes
    finally:
        env.close()
    assert len(successes) == 4 and sum(successes) >= 3, successes


def test_scripted_expert_lookup_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="no scripted expert for 'PickCube-v1' with control_mode None"):
        scripted_expert("PickCube-v1", None)
    with pytest.raises(ValueError, match="PickCube-v1 with control_mode pd_ee_delta_pos"):
        scripted_expert("PushCube-v1", "pd_ee_delta_pos")


def test_control_mode_is_checked_before_any_env_is_built() -> None:
    modes = supported_control_modes("PickCube-v1")
    assert modes is not None and {"pd_ee_delta_pos", "pd_joint_delta_pos"} <= set(modes)
    assert supported_control_modes("NoSuchTask-v0") is None
    good = VecEnvConfig(env_type="maniskill", env_id="PickCube-v1", control_mode="pd_ee_delta_pos")
    bad = VecEnvConfig(env_type="maniskill", env_id="PickCube-v1", control_mode="pd_ee_delta_posx")
    assert env_config_problems(EnvConfig(train=good, eval=good)) == []
    (problem,) = env_config_problems(EnvConfig(train=good, eval=bad))
    assert problem.startswith("env.eval.control_mode: 'pd_ee_delta_posx' is not a controller of PickCube-v1")
    assert "pd_ee_delta_pos, pd_ee_delta_pose" in problem
