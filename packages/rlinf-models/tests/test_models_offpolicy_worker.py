"""OffPolicyActorWorker on Ray: 1 rank vs 2 ranks (FSDP2 on gloo) make the same SAC steps; checkpoints move."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch
from rlinf_core.config import AlgorithmConfig, ReplayBufferConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig, OptimConfig
from rlinf_models._fsdp import full_model_state_dict
from rlinf_models.offpolicy import OffPolicyActorWorker
from rlinf_models.policies import PolicyConfig
from rlinf_scheduler import Channel, Cluster, PackedPlacementStrategy, WorkerGroup

pytestmark = pytest.mark.ray

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPEC = EnvSpec((5,), "continuous", 2, action_low=(-1.0, -2.0), action_high=(1.0, 2.0))
MODEL = PolicyConfig(
    hidden_sizes=(32, 32), add_value_head=False, add_q_head=True, num_q_heads=4, q_layer_norm=True
)
# RLPD-like: a head subset in the target, the actor on the mean of the heads, 3 gradient steps per call.
ALGO = AlgorithmConfig(
    loss_type="embodied_sac",
    adv_type="embodied_sac",
    replay_buffer=ReplayBufferConfig(cache_size=512, min_buffer_size=16, seed=5),
    critic_subsample_size=2,
    actor_agg_q="mean",
    update_epoch=3,
    utd_ratio=None,
)
T, E = 6, 4  # one trajectory message: 6 steps of 4 envs


def _actor_cfg(seed: int = 3) -> EmbodiedActorConfig:
    return EmbodiedActorConfig(
        model=MODEL,
        optim=OptimConfig(lr=3e-3, clip_grad=1.0),
        global_batch_size=16,
        micro_batch_size=16,
        seed=seed,
    )


class Probe(OffPolicyActorWorker):
    """The worker, plus a look at its full state (collective under FSDP2)."""

    def states(self) -> dict[str, Any]:
        critic = self.trainer.critic_state_dict()
        return {
            "policy": full_model_state_dict(self.policy),
            "critic": critic["critic"],
            "target": critic["target_critic"],
            "alpha": critic["alpha_param"],
        }


def _trajectory(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "obs": torch.randn(T, E, 5, generator=g),
        "next_obs": torch.randn(T, E, 5, generator=g),
        "actions": torch.rand(T, E, 1, 2, generator=g) * torch.tensor([2.0, 4.0]) - torch.tensor([1.0, 2.0]),
        "rewards": torch.randn(T, E, 1, generator=g),
        "terminations": torch.rand(T, E, 1, generator=g) < 0.1,
        # the rest of an env message (the PPO fields; the off-policy actor ignores them)
        "dones": torch.zeros(T + 1, E, 1, dtype=torch.bool),
        "prev_logprobs": torch.zeros(T, E, 1, 2),
        "prev_values": torch.zeros(T + 1, E, 1),
    }


@pytest.fixture(scope="module")
def groups() -> Iterator[dict[str, WorkerGroup]]:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with Cluster(num_nodes=1, simulated_accelerators_per_node=4, interrupt_main_on_failure=False) as c:
            groups = {
                "one": Probe.create_group(_actor_cfg(), ALGO, SPEC).launch(
                    c, PackedPlacementStrategy(0, 0), name="one"
                ),
                "two": Probe.create_group(_actor_cfg(), ALGO, SPEC).launch(
                    c, PackedPlacementStrategy(1, 2), name="two"
                ),
                # another seed: a loaded checkpoint must replace everything
                "other": Probe.create_group(_actor_cfg(seed=77), ALGO, SPEC).launch(
                    c, PackedPlacementStrategy(3, 3), name="other"
                ),
            }
            # Four worker processes start at once: minutes on a loaded 2-core box, not the tests' call timeouts.
            for group in groups.values():
                group.wait_ready(timeout=300)
            yield groups
    finally:
        ray.shutdown()


def _feed(actor: WorkerGroup, name: str, seed: int) -> None:
    channel = Channel.create(name)
    for rank in range(actor.world_size):  # as the env workers do: one copy per actor rank, keyed by rank
        channel.put(_trajectory(seed), key=rank)
    assert actor.recv_rollout_batch(channel, 1, 60).wait(timeout=120) == [T * E] * actor.world_size


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=lambda m, k=key: f"{k}: {m}", **tol)


def test_two_fsdp_ranks_make_the_same_sac_steps_as_one(
    groups: dict[str, WorkerGroup], tmp_path: Path
) -> None:
    one, two = groups["one"], groups["two"]
    start1, start2 = one.states().wait(timeout=120)[0], two.states().wait(timeout=120)[0]
    _assert_close(start1["policy"], start2["policy"], rtol=0, atol=0)  # same seed, same weights
    for step in range(3):
        _feed(one, f"one{step}", seed=step)
        _feed(two, f"two{step}", seed=step)
        m1 = one.run_training().wait(timeout=120)[0]
        m2 = two.run_training().wait(timeout=120)
        assert m2[0] == m2[1]  # every rank reports the batch's means
        assert m1["sac/num_updates"] == m2[0]["sac/num_updates"] == 3.0
        for key in m1:
            assert m2[0][key] == pytest.approx(m1[key], rel=1e-4, abs=1e-5), key
    s1, s2 = one.states().wait(timeout=120)[0], two.states().wait(timeout=120)[0]
    for part in ("policy", "critic", "target"):
        _assert_close(s1[part], s2[part], rtol=1e-4, atol=1e-5)
        assert any(not torch.equal(s1[part][k], start1[part][k]) for k in s1[part]), part  # they trained
    torch.testing.assert_close(s1["alpha"], s2["alpha"], rtol=1e-4, atol=1e-6)
    assert not torch.equal(s1["alpha"], start1["alpha"])

    # A 2-rank checkpoint loads into a 1-rank group (and back): the same state, and the next steps agree.
    two.save_checkpoint(str(tmp_path / "ck")).wait(timeout=120)
    other = groups["other"]
    other.load_checkpoint(str(tmp_path / "ck")).wait(timeout=120)
    loaded = other.states().wait(timeout=120)[0]
    for part in ("policy", "critic", "target"):
        _assert_close(loaded[part], s2[part], rtol=0, atol=0)
    _feed(other, "other3", seed=3)
    _feed(two, "two3", seed=3)
    mo, mt = other.run_training().wait(timeout=120)[0], two.run_training().wait(timeout=120)[0]
    for key in mo:
        assert mt[key] == pytest.approx(mo[key], rel=1e-4, abs=1e-5), key
