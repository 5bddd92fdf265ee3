"""Placement grammar, the worked examples of docs/scheduler.md#worked-examples, strategies and error paths (pure, no Ray)."""

from __future__ import annotations

import re

import pytest
from rlinf_scheduler import (
    FlexiblePlacementStrategy,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    Placement,
    StaticClusterView,
    resolve_placement,
)
from rlinf_scheduler._placement_grammar import parse_placement, segments_to_process_resources


def devices(placements: list[Placement]) -> list[tuple[int, ...]]:
    return [p.local_accelerators for p in placements]


# ---------------------------------------------------------------- worked mappings table (one node of 8 devices)


def test_table_actor_env_rollout_split() -> None:
    out = resolve_placement(
        {"actor": "0-7", "env": "0-3", "rollout": "4-7"}, num_nodes=1, accelerators_per_node=8
    )
    assert devices(out["actor"]) == [(r,) for r in range(8)]
    assert devices(out["env"]) == [(r,) for r in range(4)]
    assert devices(out["rollout"]) == [(4 + r,) for r in range(4)]
    assert [p.rank for p in out["rollout"]] == [0, 1, 2, 3]
    assert all(p.world_size == 4 for p in out["rollout"])


def test_table_collocated_single_device() -> None:
    out = resolve_placement({"env,rollout,actor": "0"}, num_nodes=1, accelerators_per_node=8)
    assert sorted(out) == ["actor", "env", "rollout"]
    for name in ("env", "rollout", "actor"):
        assert len(out[name]) == 1
        assert out[name][0].local_accelerators == (0,)
        assert out[name][0].node_rank == 0


def test_table_mixed_segments_on_16_devices() -> None:
    out = resolve_placement({"x": "0-1:0-3,3-5,7-10:7-14"}, num_nodes=1, accelerators_per_node=16)
    expected = {0: 0, 1: 0, 2: 1, 3: 1, 4: 3, 5: 4, 6: 5, 7: 7, 8: 7, 9: 8, 10: 8}
    expected |= {11: 9, 12: 9, 13: 10, 14: 10}
    assert [p.rank for p in out["x"]] == list(range(15))
    assert {p.rank: p.local_accelerators for p in out["x"]} == {r: (d,) for r, d in expected.items()}


def test_table_non_contiguous_actor_and_inference() -> None:
    out = resolve_placement({"actor": "0-2,5,7", "inference": "3-4"}, num_nodes=1, accelerators_per_node=8)
    assert [d for p in out["actor"] for d in p.local_accelerators] == [0, 1, 2, 5, 7]
    assert [d for p in out["inference"] for d in p.local_accelerators] == [3, 4]


def test_two_nodes_all() -> None:
    out = resolve_placement({"actor,env,rollout": "all"}, num_nodes=2, accelerators_per_node=8)
    for name in ("actor", "env", "rollout"):
        ps = out[name]
        assert len(ps) == 16
        for p in ps:
            assert p.world_size == 16
            assert p.node_rank == p.rank // 8
            assert p.local_accelerators == (p.rank % 8,)
            assert p.local_rank == p.rank % 8
            assert p.local_world_size == 8


def test_contract_examples_sharing_and_blocks() -> None:
    env = resolve_placement({"env": "0-1:0-3"}, num_nodes=1, accelerators_per_node=8)["env"]
    assert devices(env) == [(0,), (0,), (1,), (1,)]
    actor = resolve_placement({"actor": "0-3:0-1"}, num_nodes=1, accelerators_per_node=8)["actor"]
    assert devices(actor) == [(0, 1), (2, 3)]
    assert actor[0].visible_accelerators == "0,1"
    assert actor[1].visible_accelerators == "2,3"


def test_int_value_and_whitespace() -> None:
    out = resolve_placement(
        {" actor , rollout ": 3, "env": " 4 - 5 : 0 - 3 "}, num_nodes=1, accelerators_per_node=8
    )
    assert devices(out["actor"]) == [(3,)]
    assert devices(out["rollout"]) == [(3,)]
    assert devices(out["env"]) == [(4,), (4,), (5,), (5,)]


def test_multi_node_ranks_cross_node_boundaries() -> None:
    out = resolve_placement({"a": "6-9", "b": "4-11:0-1"}, num_nodes=2, accelerators_per_node=8)
    assert [(p.node_rank, p.local_accelerators, p.local_rank, p.local_world_size) for p in out["a"]] == [
        (0, (6,), 0, 2),
        (0, (7,), 1, 2),
        (1, (0,), 0, 2),
        (1, (1,), 1, 2),
    ]
    assert [(p.node_rank, p.local_accelerators) for p in out["b"]] == [(0, (4, 5, 6, 7)), (1, (0, 1, 2, 3))]


def test_heterogeneous_accelerator_counts() -> None:
    out = resolve_placement({"a": "all"}, num_nodes=3, accelerators_per_node=[2, 0, 3])
    assert [(p.node_rank, p.local_accelerators) for p in out["a"]] == [
        (0, (0,)),
        (0, (1,)),
        (2, (0,)),
        (2, (1,)),
        (2, (2,)),
    ]


def test_no_accelerators_means_nodes_are_resources() -> None:
    out = resolve_placement({"agent": "0-1:0-3", "solo": "2"}, num_nodes=3, accelerators_per_node=0)
    agent = out["agent"]
    assert [p.node_rank for p in agent] == [0, 0, 1, 1]
    assert all(p.resource_kind == "node" and p.local_accelerators == () for p in agent)
    assert [p.local_rank for p in agent] == [0, 1, 0, 1]
    assert out["solo"][0].node_rank == 2
    assert out["solo"][0].accelerator_type == ""


# ---------------------------------------------------------------- grammar unit tests


def test_parse_segments_and_mapping() -> None:
    segs = parse_placement("0-1:0-3,3-5,7-10:7-14", num_resources=16)
    assert [(s.text, s.resources, s.processes) for s in segs] == [
        ("0-1:0-3", (0, 1), (0, 1, 2, 3)),
        ("3-5", (3, 4, 5), (4, 5, 6)),
        ("7-10:7-14", (7, 8, 9, 10), tuple(range(7, 15))),
    ]
    assert segments_to_process_resources(parse_placement("all", num_resources=4)) == [(0,), (1,), (2,), (3,)]
    assert segments_to_process_resources(parse_placement("0-5:0-2", num_resources=6)) == [
        (0, 1),
        (2, 3),
        (4, 5),
    ]


GRAMMAR_ERRORS = [
    ("0-8", r"accelerator rank 8 in segment '0-8' is out of range \(8 accelerator\(s\) available: 0-7\)"),
    ("3-1", r"range '3-1' ends before it starts"),
    ("0-3,2-5", r"segment '2-5' is not ascending and disjoint"),
    ("4-5,0-1", r"segment '0-1' is not ascending and disjoint"),
    ("0-2:0-1", r"in segment '0-2:0-1', 2 process\(es\) and 3 accelerator\(s\) do not divide each other"),
    (
        "0-1:1-2",
        r"process ranks must be continuous from 0 across segments: segment '0-1:1-2' starts at process 1, expected 0",
    ),
    ("0-1,2-3:3-4", r"segment '2-3:3-4' starts at process 3, expected 2"),
    ("0-1:0-1,2-3:5-6", r"segment '2-3:5-6' starts at process 5, expected 2"),
    ("x", r"accelerator ranks 'x' is not 'all', an integer >= 0 or an 'a-b' range"),
    ("-1", r"accelerator ranks '-1' is not 'all'"),
    ("1.5", r"accelerator ranks '1.5' is not 'all'"),
    ("0-1:all", r"process ranks cannot be 'all'"),
    ("0-1:x", r"process ranks 'x' is not"),
    ("0-1,", r"empty segment \(stray ','\)"),
    (",0-1", r"empty segment"),
    ("0:0:1", r"segment '0:0:1' has more than one ':'"),
    ("", r"empty placement"),
    ("   ", r"empty placement"),
    ("all,3", r"segment '3' is not ascending and disjoint"),
    ("0-1:3-1", r"process ranks range '3-1' ends before it starts"),
]


@pytest.mark.parametrize(("text", "message"), GRAMMAR_ERRORS)
def test_grammar_errors_quote_text_and_component(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        resolve_placement({"actor": text}, num_nodes=1, accelerators_per_node=8)
    msg = str(info.value)
    assert re.search(message, msg), msg
    assert msg.startswith("component_placement['actor']: "), msg
    assert f"placement {text!r}" in msg, msg


def test_error_process_spanning_nodes() -> None:
    with pytest.raises(ValueError) as info:
        resolve_placement({"actor": "4-11:0"}, num_nodes=2, accelerators_per_node=8)
    msg = str(info.value)
    assert "component_placement['actor']: placement '4-11:0'" in msg
    assert "process 0 would span nodes [0, 1]" in msg


def test_error_process_spanning_nodes_without_accelerators() -> None:
    with pytest.raises(ValueError, match=r"placement '0-1:0'.*process 0 would span nodes \[0, 1\]"):
        resolve_placement({"agent": "0-1:0"}, num_nodes=2, accelerators_per_node=0)


def test_error_all_without_resources() -> None:
    with pytest.raises(ValueError, match=r"component_placement\['a'\]: placement 'all': 'all' selects no"):
        resolve_placement(
            {"a": {"node_group": "empty", "placement": "all"}},
            num_nodes=1,
            accelerators_per_node=0,
            node_groups=[{"label": "empty", "node_ranks": 0, "hardware_type": "Robot", "hardware_count": 0}],
        )


def test_error_component_placed_twice() -> None:
    with pytest.raises(
        ValueError, match=r"component 'actor' is already placed by component_placement\['actor,env'\]"
    ):
        resolve_placement({"actor,env": "0-3", "actor": "4-7"}, num_nodes=1, accelerators_per_node=8)


def test_error_bad_value_types() -> None:
    with pytest.raises(ValueError, match=r"component_placement\['actor'\]: expected a placement text"):
        resolve_placement({"actor": [0, 1]}, num_nodes=1, accelerators_per_node=8)
    with pytest.raises(ValueError, match=r"component_placement\['actor'\]: expected a placement text"):
        resolve_placement({"actor": True}, num_nodes=1, accelerators_per_node=8)
    with pytest.raises(ValueError, match=r"empty component name in key 'actor,'"):
        resolve_placement({"actor,": "0"}, num_nodes=1, accelerators_per_node=8)
    with pytest.raises(ValueError, match=r"needs 'placement'"):
        resolve_placement({"actor": {"node_group": "cluster"}}, num_nodes=1, accelerators_per_node=8)


def test_error_cluster_description() -> None:
    with pytest.raises(
        ValueError, match=r"accelerators_per_node: got 1 per-node counts \[8\] for num_nodes=2"
    ):
        resolve_placement({"a": "0"}, num_nodes=2, accelerators_per_node=[8])
    with pytest.raises(ValueError, match=r"num_nodes: expected an integer >= 1, got 0"):
        resolve_placement({"a": "0"}, num_nodes=0, accelerators_per_node=8)
    with pytest.raises(ValueError, match=r"counts must be integers >= 0, got -1"):
        resolve_placement({"a": "0"}, num_nodes=1, accelerators_per_node=-1)


# ---------------------------------------------------------------- strategies


VIEW_2x8 = StaticClusterView(num_nodes=2, accelerators=8)


def test_packed_strategy_contract_example() -> None:
    strategy = PackedPlacementStrategy(0, 7, num_hardware_per_process=2, stride=2)
    assert [list(p.local_accelerators) for p in strategy.get_placement(VIEW_2x8)] == [
        [0, 2],
        [1, 3],
        [4, 6],
        [5, 7],
    ]


def test_packed_strategy_fills_node_by_node() -> None:
    ps = PackedPlacementStrategy(4, 11).get_placement(VIEW_2x8)
    assert [(p.node_rank, p.local_accelerators, p.local_rank, p.local_world_size) for p in ps] == [
        (0, (4,), 0, 4),
        (0, (5,), 1, 4),
        (0, (6,), 2, 4),
        (0, (7,), 3, 4),
        (1, (0,), 0, 4),
        (1, (1,), 1, 4),
        (1, (2,), 2, 4),
        (1, (3,), 3, 4),
    ]
    chunked = PackedPlacementStrategy(0, 15, num_hardware_per_process=4).get_placement(VIEW_2x8)
    assert [(p.node_rank, p.local_accelerators) for p in chunked] == [
        (0, (0, 1, 2, 3)),
        (0, (4, 5, 6, 7)),
        (1, (0, 1, 2, 3)),
        (1, (4, 5, 6, 7)),
    ]


def test_packed_strategy_errors() -> None:
    with pytest.raises(
        ValueError, match=r"8 resources are not divisible by num_hardware_per_process \* stride = 3 \* 1 = 3"
    ):
        PackedPlacementStrategy(0, 7, num_hardware_per_process=3)
    with pytest.raises(ValueError, match=r"end=2 is smaller than start=5"):
        PackedPlacementStrategy(5, 2)
    with pytest.raises(ValueError, match=r"start: expected an integer >= 0, got -1"):
        PackedPlacementStrategy(-1, 2)
    with pytest.raises(ValueError, match=r"stride: expected an integer >= 1, got 0"):
        PackedPlacementStrategy(0, 1, stride=0)
    with pytest.raises(
        ValueError, match=r"end rank 16 is out of range: node group\(s\) \['cluster'\] have 16 resource"
    ):
        PackedPlacementStrategy(0, 16, num_hardware_per_process=1).get_placement(VIEW_2x8)
    with pytest.raises(ValueError, match=r"process 1 would span nodes \[0, 1\]"):
        PackedPlacementStrategy(2, 13, num_hardware_per_process=4).get_placement(VIEW_2x8)


def test_flexible_strategy() -> None:
    ps = FlexiblePlacementStrategy([[1, 0], [2], [9, 8]]).get_placement(VIEW_2x8)
    assert [(p.rank, p.node_rank, p.local_accelerators, p.resource_ranks) for p in ps] == [
        (0, 0, (0, 1), (0, 1)),
        (1, 0, (2,), (2,)),
        (2, 1, (0, 1), (8, 9)),
    ]
    assert [(p.local_rank, p.local_world_size) for p in ps] == [(0, 2), (1, 2), (0, 1)]


def test_flexible_strategy_errors() -> None:
    with pytest.raises(ValueError, match=r"non-empty list of rank lists"):
        FlexiblePlacementStrategy([])
    with pytest.raises(ValueError, match=r"process 1 needs a non-empty list of ranks"):
        FlexiblePlacementStrategy([[0], []])
    with pytest.raises(ValueError, match=r"process 0 lists a rank twice: \[1, 1\]"):
        FlexiblePlacementStrategy([[1, 1]])
    with pytest.raises(ValueError, match=r"process 0 would span nodes \[0, 1\]"):
        FlexiblePlacementStrategy([[7, 8]]).get_placement(VIEW_2x8)
    with pytest.raises(ValueError, match=r"process 0: accelerator rank 16 is out of range"):
        FlexiblePlacementStrategy([[16]]).get_placement(VIEW_2x8)


def test_node_strategy_sees_all_devices() -> None:
    ps = NodePlacementStrategy([0, 0, 1]).get_placement(VIEW_2x8)
    assert [(p.node_rank, p.local_rank, p.local_world_size) for p in ps] == [(0, 0, 2), (0, 1, 2), (1, 0, 1)]
    assert all(p.local_accelerators == tuple(range(8)) and p.resource_kind == "node" for p in ps)
    assert ps[0].visible_accelerators == "0,1,2,3,4,5,6,7"
    with pytest.raises(ValueError, match=r"node rank 2 is out of range"):
        NodePlacementStrategy([2]).get_placement(VIEW_2x8)
    with pytest.raises(ValueError, match=r"non-empty list of node ranks"):
        NodePlacementStrategy([])


def test_strategy_unknown_node_group() -> None:
    with pytest.raises(ValueError, match=r"unknown node_group 'gpu'; known: \['cluster', 'node'\]"):
        PackedPlacementStrategy(0, 1, node_group="gpu").get_placement(VIEW_2x8)


def test_placement_is_frozen() -> None:
    p = PackedPlacementStrategy(0, 0).get_placement(VIEW_2x8)[0]
    with pytest.raises(AttributeError):
        p.rank = 3  # type: ignore[misc]
