"""ClusterConfig / NodeGroupConfig validation and RLinf YAML shape (pure, no Ray)."""

from __future__ import annotations

import pickle
from typing import Any

import attrs
import pytest
from rlinf_scheduler import ClusterConfig, NodeEnvConfig, NodeGroupConfig
from rlinf_scheduler._config import merge_path_env, parse_rank_list


def test_defaults() -> None:
    cfg = ClusterConfig()
    assert cfg.num_nodes == 1
    assert cfg.component_placement == {}
    assert cfg.node_groups == ()
    assert cfg.simulated_accelerators_per_node == 0
    assert cfg.ray_address is None and cfg.namespace is None
    assert cfg.node_wait_timeout_s == 120.0


def test_from_dict_rlinf_shape() -> None:
    raw: dict[str, Any] = {
        "cluster": {
            "num_nodes": 3,
            "component_placement": {"actor": {"node_group": "gpu", "placement": "0-7"}, "env": "all"},
            "node_groups": [
                {
                    "label": "gpu",
                    "node_ranks": "0-1",
                    "env_configs": [
                        {
                            "node_ranks": 0,
                            "python_interpreter_path": "/venv/a/bin/python",
                            "env_vars": [{"A": 1}, {"B": "x"}],
                        },
                        {"node_ranks": [1], "env_vars": {"A": "2"}},
                    ],
                },
                {
                    "label": "robot",
                    "node_ranks": 2,
                    "hardware": {"type": "Franka", "configs": [{"node_rank": 2, "robot_ip": "10.0.0.1"}]},
                },
            ],
        }
    }
    cfg = ClusterConfig.from_dict(raw)
    assert cfg.num_nodes == 3
    gpu, robot = cfg.node_groups
    assert gpu.node_ranks == (0, 1)
    assert gpu.env_configs[0] == NodeEnvConfig(
        node_ranks=(0,), env_vars={"A": "1", "B": "x"}, python_interpreter_path="/venv/a/bin/python"
    )
    assert cfg.env_vars_on(0) == {"A": "1", "B": "x"}
    assert cfg.env_vars_on(1) == {"A": "2"}
    assert cfg.env_vars_on(2) == {}
    assert cfg.python_interpreter_on(0) == "/venv/a/bin/python"
    assert cfg.python_interpreter_on(1) is None
    assert robot.hardware_type == "Franka"
    assert robot.hardware_count_on(2) == 1 and robot.hardware_count_on(0) == 0
    assert robot.hardware_configs[0]["robot_ip"] == "10.0.0.1"
    assert cfg.node_labels(0) == ["gpu"] and cfg.node_labels(2) == ["robot"]
    assert cfg.node_group("robot") is robot
    with pytest.raises(KeyError, match=r"no node group 'x'; configured: \['gpu', 'robot'\]"):
        cfg.node_group("x")
    # the inner mapping is accepted too, and the result is picklable (sent to actors) and frozen
    assert ClusterConfig.from_dict(raw["cluster"]) == cfg
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.num_nodes = 4  # type: ignore[misc]


def test_group_wide_env_and_overrides() -> None:
    group = NodeGroupConfig(
        label="g",
        node_ranks="0-2",
        env_vars={"X": "all", "Y": "all"},
        python_interpreter_path="/usr/bin/python3",
        env_configs=[{"node_ranks": "1", "env_vars": {"Y": "one"}, "python_interpreter_path": "/p1"}],
    )
    assert group.env_vars_on(0) == {"X": "all", "Y": "all"}
    assert group.env_vars_on(1) == {"X": "all", "Y": "one"}
    assert group.env_vars_on(5) == {}
    assert group.python_interpreter_on(0) == "/usr/bin/python3"
    assert group.python_interpreter_on(1) == "/p1"
    assert group.python_interpreter_on(7) is None


def test_conflicts_between_groups() -> None:
    cfg = ClusterConfig(
        num_nodes=2,
        node_groups=[
            NodeGroupConfig(label="a", node_ranks="0-1", env_vars={"K": "1"}, python_interpreter_path="/a"),
            NodeGroupConfig(label="b", node_ranks="1", env_vars={"K": "2"}, python_interpreter_path="/b"),
        ],
    )
    assert cfg.env_vars_on(0) == {"K": "1"}
    with pytest.raises(
        ValueError, match=r"node 1: env var 'K' is set to '1' by node group 'a' and to '2' by node group 'b'"
    ):
        cfg.env_vars_on(1)
    with pytest.raises(
        ValueError, match=r"node 1: conflicting python interpreters from node groups \{'a': '/a', 'b': '/b'\}"
    ):
        cfg.python_interpreter_on(1)


def test_parse_rank_list() -> None:
    assert parse_rank_list("0-2,5", what="x") == (0, 1, 2, 5)
    assert parse_rank_list(3, what="x") == (3,)
    assert parse_rank_list([2, "0-1"], what="x") == (0, 1, 2)
    for bad, msg in [
        ("0-2,1", r"x: rank\(s\) \[1\] appear more than once in '0-2,1'"),
        ("2-1", r"x: range '2-1' in '2-1' ends before it starts"),
        ("a", r"x: expected an integer or an 'a-b' range, got 'a'"),
        (-1, r"x: ranks must be >= 0, got -1"),
        ([], r"x: no ranks given"),
        (True, r"x: expected ranks"),
        (1.5, r"x: expected ranks"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_rank_list(bad, what="x")  # type: ignore[arg-type]


CONFIG_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"num_nodes": 0}, r"num_nodes: expected an integer >= 1, got 0"),
    ({"num_nodes": True}, r"num_nodes: expected an integer >= 1, got True"),
    (
        {"simulated_accelerators_per_node": -1},
        r"simulated_accelerators_per_node: expected an integer >= 0, got -1",
    ),
    ({"node_wait_timeout_s": 0}, r"node_wait_timeout_s: expected a finite number of seconds > 0, got 0"),
    ({"node_wait_timeout_s": float("inf")}, r"node_wait_timeout_s: expected a finite number"),
    ({"ray_address": ""}, r"ray_address: expected None or a non-empty string, got ''"),
    ({"namespace": 3}, r"namespace: expected None or a non-empty string, got 3"),
    ({"num_gpus": 8}, r"cluster config: unknown key\(s\) \['num_gpus'\]; allowed: \["),
    ({"component_placement": ["actor"]}, r"component_placement: expected a mapping"),
    (
        {"component_placement": {3: "0"}},
        r"component_placement: component names must be non-empty strings, got 3",
    ),
    (
        {"component_placement": {"a": {"node_group": "gpu", "placement": "0"}}},
        r"component_placement\['a'\]: unknown node_group 'gpu'; known: \['cluster', 'node'\]",
    ),
    (
        {"component_placement": {"a": {"placement": "0", "nodes": 1}}},
        r"component_placement\['a'\]: a mapping value needs 'placement' \(and optionally 'node_group'\), got keys \['nodes', 'placement'\]",
    ),
    ({"node_groups": {"label": "x"}}, r"node_groups: expected a list of node group entries"),
    ({"node_groups": ["x"]}, r"node_groups: each entry must be a mapping or a NodeGroupConfig"),
    (
        {"node_groups": [{"label": "cluster", "node_ranks": 0}]},
        r"label: node group label 'cluster' is reserved by the scheduler",
    ),
    ({"node_groups": [{"label": "node", "node_ranks": 0}]}, r"label: node group label 'node' is reserved"),
    ({"node_groups": [{"label": "", "node_ranks": 0}]}, r"label: expected a non-empty string"),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0}, {"label": "g", "node_ranks": 0}]},
        r"node_groups: label\(s\) \['g'\] are used by more than one node group",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": "0-2"}]},
        r"node group 'g' lists node rank\(s\) \[1, 2\] but num_nodes=1 \(valid ranks 0-0\)",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "colour": "red"}]},
        r"node_groups entry: unknown key\(s\) \['colour'\]",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "hardware": "Franka"}]},
        r"node group 'g': hardware must be a mapping with 'type'",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "hardware": {"type": "F", "ip": 1}}]},
        r"unknown hardware key\(s\) \['ip'\]",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "hardware": {"type": "F"}, "hardware_type": "F"}]},
        r"give either hardware or hardware_type/hardware_configs, not both",
    ),
    (
        {
            "node_groups": [
                {"label": "g", "node_ranks": 0, "hardware": {"type": "F", "configs": [{"node_rank": 3}]}}
            ]
        },
        r"node group 'g': hardware config node_rank 3 is not in node_ranks \[0\]",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "hardware": {"type": "F", "configs": [{"ip": 1}]}}]},
        r"hardware_configs: each entry must be a mapping with a 'node_rank'",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "hardware_count": 2}]},
        r"node group 'g': hardware_count needs hardware_type to be set",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "hardware_type": "F", "hardware_count": -1}]},
        r"hardware_count must be an integer >= 0, got -1",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "hardware_type": "F", "ignore_hardware": True}]},
        r"hardware_type='F' cannot be combined with ignore_hardware=True",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "ignore_hardware": "yes"}]},
        r"ignore_hardware: expected true or false, got 'yes'",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": "0-1", "env_configs": [{"node_ranks": 2}]}]},
        r"node group 'g': env_configs node_ranks \[2\] are not in node_ranks \[0, 1\]",
    ),
    (
        {
            "node_groups": [
                {"label": "g", "node_ranks": "0-1", "env_configs": [{"node_ranks": "0-1"}, {"node_ranks": 1}]}
            ]
        },
        r"node group 'g': node ranks \[1\] appear in several env_configs",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "env_configs": {"node_ranks": 0}}]},
        r"env_configs: expected a list of",
    ),
    (
        {
            "node_groups": [
                {
                    "label": "g",
                    "node_ranks": 0,
                    "env_configs": [{"node_ranks": 0, "env_vars": [{"A": 1, "B": 2}]}],
                }
            ]
        },
        r"env_vars: each list entry must be a one-key mapping",
    ),
    (
        {
            "node_groups": [
                {
                    "label": "g",
                    "node_ranks": 0,
                    "env_configs": [{"node_ranks": 0, "env_vars": [{"A": 1}, {"A": 2}]}],
                }
            ]
        },
        r"env_vars: variable 'A' is set twice",
    ),
    (
        {
            "node_groups": [
                {"label": "g", "node_ranks": 0, "env_configs": [{"node_ranks": 0, "shell": "zsh"}]}
            ]
        },
        r"env_configs entry: unknown key\(s\) \['shell'\]",
    ),
    (
        {"node_groups": [{"label": "g", "node_ranks": 0, "env_vars": "A=1"}]},
        r"env_vars: expected a mapping or a list of one-key mappings",
    ),
]


@pytest.mark.parametrize(("raw", "message"), CONFIG_ERRORS)
def test_config_errors(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ClusterConfig.from_dict(raw)


def test_from_dict_rejects_non_mapping() -> None:
    with pytest.raises(ValueError, match=r"ClusterConfig\.from_dict: expected a mapping, got list"):
        ClusterConfig.from_dict([])  # type: ignore[arg-type]


def test_int_labels_become_strings() -> None:
    cfg = ClusterConfig.from_dict(
        {
            "num_nodes": 1,
            "node_groups": [{"label": 4090, "node_ranks": 0}],
            "component_placement": {"a": {"node_group": 4090, "placement": "0"}},
        }
    )
    assert cfg.node_groups[0].label == "4090"


def test_path_like_env_vars_are_prepended_like_rlinf() -> None:
    inherited = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": "/usr/lib", "HOME": "/root"}
    incoming = {
        "PATH": "/opt/x/bin:/bin",
        "LD_LIBRARY_PATH": "/opt/x/lib",
        "PYTHONPATH": "/src",
        "HOME": "/h",
    }
    assert merge_path_env(inherited, incoming) == {
        "PATH": "/opt/x/bin:/bin:/usr/bin",  # group entries first, each entry once
        "LD_LIBRARY_PATH": "/opt/x/lib:/usr/lib",
        "PYTHONPATH": "/src",  # nothing inherited: no stray empty entry
        "HOME": "/h",  # not path-like: replaced
    }
    override = {**incoming, "RLINF_PATH_ENV_MERGE_MODE": "override"}
    assert merge_path_env(inherited, override)["PATH"] == "/opt/x/bin:/bin"
    node_override = {**inherited, "RLINF_PATH_ENV_MERGE_MODE": "override"}
    assert merge_path_env(node_override, incoming)["LD_LIBRARY_PATH"] == "/opt/x/lib"


def test_path_env_merge_mode_is_checked() -> None:
    with pytest.raises(
        ValueError, match=r"RLINF_PATH_ENV_MERGE_MODE must be one of \['append', 'override'\], got 'prepend'"
    ):
        NodeGroupConfig(label="g", node_ranks=0, env_vars={"RLINF_PATH_ENV_MERGE_MODE": "prepend"})


def test_duplicate_hardware_entries_are_refused() -> None:
    robot = {"node_rank": 0, "robot_ip": "10.0.0.1"}
    with pytest.raises(
        ValueError,
        match=r"hardware_configs: entry \{'node_rank': 0, 'robot_ip': '10.0.0.1'\} is listed twice",
    ):
        NodeGroupConfig(
            label="arm", node_ranks=0, hardware_type="Franka", hardware_configs=[robot, dict(robot)]
        )
    with pytest.raises(ValueError, match="listed twice"):
        ClusterConfig.from_dict(
            {
                "node_groups": [
                    {
                        "label": "arm",
                        "node_ranks": 0,
                        "hardware": {"type": "Franka", "configs": [robot, robot]},
                    }
                ]
            }
        )
