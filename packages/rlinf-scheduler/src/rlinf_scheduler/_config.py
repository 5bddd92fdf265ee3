"""Cluster configuration: the number of nodes, component placement and node groups.

The classes are frozen attrs classes validated on construction. :meth:`ClusterConfig.from_dict` accepts the
``cluster:`` section of an original RLinf YAML file (``num_nodes``, ``component_placement``, ``node_groups`` with
``env_configs`` and ``hardware``) plus the settings that are new in rlinf-scheduler
(``simulated_accelerators_per_node``, ``ray_address``, ``namespace``, ``node_wait_timeout_s``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "PATH_ENV_MERGE_MODE_ENV",
    "PATH_LIKE_ENV_VARS",
    "RESERVED_NODE_GROUP_LABELS",
    "ClusterConfig",
    "NodeEnvConfig",
    "NodeGroupConfig",
    "merge_path_env",
    "normalize_node_group_labels",
    "parse_rank_list",
]

RESERVED_NODE_GROUP_LABELS: tuple[str, ...] = ("cluster", "node")
"""Labels the scheduler defines itself: ``cluster`` (every node, accelerators as resources) and ``node``
(every node, the nodes themselves as resources)."""

PATH_LIKE_ENV_VARS: frozenset[str] = frozenset(
    {"PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "LIBRARY_PATH", "CMAKE_PREFIX_PATH", "PKG_CONFIG_PATH", "CPATH"}
)
"""Variables whose node-group value is put in front of the worker's inherited value (as in RLinf)."""

PATH_ENV_MERGE_MODE_ENV = "RLINF_PATH_ENV_MERGE_MODE"
"""RLinf's switch for path-like variables: ``append`` (default: the node group's entries first, then the
inherited ones, duplicates dropped) or ``override`` (the node group's value replaces the inherited one). Set it
in a node group's ``env_vars`` or on the node before ``ray start``."""

_PATH_ENV_MERGE_MODES = ("append", "override")

_RANGE_RE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_rank_list(value: int | str | Iterable[int | str], *, what: str) -> tuple[int, ...]:
    """Parse a set of ranks written as an int, a list, or a text such as ``"0-3,5"``.

    Args:
        value: ``3``, ``[0, 1, 2]``, ``"0-3"``, ``"0-1,4"`` (ranges are inclusive).
        what: What the ranks are, used in error messages (e.g. ``"node_groups[0].node_ranks"``).

    Returns:
        The ranks, sorted ascending, without duplicates.

    Raises:
        ValueError: If a part is not a non-negative integer or an ``a-b`` range with ``a <= b``, or if a rank
            appears twice.
    """
    parts: list[int | str]
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected ranks such as 3, '0-3' or [0, 1], got {value!r}")
    if isinstance(value, int):
        parts = [value]
    elif isinstance(value, str):
        parts = list(value.split(","))
    elif isinstance(value, Iterable):
        parts = list(value)
    else:
        raise ValueError(f"{what}: expected ranks such as 3, '0-3' or [0, 1], got {value!r}")
    ranks: list[int] = []
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, int | str):
            raise ValueError(f"{what}: expected an integer or an 'a-b' range, got {part!r} in {value!r}")
        if isinstance(part, int):
            if part < 0:
                raise ValueError(f"{what}: ranks must be >= 0, got {part} in {value!r}")
            ranks.append(part)
            continue
        match = _RANGE_RE.match(part)
        if match is None:
            raise ValueError(f"{what}: expected an integer or an 'a-b' range, got {part!r} in {value!r}")
        start = int(match.group(1))
        end = int(match.group(2)) if match.group(2) is not None else start
        if end < start:
            raise ValueError(f"{what}: range {part.strip()!r} in {value!r} ends before it starts")
        ranks.extend(range(start, end + 1))
    if len(set(ranks)) != len(ranks):
        dup = sorted({r for r in ranks if ranks.count(r) > 1})
        raise ValueError(f"{what}: rank(s) {dup} appear more than once in {value!r}")
    if not ranks:
        raise ValueError(f"{what}: no ranks given in {value!r}")
    return tuple(sorted(ranks))


def _group_node_ranks(value: Any) -> tuple[int, ...]:
    return parse_rank_list(value, what="node_groups.node_ranks")


def _env_node_ranks(value: Any) -> tuple[int, ...]:
    return parse_rank_list(value, what="env_configs.node_ranks")


def _env_vars_converter(value: Any) -> dict[str, str]:
    """Accept ``{K: V}`` or RLinf's list of one-key dicts ``[{K: V}, ...]``; values become strings."""
    if value is None:
        return {}
    items: list[tuple[Any, Any]] = []
    if isinstance(value, Mapping):
        items = list(value.items())
    elif isinstance(value, Sequence) and not isinstance(value, str):
        for entry in value:
            if not isinstance(entry, Mapping) or len(entry) != 1:
                raise ValueError(
                    f"env_vars: each list entry must be a one-key mapping such as {{'GLOO_SOCKET_IFNAME': 'eth0'}}, got {entry!r}"
                )
            items.extend(entry.items())
    else:
        raise ValueError(f"env_vars: expected a mapping or a list of one-key mappings, got {value!r}")
    out: dict[str, str] = {}
    for key, val in items:
        if not isinstance(key, str) or not key:
            raise ValueError(f"env_vars: variable names must be non-empty strings, got {key!r}")
        if key in out:
            raise ValueError(f"env_vars: variable {key!r} is set twice")
        out[key] = str(val)
    mode = out.get(PATH_ENV_MERGE_MODE_ENV)
    if mode is not None and mode.lower() not in _PATH_ENV_MERGE_MODES:
        raise ValueError(
            f"env_vars: {PATH_ENV_MERGE_MODE_ENV} must be one of {list(_PATH_ENV_MERGE_MODES)}, got {mode!r}"
        )
    return out


def merge_path_env(inherited: Mapping[str, str], incoming: Mapping[str, str]) -> dict[str, str]:
    """The variables a worker gets from its node groups, with path-like ones merged into the inherited values.

    For a variable of :data:`PATH_LIKE_ENV_VARS` that the worker already has (``inherited``, e.g. the
    node's ``LD_LIBRARY_PATH``), the node group's entries come first and the inherited ones follow, each
    entry once (RLinf's default). With ``RLINF_PATH_ENV_MERGE_MODE=override`` (in ``incoming`` or
    ``inherited``) the node group's value replaces it. Other variables always replace.

    Example:
        >>> merge_path_env({"PATH": "/usr/bin:/bin"}, {"PATH": "/opt/x/bin:/bin", "A": "1"})
        {'PATH': '/opt/x/bin:/bin:/usr/bin', 'A': '1'}

    Args:
        inherited: What the worker process would have without the node groups.
        incoming: What the node groups set.

    Returns:
        The variables to set (only the keys of ``incoming``).
    """
    mode = str(incoming.get(PATH_ENV_MERGE_MODE_ENV, inherited.get(PATH_ENV_MERGE_MODE_ENV, "append")))
    out = dict(incoming)
    if mode.lower() == "override":
        return out
    for key, value in incoming.items():
        if key in PATH_LIKE_ENV_VARS and inherited.get(key):
            entries = [e for e in value.split(os.pathsep) + inherited[key].split(os.pathsep) if e]
            out[key] = os.pathsep.join(dict.fromkeys(entries))
    return out


def _check_label(instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{attribute.name}: expected a non-empty string, got {value!r}")
    if value in RESERVED_NODE_GROUP_LABELS:
        raise ValueError(
            f"{attribute.name}: node group label {value!r} is reserved by the scheduler "
            f"(reserved: {list(RESERVED_NODE_GROUP_LABELS)}); choose another label"
        )


def _check_bool(instance: Any, attribute: attrs.Attribute[bool], value: bool) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{attribute.name}: expected true or false, got {value!r}")


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


@attrs.frozen(kw_only=True)
class NodeEnvConfig:
    """Software environment for a subset of the nodes of a node group (RLinf's ``env_configs`` entry)."""

    node_ranks: tuple[int, ...] = attrs.field(converter=_env_node_ranks)
    """Node ranks this entry applies to (``"0-3"``, ``[0, 1]`` or an int)."""

    env_vars: dict[str, str] = attrs.field(factory=dict, converter=_env_vars_converter)
    """Environment variables set for workers on these nodes (a mapping, or RLinf's list of one-key mappings)."""

    python_interpreter_path: str | None = attrs.field(default=None, converter=_optional_str)
    """Python interpreter used for workers on these nodes; ``None`` keeps the default."""


def _env_configs_converter(value: Any) -> tuple[NodeEnvConfig, ...]:
    if value is None:
        return ()
    if isinstance(value, Mapping | str) or not isinstance(value, Iterable):
        raise ValueError(
            f"env_configs: expected a list of {{node_ranks, env_vars, python_interpreter_path}} entries, got {value!r}"
        )
    out: list[NodeEnvConfig] = []
    for entry in value:
        if isinstance(entry, NodeEnvConfig):
            out.append(entry)
        elif isinstance(entry, Mapping):
            out.append(NodeEnvConfig(**_checked_keys(entry, NodeEnvConfig, where="env_configs entry")))
        else:
            raise ValueError(f"env_configs: each entry must be a mapping, got {entry!r}")
    return tuple(out)


def _hardware_configs_converter(value: Any) -> tuple[dict[str, Any], ...]:
    if value is None:
        return ()
    if isinstance(value, Mapping | str) or not isinstance(value, Iterable):
        raise ValueError(
            f"hardware_configs: expected a list of mappings each with a 'node_rank', got {value!r}"
        )
    out: list[dict[str, Any]] = []
    for entry in value:
        if not isinstance(entry, Mapping) or "node_rank" not in entry:
            raise ValueError(
                f"hardware_configs: each entry must be a mapping with a 'node_rank', got {entry!r}"
            )
        rank = entry["node_rank"]
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise ValueError(f"hardware_configs: 'node_rank' must be an integer >= 0, got {rank!r}")
        if dict(entry) in out:
            raise ValueError(
                f"hardware_configs: entry {dict(entry)!r} is listed twice; each hardware unit must appear once"
            )
        out.append(dict(entry))
    return tuple(out)


@attrs.frozen(kw_only=True)
class NodeGroupConfig:
    """A labelled set of nodes (RLinf's ``cluster.node_groups`` entry).

    Placement may target a node group with ``{node_group: <label>, placement: "<grammar>"}``. Resources of a
    group are, in this order of preference: its non-accelerator hardware units when ``hardware_type`` is set,
    else the accelerators of its nodes (real or simulated) unless ``ignore_hardware``, else the nodes themselves.
    """

    label: str = attrs.field(validator=_check_label)
    """Unique, case-sensitive label; ``cluster`` and ``node`` are reserved."""

    node_ranks: tuple[int, ...] = attrs.field(converter=_group_node_ranks)
    """Node ranks in the group (``"0-3"``, ``[0, 1]`` or an int)."""

    env_vars: dict[str, str] = attrs.field(factory=dict, converter=_env_vars_converter)
    """Environment variables for workers on every node of the group."""

    python_interpreter_path: str | None = attrs.field(default=None, converter=_optional_str)
    """Python interpreter for workers on every node of the group; ``None`` keeps the default."""

    env_configs: tuple[NodeEnvConfig, ...] = attrs.field(factory=tuple, converter=_env_configs_converter)
    """Per-subset environments (override ``env_vars`` / ``python_interpreter_path`` on their nodes)."""

    hardware_type: str | None = attrs.field(default=None, converter=_optional_str)
    """Non-accelerator hardware of the group (e.g. ``"Franka"``); its units become the placement resources."""

    hardware_count: int | None = attrs.field(default=None)
    """Units of ``hardware_type`` on each node; ``None``: one per ``hardware_configs`` entry of the node, or one
    per node when there are no entries."""

    hardware_configs: tuple[dict[str, Any], ...] = attrs.field(
        factory=tuple, converter=_hardware_configs_converter
    )
    """Per-unit settings of ``hardware_type`` (each with a ``node_rank``), e.g. robot IPs (RLinf's
    ``hardware.configs``)."""

    ignore_hardware: bool = attrs.field(default=False, validator=_check_bool)
    """Treat the nodes as CPU-only: the nodes themselves are the placement resources."""

    @hardware_count.validator
    def _check_hardware_count(self, attribute: attrs.Attribute[int | None], value: int | None) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(
                f"node group {self.label!r}: hardware_count must be an integer >= 0, got {value!r}"
            )
        if self.hardware_type is None:
            raise ValueError(f"node group {self.label!r}: hardware_count needs hardware_type to be set")

    def __attrs_post_init__(self) -> None:
        if self.ignore_hardware and self.hardware_type is not None:
            raise ValueError(
                f"node group {self.label!r}: hardware_type={self.hardware_type!r} cannot be combined with ignore_hardware=True"
            )
        if self.hardware_configs and self.hardware_type is None:
            raise ValueError(f"node group {self.label!r}: hardware_configs need hardware_type to be set")
        for entry in self.hardware_configs:
            if entry["node_rank"] not in self.node_ranks:
                raise ValueError(
                    f"node group {self.label!r}: hardware config node_rank {entry['node_rank']} is not in node_ranks {list(self.node_ranks)}"
                )
        seen: set[int] = set()
        for env in self.env_configs:
            outside = sorted(set(env.node_ranks) - set(self.node_ranks))
            if outside:
                raise ValueError(
                    f"node group {self.label!r}: env_configs node_ranks {outside} are not in node_ranks {list(self.node_ranks)}"
                )
            overlap = sorted(seen & set(env.node_ranks))
            if overlap:
                raise ValueError(
                    f"node group {self.label!r}: node ranks {overlap} appear in several env_configs"
                )
            seen.update(env.node_ranks)

    def hardware_count_on(self, node_rank: int) -> int:
        """Units of ``hardware_type`` on ``node_rank`` (0 when the node is not in the group or no type is set)."""
        if self.hardware_type is None or node_rank not in self.node_ranks:
            return 0
        if self.hardware_count is not None:
            return self.hardware_count
        if self.hardware_configs:
            return sum(1 for entry in self.hardware_configs if entry["node_rank"] == node_rank)
        return 1

    def hardware_config(self, node_rank: int, index: int) -> dict[str, Any] | None:
        """The ``hardware_configs`` entry of unit ``index`` on ``node_rank`` (the node's entries in order), if any."""
        entries = [entry for entry in self.hardware_configs if entry["node_rank"] == node_rank]
        return dict(entries[index]) if index < len(entries) else None

    def env_vars_on(self, node_rank: int) -> dict[str, str]:
        """Environment variables this group sets on ``node_rank`` (group-wide, then its ``env_configs`` entry)."""
        if node_rank not in self.node_ranks:
            return {}
        out = dict(self.env_vars)
        for env in self.env_configs:
            if node_rank in env.node_ranks:
                out.update(env.env_vars)
        return out

    def python_interpreter_on(self, node_rank: int) -> str | None:
        """Python interpreter this group sets on ``node_rank``, or ``None``."""
        if node_rank not in self.node_ranks:
            return None
        for env in self.env_configs:
            if node_rank in env.node_ranks and env.python_interpreter_path is not None:
                return env.python_interpreter_path
        return self.python_interpreter_path


def _node_groups_converter(value: Any) -> tuple[NodeGroupConfig, ...]:
    if value is None:
        return ()
    if isinstance(value, Mapping | str) or not isinstance(value, Iterable):
        raise ValueError(f"node_groups: expected a list of node group entries, got {value!r}")
    out: list[NodeGroupConfig] = []
    for entry in value:
        if isinstance(entry, NodeGroupConfig):
            out.append(entry)
        elif isinstance(entry, Mapping):
            out.append(_node_group_from_dict(entry))
        else:
            raise ValueError(f"node_groups: each entry must be a mapping or a NodeGroupConfig, got {entry!r}")
    return tuple(out)


def _node_group_from_dict(entry: Mapping[str, Any]) -> NodeGroupConfig:
    """Build a node group from RLinf's YAML shape (``hardware: {type, configs}``) or ours."""
    kwargs = dict(entry)
    hardware = kwargs.pop("hardware", None)
    if hardware is not None:
        if not isinstance(hardware, Mapping) or "type" not in hardware:
            raise ValueError(
                f"node group {kwargs.get('label')!r}: hardware must be a mapping with 'type' (and optional 'configs'), got {hardware!r}"
            )
        unknown = sorted(set(hardware) - {"type", "configs"})
        if unknown:
            raise ValueError(
                f"node group {kwargs.get('label')!r}: unknown hardware key(s) {unknown}; allowed: ['configs', 'type']"
            )
        if "hardware_type" in kwargs or "hardware_configs" in kwargs:
            raise ValueError(
                f"node group {kwargs.get('label')!r}: give either hardware or hardware_type/hardware_configs, not both"
            )
        kwargs["hardware_type"] = hardware["type"]
        kwargs["hardware_configs"] = hardware.get("configs")
    if "label" in kwargs and not isinstance(kwargs["label"], str):
        # YAML reads `label: 4090` as an int; RLinf labels are strings.
        kwargs["label"] = str(kwargs["label"])
    return NodeGroupConfig(**_checked_keys(kwargs, NodeGroupConfig, where="node_groups entry"))


def _checked_keys(mapping: Mapping[str, Any], cls: type, *, where: str) -> dict[str, Any]:
    allowed = {a.name for a in attrs.fields(cls)}
    unknown = sorted(str(k) for k in mapping if k not in allowed)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")
    return {str(k): v for k, v in mapping.items()}


def _component_placement_converter(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(
            f"component_placement: expected a mapping of component names to placements, got {value!r}"
        )
    out: dict[str, Any] = {}
    for key, val in value.items():
        if not isinstance(key, str) or not key.strip():
            raise ValueError(f"component_placement: component names must be non-empty strings, got {key!r}")
        if isinstance(val, Mapping):
            val = dict(val)
        out[key] = val
    return out


def _positive_int(instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{attribute.name}: expected an integer >= 1, got {value!r}")


def _non_negative_int(instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{attribute.name}: expected an integer >= 0, got {value!r}")


def _positive_finite(instance: Any, attribute: attrs.Attribute[float], value: float) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{attribute.name}: expected a finite number of seconds > 0, got {value!r}")


def _optional_non_empty_str(instance: Any, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    if value is not None and (not isinstance(value, str) or not value):
        raise ValueError(f"{attribute.name}: expected None or a non-empty string, got {value!r}")


@attrs.frozen(kw_only=True)
class ClusterConfig:
    """How many nodes a run uses, where its components go, and how nodes are grouped.

    Example:
        >>> cfg = ClusterConfig(num_nodes=1, component_placement={"actor": "0-3", "rollout": "4-7"},
        ...                     simulated_accelerators_per_node=8)
        >>> cfg.num_nodes, cfg.simulated_accelerators_per_node
        (1, 8)
    """

    num_nodes: int = attrs.field(default=1, validator=_positive_int)
    """Number of Ray nodes the run waits for."""

    component_placement: dict[str, Any] = attrs.field(factory=dict, converter=_component_placement_converter)
    """Component name(s) → placement: a grammar text (``"0-3"``, ``"all"``, ``"0-1:0-3"``), an int, or
    ``{"node_group": label, "placement": text}``. A key may list several comma-separated components."""

    node_groups: tuple[NodeGroupConfig, ...] = attrs.field(factory=tuple, converter=_node_groups_converter)
    """Labelled node sets with their environment and hardware."""

    simulated_accelerators_per_node: int = attrs.field(default=0, validator=_non_negative_int)
    """``K > 0``: every node reports ``K`` accelerator slots of type ``"cpu"`` (no real device is used)."""

    ray_address: str | None = attrs.field(default=None, validator=_optional_non_empty_str)
    """Ray address to attach to; ``None``: attach to a running cluster if one is reachable, else start one."""

    namespace: str | None = attrs.field(default=None, validator=_optional_non_empty_str)
    """Ray namespace of the run; ``None``: a fresh one per run."""

    node_wait_timeout_s: float = attrs.field(default=120.0, validator=_positive_finite)
    """How long to wait for ``num_nodes`` nodes to be alive before failing."""

    def __attrs_post_init__(self) -> None:
        labels = [g.label for g in self.node_groups]
        dups = sorted({lab for lab in labels if labels.count(lab) > 1})
        if dups:
            raise ValueError(f"node_groups: label(s) {dups} are used by more than one node group")
        for group in self.node_groups:
            outside = [r for r in group.node_ranks if r >= self.num_nodes]
            if outside:
                raise ValueError(
                    f"node_groups: node group {group.label!r} lists node rank(s) {outside} but num_nodes={self.num_nodes} "
                    f"(valid ranks 0-{self.num_nodes - 1})"
                )
        for components, value in self.component_placement.items():
            _check_placement_value(components, value, labels)

    def node_group(self, label: str) -> NodeGroupConfig:
        """Return the node group called ``label``.

        Raises:
            KeyError: If no such group is configured (the message lists the labels).
        """
        for group in self.node_groups:
            if group.label == label:
                return group
        raise KeyError(f"no node group {label!r}; configured: {[g.label for g in self.node_groups]}")

    def node_labels(self, node_rank: int) -> list[str]:
        """Labels of the configured node groups that contain ``node_rank``."""
        return [g.label for g in self.node_groups if node_rank in g.node_ranks]

    def env_vars_on(self, node_rank: int) -> dict[str, str]:
        """Environment variables all node groups set on ``node_rank``.

        Raises:
            ValueError: If two groups set the same variable to different values on that node.
        """
        out: dict[str, str] = {}
        origin: dict[str, str] = {}
        for group in self.node_groups:
            for key, val in group.env_vars_on(node_rank).items():
                if key in out and out[key] != val:
                    raise ValueError(
                        f"node {node_rank}: env var {key!r} is set to {out[key]!r} by node group {origin[key]!r} "
                        f"and to {val!r} by node group {group.label!r}"
                    )
                out[key] = val
                origin[key] = group.label
        return out

    def python_interpreter_on(self, node_rank: int) -> str | None:
        """Python interpreter set by the node groups on ``node_rank``, or ``None``.

        Raises:
            ValueError: If two groups set different interpreters on that node.
        """
        paths = {
            g.label: p for g in self.node_groups if (p := g.python_interpreter_on(node_rank)) is not None
        }
        if len(set(paths.values())) > 1:
            raise ValueError(f"node {node_rank}: conflicting python interpreters from node groups {paths}")
        return next(iter(paths.values()), None)

    @classmethod
    def from_dict(cls, mapping: Mapping[str, Any]) -> ClusterConfig:
        """Build a config from a plain mapping, e.g. the ``cluster:`` section of an RLinf YAML file.

        Accepts the mapping itself or ``{"cluster": {...}}``. RLinf's shape is understood as is:
        ``node_groups[*].env_configs[*].env_vars`` as a list of one-key mappings and
        ``node_groups[*].hardware: {type, configs}``.

        Args:
            mapping: The configuration (plain dicts and lists; any Mapping/Sequence works).

        Returns:
            The validated config.

        Raises:
            ValueError: On an unknown key (the message lists the allowed keys) or an invalid value.
        """
        if not isinstance(mapping, Mapping):
            raise ValueError(f"ClusterConfig.from_dict: expected a mapping, got {type(mapping).__name__}")
        if set(mapping) == {"cluster"} and isinstance(mapping["cluster"], Mapping):
            mapping = mapping["cluster"]
        return cls(**_checked_keys(mapping, cls, where="cluster config"))


def normalize_node_group_labels(node_group: Any) -> tuple[str, ...]:
    """Turn ``None`` / ``"a"`` / ``"a,b"`` / ``["a", "b"]`` / ``4090`` into a tuple of labels.

    ``None`` means the reserved ``cluster`` group (every node).

    Raises:
        ValueError: On an empty or repeated label.
    """
    if node_group is None:
        return ("cluster",)
    if isinstance(node_group, str):
        labels = tuple(lab.strip() for lab in node_group.split(","))
    elif isinstance(node_group, Iterable) and not isinstance(node_group, Mapping):
        labels = tuple(str(lab).strip() for lab in node_group)
    else:
        # YAML reads `node_group: 4090` as an int; RLinf labels are strings.
        labels = (str(node_group).strip(),)
    if not labels or any(not lab for lab in labels):
        raise ValueError(f"node_group: expected one or more non-empty labels, got {node_group!r}")
    if len(set(labels)) != len(labels):
        raise ValueError(f"node_group: label listed twice in {node_group!r}")
    return labels


def _check_placement_value(components: str, value: Any, labels: list[str]) -> None:
    """Check the shape of one ``component_placement`` entry (the grammar is checked at resolution)."""
    names = [c.strip() for c in components.split(",")]
    if any(not n for n in names):
        raise ValueError(f"component_placement: empty component name in key {components!r}")
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"node_group", "placement"})
        if unknown or "placement" not in value:
            raise ValueError(
                f"component_placement[{components!r}]: a mapping value needs 'placement' (and optionally 'node_group'), "
                f"got keys {sorted(value)}"
            )
        try:
            wanted = normalize_node_group_labels(value.get("node_group"))
        except ValueError as e:
            raise ValueError(f"component_placement[{components!r}]: {e}") from None
        for label in wanted:
            if label not in RESERVED_NODE_GROUP_LABELS and label not in labels:
                raise ValueError(
                    f"component_placement[{components!r}]: unknown node_group {label!r}; "
                    f"known: {list(RESERVED_NODE_GROUP_LABELS) + labels}"
                )
        value = value["placement"]
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise ValueError(
            f"component_placement[{components!r}]: expected a placement text such as '0-3' or 'all', or an int, got {value!r}"
        )
