from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from rlinf_core.config import AlgorithmConfig
from rlinf_envs import EnvConfig, VecEnvConfig, make_vec_env
from rlinf_envs.gymnasium import GymnasiumVecEnv
from rlinf_models.policies import PolicyConfig, build_policy


def test_make_vec_env_picks_the_backend() -> None:
    env = make_vec_env(VecEnvConfig(env_id="CartPole-v1", total_num_envs=4, group_size=2), 2)
    assert isinstance(env, GymnasiumVecEnv) and env.num_envs == 2 and env.group_size == 2
    env.close()
    with pytest.raises(ValueError, match="multiple of group_size"):
        VecEnvConfig(total_num_envs=3, group_size=2)


# ----------------------------------------------------------------------------------- through Ray workers


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    os.environ["RAY_ENABLE_UV_RUN_RUNTIME_ENV"] = "0"
    from rlinf_scheduler import Cluster

    c = Cluster(
        num_nodes=1,
        simulated_accelerators_per_node=2,
        ray_address="local",
        num_cpus=2,
        interrupt_main_on_failure=False,
    )
    try:
        yield c
    finally:
        c.shutdown()


def _weights_source() -> type:
    from rlinf_scheduler import Worker

    class WeightSource(Worker):
        """Actor-side counterpart of the rollout's weight sync and the trajectory channel (test stand-in)."""

        def __init__(self, spec: Any, model: PolicyConfig, rollout_ws: int) -> None:
            torch.manual_seed(0)
            self.policy = build_policy(spec, model)
            self.rollout_ws = rollout_ws

        def sync_model_to_rollout(self, rollout_group: str) -> None:
            msg = {"version": 7, "state_dict": self.policy.state_dict()}
            groups = [(self.group_name, 0), (rollout_group, range(self.rollout_ws))]
            self.broadcast(msg, groups, src=(self.group_name, 0), timeout=60)

        def take(self, channel: Any, n: int) -> list[dict[str, Any]]:
            return [
                {
                    k: v.clone() if isinstance(v, torch.Tensor) else v
                    for k, v in channel.get(key=self.rank, timeout=60).items()
                }
                for _ in range(n)
            ]

    return WeightSource


@pytest.mark.ray
@pytest.mark.parametrize(("stages", "rollout_ws"), [(1, 1), (2, 2)])
def test_env_and_rollout_exchange_a_trajectory(cluster: Any, stages: int, rollout_ws: int) -> None:
    from rlinf_envs import EnvWorker
    from rlinf_rollout import EmbodiedRolloutConfig, EmbodiedRolloutWorker
    from rlinf_scheduler import Channel, PackedPlacementStrategy

    tag = f"{stages}{rollout_ws}"
    cfg = EnvConfig(
        train=VecEnvConfig(
            env_id="CartPole-v1", total_num_envs=8, max_steps_per_rollout_epoch=6, max_episode_steps=4
        ),
        eval=VecEnvConfig(
            env_id="CartPole-v1",
            total_num_envs=4,
            max_steps_per_rollout_epoch=300,
            max_episode_steps=300,
            auto_reset=False,
        ),
    )
    alg = AlgorithmConfig(gamma=0.5, rollout_epoch=2, eval_rollout_epoch=stages)
    env = EnvWorker.create_group(cfg, alg, stages, rollout_world_size=rollout_ws).launch(
        cluster, PackedPlacementStrategy(0, 0), name=f"env{tag}"
    )
    spec = env.get_spec().wait(timeout=120)[0]
    model = PolicyConfig(hidden_sizes=(8,))
    rollout = EmbodiedRolloutWorker.create_group(
        EmbodiedRolloutConfig(pipeline_stage_num=stages), model, spec, train_num_envs=8, eval_num_envs=4
    ).launch(cluster, PackedPlacementStrategy(0, rollout_ws - 1), name=f"rollout{tag}")
    source = (
        _weights_source()
        .create_group(spec, model, rollout_ws)
        .launch(cluster, PackedPlacementStrategy(1, 1), name=f"actor{tag}")
    )
    sync = rollout.sync_model_from_actor(f"actor{tag}")
    source.sync_model_to_rollout(f"rollout{tag}").wait(timeout=120)
    assert sync.wait(timeout=120) == [7] * rollout_ws

    channel = Channel.create(f"traj{tag}")
    serve = rollout.generate(f"env{tag}", "train")
    stats = env.interact(f"rollout{tag}", channel, 1).wait(timeout=120)[0]
    assert sum(serve.wait(timeout=60)) > 0
    trajs = source.take(channel, 2).wait(timeout=60)[0]
    assert stats["env_steps"] == 2 * 6 * 8
    # Time limit 4: every env finished its first episode by step 4 (reward 4 each, minus failures).
    assert len(stats["returns"]) >= 8 and all(0 < r <= 4 for r in stats["returns"])
    first, second = trajs
    assert (first["env_offset"], first["rollout_epoch"], second["rollout_epoch"]) == (0, 0, 1)
    assert first["obs"].shape == (6, 8, 4) and first["obs"].dtype == torch.float32
    assert first["actions"].shape == (6, 8, 1) and first["rewards"].shape == (6, 8, 1)
    assert first["dones"].shape == (7, 8, 1) and first["dones"].dtype == torch.bool
    assert first["prev_logprobs"].shape == (6, 8, 1) and first["prev_values"].shape == (7, 8, 1)
    assert not first["dones"][0].any()  # nothing ended before the first rollout
    torch.testing.assert_close(second["dones"][0], first["dones"][-1])  # carried into the next epoch
    # The rollout policy is the source's: its values/logprobs match a local copy with the same weights.
    torch.manual_seed(0)
    local = build_policy(spec, model)
    with torch.no_grad():
        torch.testing.assert_close(local.value(first["obs"][0]), first["prev_values"][0], atol=1e-5, rtol=0)
        lp, _, _ = local.evaluate(first["obs"][0], first["actions"][0])
        torch.testing.assert_close(lp.reshape(8, 1), first["prev_logprobs"][0], atol=1e-5, rtol=0)
    # A chunk cut by the time limit gets γ·V(final obs) added to its reward (bootstrap_type standard).
    rewards = first["rewards"][..., 0]
    truncated_or_done = first["dones"][1:, :, 0]
    assert torch.all(rewards[~truncated_or_done] == 1.0)
    assert torch.any(rewards[truncated_or_done] != 1.0)

    serve = rollout.generate(f"env{tag}", "eval")
    result = env.evaluate(f"rollout{tag}", None, channel, "progress").wait(timeout=120)[0]
    serve.wait(timeout=60)
    # One episode per eval env and round (no auto-reset), each ended by failure or the time limit.
    assert len(result["returns"]) == 4 * stages and all(0 < r <= 300 for r in result["returns"])
    # Progress reports: at least one per round, counting up to every round's chunk steps and episodes.
    reports = []
    while not channel.empty(key="progress"):
        reports.append(channel.get_nowait(key="progress"))
    assert len(reports) >= stages and all(r["rank"] == 0 and r["total"] == stages * 300 for r in reports)
    assert [r["done"] for r in reports] == sorted(r["done"] for r in reports)
    assert (reports[-1]["done"], reports[-1]["episodes"]) == (stages * 300, 4 * stages)
    if stages == 2:  # the second round starts from the next seeds: other initial states, other episodes
        assert sorted(result["lengths"][:4]) != sorted(result["lengths"][4:])
    channel.shutdown()
    for group in (env, rollout, source):
        group.shutdown()


def test_env_worker_rejects_uneven_split() -> None:
    from rlinf_envs._worker import split_envs

    with pytest.raises(ValueError, match=r"env.train.total_num_envs \(6\) must be a multiple of env ranks"):
        split_envs(VecEnvConfig(total_num_envs=6), 2, 2, "env.train")
    assert split_envs(VecEnvConfig(total_num_envs=8), 2, 2, "env.train") == 2


@pytest.mark.ray
def test_grpo_rollouts_reset_groups_and_mask_after_the_episode(cluster: Any) -> None:
    from rlinf_envs import EnvWorker
    from rlinf_rollout import EmbodiedRolloutConfig, EmbodiedRolloutWorker
    from rlinf_scheduler import Channel, PackedPlacementStrategy

    split = VecEnvConfig(
        env_id="CartPole-v1", total_num_envs=4, group_size=2, auto_reset=False, max_steps_per_rollout_epoch=12
    )
    cfg = EnvConfig(train=split, eval=split)
    alg = AlgorithmConfig(adv_type="grpo", loss_type="actor", group_size=2, rollout_epoch=2)
    env = EnvWorker.create_group(cfg, alg, 1).launch(cluster, PackedPlacementStrategy(0, 0), name="envg")
    spec = env.get_spec().wait(timeout=120)[0]
    model = PolicyConfig(hidden_sizes=(8,), add_value_head=False)
    rollout = EmbodiedRolloutWorker.create_group(
        EmbodiedRolloutConfig(), model, spec, train_num_envs=4, eval_num_envs=4
    ).launch(cluster, PackedPlacementStrategy(0, 0), name="rolloutg")
    source = (
        _weights_source()
        .create_group(spec, model, 1)
        .launch(cluster, PackedPlacementStrategy(1, 1), name="actorg")
    )
    sync = rollout.sync_model_from_actor("actorg")
    source.sync_model_to_rollout("rolloutg").wait(timeout=120)
    sync.wait(timeout=120)
    channel = Channel.create("trajg")
    serve = rollout.generate("envg", "train")
    env.interact("rolloutg", channel, 1).wait(timeout=120)
    serve.wait(timeout=60)
    first, second = source.take(channel, 2).wait(timeout=60)[0]
    for traj in (first, second):
        obs, dones, mask = traj["obs"], traj["dones"][..., 0], traj["loss_mask"][..., 0]
        assert not dones[0].any()  # every rollout starts fresh episodes
        torch.testing.assert_close(obs[0, 0], obs[0, 1])  # groups of 2 share their initial state
        assert not torch.equal(obs[0, 0], obs[0, 2])
        ended = dones[1:].cumsum(0) > 0
        # A step counts until and including the one that ends the episode; padding after it does not.
        expected = torch.cat([torch.ones(1, 4, dtype=torch.bool), ~ended[:-1]])
        assert torch.equal(mask, expected)
        assert torch.equal(traj["loss_mask_sum"][0, :, 0], mask.sum(0))
    assert not torch.equal(first["obs"][0], second["obs"][0])  # new initial states for the next rollout
    channel.shutdown()
    for group in (env, rollout, source):
        group.shutdown()


@pytest.mark.ray
@pytest.mark.parametrize("grpo", [False, True])
def test_checkpointed_env_and_rollout_state_replays_the_next_rollout(
    cluster: Any, tmp_path: Any, grpo: bool
) -> None:
    """After load_checkpoint, env and rollout ranks produce bit-identical trajectories to those that followed the save.

    PPO: episodes in progress across the save (auto-reset, time limit 5 inside 6-step rollouts) and the sampled
    actions. GRPO (no auto-reset): the reset counter that seeds each rollout's fresh episodes.
    """
    from rlinf_envs import EnvWorker
    from rlinf_rollout import EmbodiedRolloutConfig, EmbodiedRolloutWorker
    from rlinf_scheduler import Channel, PackedPlacementStrategy

    tag = f"ck{int(grpo)}"
    split = VecEnvConfig(
        env_id="CartPole-v1",
        total_num_envs=4,
        group_size=2 if grpo else 1,
        auto_reset=not grpo,
        max_steps_per_rollout_epoch=6,
        max_episode_steps=5 if not grpo else None,
    )
    alg = (
        AlgorithmConfig(adv_type="grpo", loss_type="actor", group_size=2, rollout_epoch=2)
        if grpo
        else AlgorithmConfig(rollout_epoch=2)
    )
    env = EnvWorker.create_group(EnvConfig(train=split, eval=split), alg, 2).launch(
        cluster, PackedPlacementStrategy(0, 0), name=f"env{tag}"
    )
    spec = env.get_spec().wait(timeout=120)[0]
    model = PolicyConfig(hidden_sizes=(8,), add_value_head=not grpo)
    rollout = EmbodiedRolloutWorker.create_group(
        EmbodiedRolloutConfig(pipeline_stage_num=2), model, spec, train_num_envs=4, eval_num_envs=4
    ).launch(cluster, PackedPlacementStrategy(0, 0), name=f"rollout{tag}")
    source = (
        _weights_source()
        .create_group(spec, model, 1)
        .launch(cluster, PackedPlacementStrategy(1, 1), name=f"actor{tag}")
    )
    sync = rollout.sync_model_from_actor(f"actor{tag}")
    source.sync_model_to_rollout(f"rollout{tag}").wait(timeout=120)
    sync.wait(timeout=120)
    channel = Channel.create(f"traj{tag}")

    def one_rollout() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        serve = rollout.generate(f"env{tag}", "train")
        stats = env.interact(f"rollout{tag}", channel, 1).wait(timeout=120)[0]
        serve.wait(timeout=60)
        return stats, source.take(channel, 2).wait(timeout=60)[0]

    one_rollout()  # episodes are mid-way at the save
    for group in (env, rollout):
        group.save_checkpoint(str(tmp_path)).wait(timeout=60)
    expected = [one_rollout() for _ in range(2)]
    for group in (env, rollout):
        group.load_checkpoint(str(tmp_path)).wait(timeout=60)
    replayed = [one_rollout() for _ in range(2)]
    if not grpo:  # episodes ended (and restarted) after the save
        assert any(stats["returns"] for stats, _ in expected)
    for (stats_e, trajs_e), (stats_r, trajs_r) in zip(expected, replayed, strict=True):
        assert stats_e == stats_r
        for te, tr in zip(trajs_e, trajs_r, strict=True):
            assert te.keys() == tr.keys()
            for key in te:
                if isinstance(te[key], torch.Tensor):
                    assert torch.equal(te[key], tr[key]), key
                else:
                    assert te[key] == tr[key], key
    # Without the restore the next rollout differs (the test can fail).
    assert not torch.equal(one_rollout()[1][0]["obs"], replayed[0][1][0]["obs"])
    channel.shutdown()
    for group in (env, rollout, source):
        group.shutdown()


def test_env_state_of_another_layout_is_refused() -> None:
    from rlinf_envs._worker import check_state_layout

    state = {"world_size": 1, "stages": [{"seed": 0}, {"seed": 2}]}
    check_state_layout(state, 1, [0, 2])
    with pytest.raises(
        ValueError,
        match=r"saved with \(env ranks, pipeline stages, stage seeds\)=\(1, 2, \[0, 2\]\) cannot be loaded into "
        r"\(2, 2, \[0, 2\]\)",
    ):
        check_state_layout(state, 2, [0, 2])
    with pytest.raises(ValueError, match=r"cannot be loaded into \(1, 1, \[0\]\)"):
        check_state_layout(state, 1, [0])
