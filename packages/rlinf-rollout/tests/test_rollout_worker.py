from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import cloudpickle
import numpy as np
import pytest
import torch
from rlinf_core.protocols import EnvSpec
from rlinf_models.policies import PolicyConfig, build_policy
from rlinf_rollout import EmbodiedRolloutConfig

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPEC = EnvSpec((4,), "discrete", 1, num_actions=3)
MODEL = PolicyConfig(hidden_sizes=(8,))


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="pipeline_stage_num"):
        EmbodiedRolloutConfig(pipeline_stage_num=0)
    with pytest.raises(ValueError, match="recv_timeout_s"):
        EmbodiedRolloutConfig(recv_timeout_s=0)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    from rlinf_scheduler import Cluster

    c = Cluster(num_nodes=1, ray_address="local", num_cpus=2, interrupt_main_on_failure=False)
    try:
        yield c
    finally:
        c.shutdown()


def _workers() -> tuple[type, type]:
    from rlinf_scheduler import Worker

    class Trainer(Worker):
        """Actor stand-in: owns the reference policy and broadcasts its weights."""

        def __init__(self, seed: int) -> None:
            torch.manual_seed(seed)
            self.policy = build_policy(SPEC, MODEL)

        def push(self, rollout_group: str, version: int) -> None:
            msg = {"version": version, "state_dict": self.policy.state_dict()}
            self.broadcast(
                msg, [(self.group_name, 0), (rollout_group, range(1))], src=(self.group_name, 0), timeout=60
            )

        def expected(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            out = self.policy.act(torch.as_tensor(obs), deterministic=True)
            return out.actions.numpy(), out.values.numpy()

    class EnvStandIn(Worker):
        """Env stand-in: sends one observation request, then the end marker, for one stage."""

        def request(self, rollout_group: str, obs: np.ndarray) -> dict[str, Any]:
            self.send({"obs": obs, "final_obs": None}, rollout_group, 0)
            reply = self.recv(rollout_group, 0, timeout=60)
            self.send({"end": True}, rollout_group, 0)
            return reply

    return Trainer, EnvStandIn


@pytest.mark.ray
def test_weights_from_the_actor_drive_the_served_actions(cluster: Any) -> None:
    from rlinf_rollout import EmbodiedRolloutWorker
    from rlinf_scheduler import NodePlacementStrategy

    trainer_cls, env_cls = _workers()
    on_node0 = NodePlacementStrategy([0])
    trainer = trainer_cls.create_group(123).launch(cluster, on_node0, name="trainer")
    env = env_cls.create_group().launch(cluster, on_node0, name="envs")
    rollout = EmbodiedRolloutWorker.create_group(
        EmbodiedRolloutConfig(), MODEL, SPEC, train_num_envs=6, eval_num_envs=6
    ).launch(cluster, on_node0, name="rollout")
    assert rollout.get_model_version().wait(timeout=60) == [-1]
    syncing = rollout.sync_model_from_actor("trainer")
    trainer.push("rollout", 5).wait(timeout=60)
    assert syncing.wait(timeout=60) == [5]
    assert rollout.get_model_version().wait(timeout=60) == [5]

    obs = np.random.default_rng(0).standard_normal((6, 4)).astype(np.float32)
    served = rollout.generate("envs", "eval")
    (reply,) = env.request("rollout", obs).wait(timeout=60)
    assert served.wait(timeout=60) == [1]
    actions, values = trainer.expected(obs).wait(timeout=60)[0]
    np.testing.assert_array_equal(
        reply["actions"], actions
    )  # eval is deterministic: same weights, same actions
    np.testing.assert_allclose(reply["values"], values, rtol=1e-6)
    assert reply["logprobs"].shape == (6, 1) and reply["stage"] == 0
    for group in (trainer, env, rollout):
        group.shutdown()
