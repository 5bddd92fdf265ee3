"""ComponentPlacement, HybridComponentPlacement, ModelParallelComponentPlacement and node groups (pure, no Ray)."""

from __future__ import annotations

from typing import Any

import pytest
from rlinf_scheduler import (
    ClusterConfig,
    ComponentPlacement,
    FlexiblePlacementStrategy,
    HybridComponentPlacement,
    ModelParallelComponentPlacement,
    NodeGroupConfig,
    PackedPlacementStrategy,
    PlacementMode,
    StaticClusterView,
    resolve_placement,
)

ONE_NODE_8 = StaticClusterView(num_nodes=1, accelerators=8)


def hybrid(placement: dict[str, Any], view: StaticClusterView = ONE_NODE_8) -> HybridComponentPlacement:
    return HybridComponentPlacement(
        ClusterConfig(num_nodes=view.num_nodes, component_placement=placement), view
    )


def mp(
    placement: dict[str, Any], view: StaticClusterView = ONE_NODE_8, **sizes: int
) -> ModelParallelComponentPlacement:
    return ModelParallelComponentPlacement(
        ClusterConfig(num_nodes=view.num_nodes, component_placement=placement), view, **sizes
    )


# ---------------------------------------------------------------- hybrid / base


def test_hybrid_basic_api() -> None:
    cp = hybrid({"actor": "0-7", "env,rollout": "0-3:0-7"})
    assert cp.placement_mode is PlacementMode.HYBRID
    assert cp.components == ["actor", "env", "rollout"]
    assert cp.get_world_size("actor") == 8
    assert cp.get_world_size("env") == 8
    assert cp.get_hardware_ranks("rollout") == [0, 1, 2, 3]
    assert cp.has_component("env") and not cp.has_component("critic")
    assert cp.get_node_group("env") == ("cluster",)
    strategy = cp.get_strategy("env")
    assert isinstance(strategy, FlexiblePlacementStrategy)
    assert strategy.get_placement(ONE_NODE_8) == cp.get_placements("env")
    assert cp.placements()["rollout"] == cp.get_placements("rollout")


def test_unknown_component_lists_known_ones() -> None:
    cp = hybrid({"actor": "0-7"})
    with pytest.raises(KeyError, match=r"unknown component 'critic'; placed components: \['actor'\]"):
        cp.get_strategy("critic")
    with pytest.raises(KeyError, match="unknown component"):
        cp.get_world_size("critic")


def test_base_class_accepts_rlinf_shaped_mapping() -> None:
    cfg = {"cluster": {"num_nodes": 1, "component_placement": {"actor": "0-3"}}, "actor": {"model": {}}}
    cp = ComponentPlacement(cfg, ONE_NODE_8)
    assert cp.get_world_size("actor") == 4
    cp2 = ComponentPlacement({"num_nodes": 1, "component_placement": {"actor": "all"}}, ONE_NODE_8)
    assert cp2.get_world_size("actor") == 8
    with pytest.raises(ValueError, match="cluster_config: expected a ClusterConfig or a mapping"):
        ComponentPlacement(42, ONE_NODE_8)  # type: ignore[arg-type]


def test_error_before_launch_mentions_component_and_text() -> None:
    with pytest.raises(
        ValueError, match=r"component_placement\['env,rollout'\]: placement '0-9'.*out of range"
    ):
        hybrid({"actor": "0-7", "env,rollout": "0-9"})


# ---------------------------------------------------------------- node groups

RLINF_EXAMPLE: dict[str, Any] = {
    "cluster": {
        "num_nodes": 18,
        "component_placement": {
            "actor": {"node_group": "a800", "placement": "0-63"},
            "rollout": {"node_group": 4090, "placement": "0-63"},
            "env": {"node_group": "franka", "placement": "0-1:0-3"},
            "agent": {"node_group": "node", "placement": "0-1:0-199,2-3:200-399"},
        },
        "node_groups": [
            {
                "label": "a800",
                "node_ranks": "0-7",
                "env_configs": [
                    {
                        "node_ranks": "0-7",
                        "python_interpreter_path": "/opt/venv/openpi/bin/python3",
                        "env_vars": [{"GLOO_SOCKET_IFNAME": "eth0"}],
                    }
                ],
            },
            {
                "label": 4090,
                "node_ranks": "8-15",
                "env_configs": [{"node_ranks": "8-15", "env_vars": [{"GLOO_SOCKET_IFNAME": "eth1"}]}],
            },
            {
                "label": "franka",
                "node_ranks": "16-17",
                "hardware": {
                    "type": "Franka",
                    "configs": [
                        {"robot_ip": "10.10.10.1", "node_rank": 16, "camera_serials": ["1", "2"]},
                        {"robot_ip": "10.10.10.2", "node_rank": 17, "camera_serials": ["3", "4"]},
                    ],
                },
            },
        ],
    }
}


def test_rlinf_heterogeneous_example() -> None:
    config = ClusterConfig.from_dict(RLINF_EXAMPLE)
    view = StaticClusterView(num_nodes=18, accelerators=[8] * 16 + [0, 0], accelerator_type="cuda")
    cp = HybridComponentPlacement(config, view)  # the view has no node groups: the config's are used

    actor = cp.get_placements("actor")
    assert len(actor) == 64
    assert {p.node_rank for p in actor} == set(range(8))
    assert all(p.node_group == "a800" and p.local_accelerators == (p.rank % 8,) for p in actor)

    rollout = cp.get_placements("rollout")
    assert [p.node_rank for p in rollout[::8]] == list(range(8, 16))
    assert all(p.node_group == "4090" and p.accelerator_type == "cuda" for p in rollout)

    env = cp.get_placements("env")
    assert [(p.node_rank, p.local_hardware_ranks) for p in env] == [
        (16, (0,)),
        (16, (0,)),
        (17, (0,)),
        (17, (0,)),
    ]
    assert all(p.resource_kind == "hardware" and p.hardware_type == "Franka" for p in env)
    assert all(p.local_accelerators == () and p.accelerator_type == "" for p in env)

    agent = cp.get_placements("agent")
    assert len(agent) == 400
    assert [sum(p.node_rank == n for p in agent) for n in range(4)] == [100, 100, 100, 100]
    assert agent[150].node_rank == 1 and agent[150].local_rank == 50 and agent[150].local_world_size == 100
    # node-resource placements see every accelerator of their node
    assert agent[0].local_accelerators == tuple(range(8))
    assert agent[0].node_group == "node"


def test_node_group_ranks_are_local_to_the_group() -> None:
    groups = [NodeGroupConfig(label="late", node_ranks="1-2")]
    out = resolve_placement(
        {"a": {"node_group": "late", "placement": "0-3:0-1"}, "b": {"node_group": "late", "placement": "7"}},
        num_nodes=3,
        accelerators_per_node=4,
        node_groups=groups,
    )
    assert [(p.node_rank, p.local_accelerators) for p in out["a"]] == [(1, (0, 1)), (1, (2, 3))]
    assert [(p.node_rank, p.local_accelerators) for p in out["b"]] == [(2, (3,))]


def test_several_node_groups_concatenate() -> None:
    groups = [NodeGroupConfig(label="g0", node_ranks=[1]), NodeGroupConfig(label="g1", node_ranks=[0])]
    out = resolve_placement(
        {"a": {"node_group": "g0,g1", "placement": "all"}, "b": {"node_group": ["g1"], "placement": "0"}},
        num_nodes=2,
        accelerators_per_node=2,
        node_groups=groups,
    )
    assert [(p.node_rank, p.local_accelerators, p.node_group) for p in out["a"]] == [
        (1, (0,), "g0"),
        (1, (1,), "g0"),
        (0, (0,), "g1"),
        (0, (1,), "g1"),
    ]
    assert out["b"][0].node_rank == 0


def test_node_group_without_accelerators_and_ignore_hardware() -> None:
    groups = [
        NodeGroupConfig(label="cpu", node_ranks="2-3"),
        NodeGroupConfig(label="ignored", node_ranks="0-1", ignore_hardware=True),
        NodeGroupConfig(label="robots", node_ranks="0-1", hardware_type="Arm", hardware_count=2),
    ]
    out = resolve_placement(
        {
            "c": {"node_group": "cpu", "placement": "all"},
            "i": {"node_group": "ignored", "placement": "1"},
            "r": {"node_group": "robots", "placement": "1-2"},
            "gpu": "all",
        },
        num_nodes=4,
        accelerators_per_node=[2, 2, 0, 0],
        node_groups=groups,
    )
    assert [(p.node_rank, p.resource_kind) for p in out["c"]] == [(2, "node"), (3, "node")]
    assert [(p.node_rank, p.resource_kind, p.local_accelerators) for p in out["i"]] == [(1, "node", (0, 1))]
    assert [(p.node_rank, p.local_hardware_ranks) for p in out["r"]] == [(0, (1,)), (1, (0,))]
    assert [p.node_rank for p in out["gpu"]] == [0, 0, 1, 1]


def test_node_group_errors() -> None:
    groups = [
        NodeGroupConfig(label="gpu", node_ranks=[0]),
        NodeGroupConfig(label="robots", node_ranks=[1], hardware_type="Arm"),
    ]
    with pytest.raises(ValueError, match=r"component_placement\['a'\]: unknown node_group 'tpu'"):
        resolve_placement(
            {"a": {"node_group": "tpu", "placement": "0"}},
            num_nodes=2,
            accelerators_per_node=1,
            node_groups=groups,
        )
    with pytest.raises(
        ValueError,
        match=r"component_placement\['a'\]: placement '0-1:0'.*process 0 would take resources of node groups "
        r"\['arms', 'gpu'\].*gpu: accelerator, arms: Arm unit",
    ):
        resolve_placement(
            {"a": {"node_group": "gpu,arms", "placement": "0-1:0"}},
            num_nodes=1,
            accelerators_per_node=1,
            node_groups=[groups[0], NodeGroupConfig(label="arms", node_ranks=[0], hardware_type="Arm")],
        )
    with pytest.raises(
        ValueError, match=r"component_placement\['a'\]: placement '1'.*Arm unit rank 1.*out of range"
    ):
        resolve_placement(
            {"a": {"node_group": "robots", "placement": "1"}},
            num_nodes=2,
            accelerators_per_node=1,
            node_groups=groups,
        )
    with pytest.raises(ValueError, match=r"node_group: label listed twice"):
        resolve_placement(
            {"a": {"node_group": "gpu,gpu", "placement": "0"}},
            num_nodes=2,
            accelerators_per_node=1,
            node_groups=groups,
        )


def test_resolve_placement_accepts_cluster_config() -> None:
    config = ClusterConfig.from_dict(RLINF_EXAMPLE)
    out = resolve_placement(config, num_nodes=18, accelerators_per_node=[8] * 16 + [0, 0])
    assert len(out["rollout"]) == 64
    with pytest.raises(ValueError, match="not both"):
        resolve_placement(
            config,
            num_nodes=18,
            accelerators_per_node=8,
            node_groups=[NodeGroupConfig(label="x", node_ranks=0)],
        )


def test_view_node_groups_take_precedence() -> None:
    view = StaticClusterView(
        num_nodes=2, accelerators=4, node_groups=[NodeGroupConfig(label="g", node_ranks=1)]
    )
    cp = HybridComponentPlacement(
        ClusterConfig(
            num_nodes=2,
            component_placement={"a": {"node_group": "g", "placement": "0"}},
            node_groups=[NodeGroupConfig(label="g", node_ranks=1)],
        ),
        view,
    )
    assert cp.get_placements("a")[0].node_rank == 1


# ---------------------------------------------------------------- model parallel


def test_model_parallel_collocated() -> None:
    cp = mp({"actor,rollout": "0-7", "reward": "0-1"}, actor_tp_size=4, rollout_tp_size=2)
    assert cp.placement_mode is PlacementMode.COLLOCATED
    assert cp.is_collocated and not cp.is_disaggregated and not cp.has_dedicated_inference
    assert cp.get_world_size("actor") == 8
    assert cp.get_world_size("rollout") == 4
    assert [p.local_accelerators for p in cp.get_placements("rollout")] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    rollout = cp.get_strategy("rollout")
    assert isinstance(rollout, PackedPlacementStrategy) and rollout.num_hardware_per_process == 2
    assert (cp.actor_tp_size, cp.actor_pp_size, cp.actor_dp_size, cp.actor_world_size) == (4, 1, 2, 8)
    assert (cp.rollout_tp_size, cp.rollout_dp_size, cp.rollout_world_size) == (2, 4, 8)
    assert cp.reward_world_size == 2 and cp.critic_world_size == 0 and cp.inference_world_size == 0


def test_model_parallel_disaggregated() -> None:
    cp = mp(
        {"actor": "0-3", "rollout": "4-7", "inference": "8-9", "reward": "0-9"},
        view=StaticClusterView(num_nodes=1, accelerators=10),
        actor_tp_size=2,
        rollout_tp_size=2,
        rollout_pp_size=2,
    )
    assert cp.placement_mode is PlacementMode.DISAGGREGATED
    assert cp.is_disaggregated and cp.has_dedicated_inference
    assert cp.get_world_size("actor") == 4
    assert [p.local_accelerators for p in cp.get_placements("rollout")] == [(4, 5, 6, 7)]
    assert cp.rollout_dp_size == 1
    assert (cp.inference_tp_size, cp.inference_pp_size, cp.inference_world_size, cp.inference_dp_size) == (
        2,
        1,
        2,
        1,
    )
    assert cp.get_world_size("reward") == 10


def test_model_parallel_multi_node_and_actor_inference_alias() -> None:
    view = StaticClusterView(num_nodes=2, accelerators=8)
    cp = mp(
        {"actor": "0-7", "rollout": "8-13", "actor_inference": "14-15"},
        view=view,
        rollout_tp_size=2,
        inference_tp_size=1,
    )
    assert cp.is_disaggregated and cp.has_dedicated_inference
    assert [(p.node_rank, p.local_accelerators) for p in cp.get_placements("rollout")] == [
        (1, (0, 1)),
        (1, (2, 3)),
        (1, (4, 5)),
    ]
    assert cp.inference_world_size == 2 and cp.inference_tp_size == 1


MP_ERRORS: list[tuple[dict[str, Any], dict[str, int], str]] = [
    (
        {"actor": "0-5", "rollout": "4-7"},
        {},
        r"neither collocated .* nor disaggregated .*: actor \[0, 1, 2, 3, 4, 5\] and rollout \[4, 5, 6, 7\] share \[4, 5\]\. Placements: \{'actor': '0-5', 'rollout': '4-7'\}",
    ),
    (
        {"actor": "0-3", "rollout": "4-7", "inference": "3-4"},
        {},
        r"actor \[0, 1, 2, 3\] and inference \[3, 4\] share \[3\]; rollout \[4, 5, 6, 7\] and inference \[3, 4\] share \[4\]",
    ),
    (
        {"actor,rollout": "0-3", "inference": "4-7"},
        {},
        r"component_placement\['inference'\] = '4-7' \(component 'inference'\): collocated mode .* does not use a separate inference",
    ),
    ({"actor": "0-3"}, {}, r"must place \['rollout'\]; placed: \['actor'\]"),
    (
        {"actor": "0-2,5", "rollout": "6-7"},
        {},
        r"component_placement\['actor'\] = '0-2,5' \(component 'actor'\): accelerators \[0, 1, 2, 5\] must be contiguous",
    ),
    (
        {"actor": "0-3:0-1", "rollout": "4-7"},
        {},
        r"component_placement\['actor'\] = '0-3:0-1' \(component 'actor'\): model-parallel components take one process per accelerator",
    ),
    ({"actor": "0-1:0-3", "rollout": "4-7"}, {}, r"one process per accelerator"),
    (
        {"actor": "0-5", "rollout": "6-7"},
        {"actor_tp_size": 4},
        r"component_placement\['actor'\] = '0-5' \(component 'actor'\): 6 accelerators are not divisible by actor_tp_size \* actor_pp_size \* actor_cp_size = 4 \* 1 \* 1",
    ),
    (
        {"actor": "0-1", "rollout": "2-7"},
        {"rollout_tp_size": 4},
        r"component_placement\['rollout'\] = '2-7' \(component 'rollout'\): 6 accelerators are not divisible by rollout_tp_size \* rollout_pp_size = 4 \* 1",
    ),
    (
        {"actor,rollout": "0-5"},
        {"actor_tp_size": 3, "rollout_tp_size": 2},
        r"collocated mode: actor_tp_size 3 must be a multiple of rollout_tp_size 2",
    ),
    (
        {"actor": "0-3", "rollout": "4-5", "inference": "6-7"},
        {"inference_tp_size": 4},
        r"2 accelerators are not divisible by inference_tp_size \* inference_pp_size = 4 \* 1",
    ),
    (
        {"actor": "0-3", "rollout": "4-7"},
        {"rollout_tp_size": 0},
        r"rollout_tp_size: expected an integer >= 1, got 0",
    ),
    (
        {"actor": "0-1", "rollout": "2-3", "inference": "4", "actor_inference": "5"},
        {},
        r"give 'inference' or its RLinf alias 'actor_inference', not both",
    ),
    (
        {"actor": "0-1", "rollout": "2-3", "critic": "3-4"},
        {},
        r"rollout \[2, 3\] and critic \[3, 4\] share \[3\]",
    ),
]


@pytest.mark.parametrize(("placement", "sizes", "message"), MP_ERRORS)
def test_model_parallel_errors(placement: dict[str, Any], sizes: dict[str, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mp(placement, **sizes)


def test_model_parallel_needs_accelerators() -> None:
    with pytest.raises(
        ValueError,
        match=r"model-parallel components need accelerators, but its node group\(s\) give node resources",
    ):
        mp({"actor": "0", "rollout": "1"}, view=StaticClusterView(num_nodes=2, accelerators=0))


def test_model_parallel_compares_physical_devices_across_node_groups() -> None:
    view = StaticClusterView(num_nodes=2, accelerators=4)
    groups = [NodeGroupConfig(label="train", node_ranks=0), NodeGroupConfig(label="gen", node_ranks=1)]
    placement = {
        "actor": {"node_group": "train", "placement": "0-3"},
        "rollout": {"node_group": "gen", "placement": "0-3"},
    }
    cp = ModelParallelComponentPlacement(
        ClusterConfig(num_nodes=2, component_placement=placement, node_groups=groups), view
    )
    # same ranks, different nodes: disaggregated, not collocated
    assert cp.placement_mode is PlacementMode.DISAGGREGATED
    assert [p.node_rank for p in cp.get_placements("rollout")] == [1, 1, 1, 1]
    overlapping = {"actor": "0-5", "rollout": {"node_group": "gen", "placement": "0-3"}}
    with pytest.raises(
        ValueError,
        match=r"actor \[0, 1, 2, 3, 4, 5\] and rollout \[0, 1, 2, 3\] share \[4, 5\] \(ranks of actor's node group cluster\)",
    ):
        ModelParallelComponentPlacement(
            ClusterConfig(num_nodes=2, component_placement=overlapping, node_groups=groups), view
        )


def test_placements_pickle() -> None:
    import pickle

    ps = resolve_placement({"a": "0-3:0-1"}, num_nodes=1, accelerators_per_node=4)["a"]
    assert pickle.loads(pickle.dumps(ps)) == ps


def test_component_spans_node_groups_of_different_kinds() -> None:
    """GPU nodes and robot nodes in one component: each process gets its own group's kind of resource."""
    groups = [
        NodeGroupConfig(label="gpu", node_ranks="0-1"),
        NodeGroupConfig(
            label="robot",
            node_ranks="2-3",
            hardware_type="Franka",
            hardware_configs=[
                {"node_rank": 2, "robot_ip": "10.0.0.2"},
                {"node_rank": 3, "robot_ip": "10.0.0.3"},
                {"node_rank": 3, "robot_ip": "10.0.0.4"},
            ],
        ),
    ]
    out = resolve_placement(
        {
            "env": {"node_group": "gpu,robot", "placement": "0-6"},
            "actor": {"node_group": "gpu", "placement": "all"},
        },
        num_nodes=4,
        accelerators_per_node=[2, 2, 0, 0],
        node_groups=groups,
    )
    env = out["env"]
    assert [(p.node_rank, p.resource_kind, p.node_group) for p in env] == [
        (0, "accelerator", "gpu"),
        (0, "accelerator", "gpu"),
        (1, "accelerator", "gpu"),
        (1, "accelerator", "gpu"),
        (2, "hardware", "robot"),
        (3, "hardware", "robot"),
        (3, "hardware", "robot"),
    ]
    assert [p.local_accelerators for p in env[:4]] == [(0,), (1,), (0,), (1,)]
    assert all(p.hardware_configs == () and p.hardware_type is None for p in env[:4])
    assert [p.hardware_configs[0]["robot_ip"] for p in env[4:]] == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    assert [p.local_hardware_ranks for p in env[4:]] == [(0,), (0,), (1,)]
    assert env[6].hardware == "Franka unit 1 (robot_ip=10.0.0.4) on node 3, node group 'robot'"
    assert env[0].hardware == "accelerator(s) [0] on node 0, node group 'gpu'"
    # Out-of-range ranks of a mixed placement say what the resources are.
    with pytest.raises(
        ValueError, match=r"resource rank 7 in segment '7' is out of range \(7 resource\(s\) available"
    ):
        resolve_placement(
            {"env": {"node_group": "gpu,robot", "placement": "7"}},
            num_nodes=4,
            accelerators_per_node=[2, 2, 0, 0],
            node_groups=groups,
        )
