"""EmbodiedActorWorker on Ray: 1 rank (plain module) vs 2 ranks (FSDP2 on gloo), weight sync, checkpoint round trip."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_core.protocols import EnvSpec
from rlinf_models import EmbodiedActorConfig, EmbodiedActorWorker, OptimConfig
from rlinf_models.policies import PolicyConfig, build_policy
from rlinf_scheduler import Channel, Cluster, PackedPlacementStrategy, Worker, WorkerGroup

pytestmark = pytest.mark.ray

cloudpickle.register_pickle_by_value(sys.modules[__name__])

SPEC = EnvSpec((3,), "discrete", 1, num_actions=2)
MODEL = PolicyConfig(hidden_sizes=(16, 16))
ALGO = AlgorithmConfig(update_epoch=2, normalize_advantages=True)
T, E_PER_MSG, N_MSG = 8, 4, 2  # two env messages of 4 envs: 64 samples, 4 mini-batches of 16 per epoch


def _actor_cfg(seed: int = 7, threads: int | None = None) -> EmbodiedActorConfig:
    return EmbodiedActorConfig(
        model=MODEL,
        optim=OptimConfig(lr=1e-2),
        global_batch_size=16,
        micro_batch_size=4,
        seed=seed,
        torch_num_threads=threads,
    )


class ThreadProbeActor(EmbodiedActorWorker):
    """The actor, plus a look at the torch thread count its process ended up with."""

    def torch_threads(self) -> int:
        return torch.get_num_threads()


def _messages(seed: int) -> list[dict[str, Any]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for m in range(N_MSG):
        dones = torch.rand(T + 1, E_PER_MSG, 1, generator=g) < 0.15
        dones[0] = False
        out.append(
            {
                "env_offset": m * E_PER_MSG,
                "obs": torch.randn(T, E_PER_MSG, 3, generator=g),
                "actions": torch.randint(0, 2, (T, E_PER_MSG, 1), generator=g),
                "rewards": torch.rand(T, E_PER_MSG, 1, generator=g),
                "dones": dones,
                "prev_logprobs": -0.69 + 0.05 * torch.randn(T, E_PER_MSG, 1, generator=g),
                "prev_values": torch.randn(T + 1, E_PER_MSG, 1, generator=g),
            }
        )
    return out


class StandInRollout(Worker):
    """The rollout side of the weight-sync contract (what EmbodiedRolloutWorker.sync_model_from_actor does)."""

    def __init__(self) -> None:
        self.policy = build_policy(SPEC, MODEL)
        self.version = -1

    def sync_model_from_actor(self, actor_group_name: str) -> dict[str, Any]:
        msg = self.broadcast(
            None,
            groups=[(actor_group_name, 0), (self.group_name, list(range(self.world_size)))],
            src=(actor_group_name, 0),
            timeout=120,
        )
        self.policy.load_state_dict(msg["state_dict"])
        self.version = msg["version"]
        return {"version": self.version, "state": {k: v.clone() for k, v in self.policy.state_dict().items()}}


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Cluster, dict[str, WorkerGroup]]]:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with Cluster(num_nodes=1, simulated_accelerators_per_node=4, interrupt_main_on_failure=False) as c:
            groups = {
                "act1": EmbodiedActorWorker.create_group(_actor_cfg(), ALGO, SPEC).launch(
                    c, PackedPlacementStrategy(0, 0), name="act1"
                ),
                "act2": EmbodiedActorWorker.create_group(_actor_cfg(), ALGO, SPEC).launch(
                    c, PackedPlacementStrategy(0, 1), name="act2"
                ),
                # Another seed: a resumed actor must take everything (weights, generator) from the checkpoint.
                "act3": ThreadProbeActor.create_group(_actor_cfg(seed=99, threads=3), ALGO, SPEC).launch(
                    c, PackedPlacementStrategy(2, 3), name="act3"
                ),
                "ro": StandInRollout.create_group().launch(c, PackedPlacementStrategy(2, 3), name="ro"),
            }
            # Seven worker processes start at once: minutes on a loaded 2-core box, not the tests' call timeouts.
            for group in groups.values():
                group.wait_ready(timeout=300)
            yield c, groups
    finally:
        ray.shutdown()


def _feed(name: str, seed: int, ranks: int) -> Channel:
    ch = Channel.create(name)
    for msg in reversed(_messages(seed)):  # out of order: the actor sorts by env_offset
        for rank in range(ranks):  # as the env workers do: one copy per actor rank, keyed by rank
            ch.put(msg, key=rank)
    return ch


def _step(actor: WorkerGroup, name: str, seed: int) -> tuple[list[int], dict[str, float], dict[str, float]]:
    channel = _feed(name, seed, actor.world_size)
    sizes = actor.recv_rollout_batch(channel, N_MSG, 60).wait(timeout=120)
    adv = actor.compute_advantages_and_returns().wait(timeout=120)
    train = actor.run_training().wait(timeout=120)
    assert all(a == adv[0] for a in adv) and all(m == train[0] for m in train)  # global on every rank
    return sizes, adv[0], train[0]


def _sync(actor: WorkerGroup, ro: WorkerGroup) -> tuple[int, dict[str, torch.Tensor]]:
    sent = actor.sync_model_to_rollout("ro")
    got = ro.sync_model_from_actor(actor.name).wait(timeout=120)
    versions = sent.wait(timeout=120)
    assert all(v == versions[0] for v in versions)
    assert [g["version"] for g in got] == [versions[0]] * len(got)
    for key, val in got[1]["state"].items():  # every rollout rank got the same weights
        assert torch.equal(val, got[0]["state"][key]), key
    return versions[0], got[0]["state"]


def _assert_states_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], **tol: float) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=lambda m, k=key: f"{k}: {m}", **tol)


def test_two_fsdp_ranks_make_the_same_update_as_one(
    cluster: tuple[Cluster, dict[str, WorkerGroup]],
) -> None:
    _, g = cluster
    ro = g["ro"]
    v1, init1 = _sync(g["act1"], ro)
    v2, init2 = _sync(g["act2"], ro)
    assert v1 == v2 == 0
    _assert_states_close(init1, init2, rtol=0, atol=0)  # same seed → same initial weights
    assert set(init1) == set(build_policy(SPEC, MODEL).state_dict())

    sizes1, adv1, train1 = _step(g["act1"], "traj-a1", seed=1)
    sizes2, adv2, train2 = _step(g["act2"], "traj-a2", seed=1)
    assert sizes1 == [T * E_PER_MSG * N_MSG] and sizes2 == [T * E_PER_MSG, T * E_PER_MSG]
    assert adv1.keys() == adv2.keys() and abs(adv1["rollout/advantages"]) < 1e-5  # normalised over ALL ranks
    for key in adv1:
        assert adv2[key] == pytest.approx(adv1[key], abs=1e-6), key
    assert train1.keys() == train2.keys()
    for key in train1:
        assert train2[key] == pytest.approx(train1[key], rel=1e-4, abs=1e-6), key

    v1, after1 = _sync(g["act1"], ro)
    v2, after2 = _sync(g["act2"], ro)
    assert v1 == v2 == 1
    assert g["act2"].get_model_version().wait(timeout=60) == [1, 1]
    assert any(not torch.equal(after1[k], init1[k]) for k in init1)  # the update did something
    _assert_states_close(after1, after2, rtol=1e-5, atol=1e-6)


def test_checkpoint_round_trip_continues_exactly(
    cluster: tuple[Cluster, dict[str, WorkerGroup]], tmp_path: Path
) -> None:
    _, g = cluster
    ro = g["ro"]
    a2, a3, a1 = g["act2"], g["act3"], g["act1"]
    if a2.get_model_version().wait(timeout=60)[0] == 0:  # also runs alone (-k): one step first
        _step(a2, "traj-ck0", seed=1)
    ckpt = tmp_path / "global_step_1"
    a2.save_checkpoint(str(ckpt)).wait(timeout=120)
    files = sorted(p.name for p in (ckpt / "actor").iterdir())
    assert files == ["model.pt", "optimizer.pt", "rng_rank0.pkl", "rng_rank1.pkl", "trainer.pt"]

    # Uninterrupted: the next step of the run that saved.
    _, adv_a, train_a = _step(a2, "traj-ck-a", seed=2)
    va, state_a = _sync(a2, ro)

    # Resumed: a fresh actor group (other seed) loads the checkpoint and makes the same step.
    a3.load_checkpoint(str(ckpt)).wait(timeout=120)
    assert a3.get_model_version().wait(timeout=60) == [va - 1, va - 1]
    _, adv_b, train_b = _step(a3, "traj-ck-b", seed=2)
    vb, state_b = _sync(a3, ro)
    assert va == vb
    assert adv_a == adv_b and train_a == train_b
    _assert_states_close(state_a, state_b, rtol=0, atol=0)  # bit for bit

    # The full-state checkpoint also loads at another world size (1 rank), same update within float tolerance.
    a1.load_checkpoint(str(ckpt)).wait(timeout=120)
    _, _, train_c = _step(a1, "traj-ck-c", seed=2)
    vc, state_c = _sync(a1, ro)
    assert vc == va
    assert train_c["actor/policy_loss"] == pytest.approx(train_a["actor/policy_loss"], rel=1e-4, abs=1e-6)
    _assert_states_close(state_a, state_c, rtol=1e-5, atol=1e-6)


def test_torch_num_threads_is_set_in_each_actor_process(
    cluster: tuple[Cluster, dict[str, WorkerGroup]],
) -> None:
    # act3 has actor.torch_num_threads=3 (more than the 2 CPUs Ray was given: the setting, not a default)
    assert cluster[1]["act3"].torch_threads().wait(timeout=120) == [3, 3]
