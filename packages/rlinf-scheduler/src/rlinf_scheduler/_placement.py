"""Placement: which node and which devices each process of a worker group gets.

A :class:`PlacementStrategy` turns a :class:`ClusterView` (how many nodes, how many accelerators on each, which
node groups) into one frozen :class:`Placement` per process rank. Nothing here imports Ray: the runtime's
``Cluster`` implements :class:`ClusterView`, and :class:`StaticClusterView` describes a cluster on paper.

Resources of a node group are its non-accelerator hardware units if the group declares ``hardware_type``, else
its accelerators (real or simulated) if its nodes have any and the group does not ``ignore_hardware``, else the
nodes themselves. Resource ranks count from 0 inside the (concatenated) node group(s), node by node. Groups of
different kinds may be concatenated (GPU nodes then robot nodes): each process takes resources of one kind.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Any, Literal, Protocol, runtime_checkable

import attrs

from ._config import RESERVED_NODE_GROUP_LABELS, NodeGroupConfig, normalize_node_group_labels

__all__ = [
    "ClusterView",
    "FlexiblePlacementStrategy",
    "NodePlacementStrategy",
    "PackedPlacementStrategy",
    "Placement",
    "PlacementStrategy",
    "ResourceKind",
    "StaticClusterView",
]

ResourceKind = Literal["accelerator", "hardware", "node"]
"""What the resource ranks of a placement count: accelerators, declared hardware units, or nodes."""


@runtime_checkable
class ClusterView(Protocol):
    """What placement needs to know about a cluster (the runtime ``Cluster`` implements it).

    Members:
        num_nodes: Number of nodes, ranked ``0..num_nodes-1``.
        accelerator_type: ``"cpu"`` for simulated accelerators, ``"cuda"``... for real ones, ``""`` if none.
        accelerators_per_node(node_rank): Accelerators (real or simulated) on that node, 0 if none.
        node_groups: The configured node groups (without the reserved ``cluster`` and ``node``).
    """

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        ...

    @property
    def accelerator_type(self) -> str:
        """Accelerator type of the cluster (``"cpu"`` when simulated)."""
        ...

    @property
    def node_groups(self) -> Sequence[NodeGroupConfig]:
        """Configured node groups."""
        ...

    def accelerators_per_node(self, node_rank: int) -> int:
        """Number of accelerators on ``node_rank``."""
        ...


def _accelerator_counts(value: int | Sequence[int]) -> tuple[int, ...] | int:
    if isinstance(value, int):
        return value
    return tuple(value)


def _groups_tuple(value: Iterable[NodeGroupConfig]) -> tuple[NodeGroupConfig, ...]:
    return tuple(value)


@attrs.frozen(kw_only=True)
class StaticClusterView:
    """A cluster described on paper (no Ray), for :func:`resolve_placement` and tests.

    Example:
        >>> view = StaticClusterView(num_nodes=2, accelerators=8)
        >>> view.accelerators_per_node(1), view.accelerator_type
        (8, 'cpu')
    """

    num_nodes: int = attrs.field(default=1)
    """Number of nodes."""

    accelerators: int | tuple[int, ...] = attrs.field(default=0, converter=_accelerator_counts)
    """Accelerators on every node (an int) or on each node (one int per node)."""

    accelerator_type: str = "cpu"
    """Accelerator type reported in the placements."""

    node_groups: tuple[NodeGroupConfig, ...] = attrs.field(factory=tuple, converter=_groups_tuple)
    """Configured node groups."""

    def __attrs_post_init__(self) -> None:
        if isinstance(self.num_nodes, bool) or not isinstance(self.num_nodes, int) or self.num_nodes < 1:
            raise ValueError(f"num_nodes: expected an integer >= 1, got {self.num_nodes!r}")
        counts = (
            (self.accelerators,) * self.num_nodes if isinstance(self.accelerators, int) else self.accelerators
        )
        if len(counts) != self.num_nodes:
            raise ValueError(
                f"accelerators_per_node: got {len(counts)} per-node counts {list(counts)} for num_nodes={self.num_nodes}"
            )
        for c in counts:
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ValueError(f"accelerators_per_node: counts must be integers >= 0, got {c!r}")
        for group in self.node_groups:
            outside = [r for r in group.node_ranks if r >= self.num_nodes]
            if outside:
                raise ValueError(
                    f"node group {group.label!r} lists node rank(s) {outside} but the cluster has {self.num_nodes} node(s)"
                )

    def accelerators_per_node(self, node_rank: int) -> int:
        """Number of accelerators on ``node_rank``."""
        if isinstance(self.accelerators, int):
            return self.accelerators
        return self.accelerators[node_rank]


@attrs.frozen(kw_only=True)
class Placement:
    """Where one process of a worker group runs.

    Attributes:
        rank: Process rank in its group, ``0..world_size-1``.
        world_size: Number of processes in the group.
        node_rank: Cluster node rank the process runs on.
        local_rank: Index of the process among the group's processes on that node (in rank order).
        local_world_size: Number of the group's processes on that node.
        local_accelerators: Accelerator indices on the node the process may use (its ``CUDA_VISIBLE_DEVICES``);
            for hardware- or node-resource placements, every accelerator of the node.
        local_hardware_ranks: Indices on the node of the resources the placement assigned (accelerator indices,
            hardware unit indices, or ``(0,)`` for a node).
        resource_ranks: The assigned resource ranks within the node group(s), as written in the placement.
        resource_kind: What the resources are: ``"accelerator"``, ``"hardware"`` or ``"node"``.
        node_group: Label of the node group the process's resources belong to.
        accelerator_type: Accelerator type of the node (``"cpu"`` when simulated, ``""`` if none).
        hardware_type: The node group's ``hardware_type`` for hardware placements, else ``None``.
        hardware_configs: For hardware placements, the node group's ``hardware_configs`` entry of each assigned
            unit (``{}`` for a unit without one), in ``local_hardware_ranks`` order; else empty.
    """

    rank: int
    world_size: int
    node_rank: int
    local_rank: int
    local_world_size: int
    local_accelerators: tuple[int, ...]
    local_hardware_ranks: tuple[int, ...]
    resource_ranks: tuple[int, ...]
    resource_kind: ResourceKind
    node_group: str
    accelerator_type: str
    hardware_type: str | None = None
    hardware_configs: tuple[dict[str, Any], ...] = ()

    @property
    def hardware(self) -> str:
        """The assigned resources in words, e.g. ``"Franka unit 0 (robot_ip=10.0.0.2) on node 1, node group 'robot'"``."""
        if self.resource_kind == "hardware":
            units = []
            for index, config in zip(self.local_hardware_ranks, self.hardware_configs, strict=True):
                details = ", ".join(f"{k}={v}" for k, v in config.items() if k != "node_rank")
                units.append(f"{self.hardware_type} unit {index}" + (f" ({details})" if details else ""))
            what = ", ".join(units)
        elif self.resource_kind == "accelerator":
            what = f"accelerator(s) {list(self.local_accelerators)}"
        else:
            return f"node {self.node_rank}, node group {self.node_group!r}"
        return f"{what} on node {self.node_rank}, node group {self.node_group!r}"

    @property
    def visible_accelerators(self) -> str:
        """The accelerators as an env-var value, e.g. ``"0,1"`` (empty if none)."""
        return ",".join(str(a) for a in self.local_accelerators)


@attrs.frozen
class _Resource:
    node_rank: int
    local_index: int
    group: str
    kind: ResourceKind
    hardware_type: str | None = None
    config: dict[str, Any] | None = attrs.field(default=None, eq=False)

    @property
    def word(self) -> str:
        return f"{self.hardware_type} unit" if self.kind == "hardware" else self.kind


@attrs.frozen
class _ResourceSpace:
    """The resources of one or more node groups, concatenated in order (their kinds may differ)."""

    labels: tuple[str, ...]
    resources: tuple[_Resource, ...]
    words: tuple[str, ...]
    """The resource word of each group, in ``labels`` order."""

    @property
    def word(self) -> str:
        return self.words[0] if len(set(self.words)) == 1 else "resource"

    @property
    def kinds(self) -> str:
        """The groups' resources in words, e.g. ``"gpu: accelerator, robot: Franka unit"``."""
        return ", ".join(f"{label}: {word}" for label, word in zip(self.labels, self.words, strict=True))


def _group_kind(view: ClusterView, group: NodeGroupConfig | None, label: str) -> ResourceKind:
    if label == "node":
        return "node"
    if group is not None and group.hardware_type is not None:
        return "hardware"
    if group is not None and group.ignore_hardware:
        return "node"
    nodes = range(view.num_nodes) if group is None else group.node_ranks
    return "accelerator" if any(view.accelerators_per_node(n) > 0 for n in nodes) else "node"


def _view_node_groups(view: ClusterView) -> Sequence[NodeGroupConfig]:
    # A cluster built without node groups may not carry the attribute at all.
    return tuple(getattr(view, "node_groups", None) or ())


def _find_group(view: ClusterView, label: str) -> NodeGroupConfig | None:
    if label in RESERVED_NODE_GROUP_LABELS:
        return None
    groups = _view_node_groups(view)
    for group in groups:
        if group.label == label:
            return group
    known = list(RESERVED_NODE_GROUP_LABELS) + [g.label for g in groups]
    raise ValueError(f"unknown node_group {label!r}; known: {known}")


def resource_space(view: ClusterView, labels: Sequence[str]) -> _ResourceSpace:
    """Resources of the node groups ``labels``, ranked from 0 across the groups in order."""
    resources: list[_Resource] = []
    words: list[str] = []
    for label in labels:
        group = _find_group(view, label)
        kind = _group_kind(view, group, label)
        hw_type = group.hardware_type if group is not None and kind == "hardware" else None
        words.append(_Resource(0, 0, label, kind, hw_type).word)
        nodes = range(view.num_nodes) if group is None else group.node_ranks
        for node in nodes:
            if kind == "node":
                resources.append(_Resource(node, 0, label, kind))
            elif kind == "hardware":
                assert group is not None
                resources.extend(
                    _Resource(node, i, label, kind, hw_type, group.hardware_config(node, i))
                    for i in range(group.hardware_count_on(node))
                )
            else:
                resources.extend(
                    _Resource(node, i, label, kind) for i in range(view.accelerators_per_node(node))
                )
    return _ResourceSpace(labels=tuple(labels), resources=tuple(resources), words=tuple(words))


def build_placements(
    view: ClusterView, space: _ResourceSpace, per_process: Sequence[Sequence[int]]
) -> list[Placement]:
    """Turn per-process resource ranks into placements (checks range, one node per process, no duplicates)."""
    n = len(space.resources)
    word = space.word
    staged: list[tuple[int, tuple[int, ...], tuple[_Resource, ...]]] = []
    for rank, ranks in enumerate(per_process):
        ranks = tuple(ranks)
        if not ranks:
            raise ValueError(f"process {rank} has no {word}")
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or r < 0 or r >= n:
                available = f"0-{n - 1}" if n else "none"
                raise ValueError(
                    f"process {rank}: {word} rank {r!r} is out of range in node group(s) {list(space.labels)} "
                    f"({n} {word}(s): {available})"
                )
        if len(set(ranks)) != len(ranks):
            raise ValueError(f"process {rank}: {word} ranks {list(ranks)} contain duplicates")
        nodes = sorted({space.resources[r].node_rank for r in ranks})
        if len(nodes) > 1:
            raise ValueError(
                f"process {rank} would span nodes {nodes} ({word} ranks {list(ranks)}); a process runs on one node"
            )
        taken = [space.resources[r] for r in ranks]
        groups = sorted({res.group for res in taken})
        if len(groups) > 1:
            raise ValueError(
                f"process {rank} would take resources of node groups {groups} ({word} ranks {list(ranks)}; "
                f"{space.kinds}); a process takes the resources of one node group"
            )
        staged.append((nodes[0], ranks, tuple(taken)))
    per_node: dict[int, int] = {}
    local_ranks: list[int] = []
    for node, *_ in staged:
        local_ranks.append(per_node.get(node, 0))
        per_node[node] = per_node.get(node, 0) + 1
    out: list[Placement] = []
    for rank, ((node, assigned, held), local_rank) in enumerate(zip(staged, local_ranks, strict=True)):
        first = held[0]
        local = tuple(res.local_index for res in held)
        # Hardware/node placements see every accelerator of their node (as in RLinf).
        accels = local if first.kind == "accelerator" else tuple(range(view.accelerators_per_node(node)))
        out.append(
            Placement(
                rank=rank,
                world_size=len(staged),
                node_rank=node,
                local_rank=local_rank,
                local_world_size=per_node[node],
                local_accelerators=accels,
                local_hardware_ranks=local,
                resource_ranks=assigned,
                resource_kind=first.kind,
                node_group=first.group,
                accelerator_type=view.accelerator_type if view.accelerators_per_node(node) > 0 else "",
                hardware_type=first.hardware_type,
                hardware_configs=tuple(dict(res.config or {}) for res in held)
                if first.kind == "hardware"
                else (),
            )
        )
    return out


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name}: expected an integer >= {minimum}, got {value!r}")
    return value


class PlacementStrategy(abc.ABC):
    """Base class: a rule that yields one :class:`Placement` per process given a :class:`ClusterView`."""

    def __init__(self, node_group: str | Sequence[str] | None = None) -> None:
        self._labels = normalize_node_group_labels(node_group)

    @property
    def node_group(self) -> tuple[str, ...]:
        """Labels of the node group(s) the resource ranks refer to (``("cluster",)`` by default)."""
        return self._labels

    @abc.abstractmethod
    def resource_ranks_per_process(self, num_resources: int) -> list[tuple[int, ...]]:
        """Resource ranks of each process, given how many resources the node group(s) have."""

    def get_placement(self, cluster: ClusterView) -> list[Placement]:
        """Resolve the strategy on ``cluster``.

        Args:
            cluster: The cluster (the runtime ``Cluster`` or a :class:`StaticClusterView`).

        Returns:
            One placement per process, in rank order.

        Raises:
            ValueError: If the resources do not exist, a process would span nodes, or a node group is unknown.
        """
        space = resource_space(cluster, self._labels)
        try:
            return build_placements(cluster, space, self.resource_ranks_per_process(len(space.resources)))
        except ValueError as e:
            raise ValueError(f"{self!r}: {e}") from None


class PackedPlacementStrategy(PlacementStrategy):
    """Pack processes onto consecutive resources ``start..end`` (inclusive), node by node.

    Each process gets ``num_hardware_per_process`` resources spaced ``stride`` apart; the range is cut into blocks
    of ``num_hardware_per_process * stride`` resources, each holding ``stride`` interleaved processes.

    Example:
        >>> PackedPlacementStrategy(0, 7, num_hardware_per_process=2, stride=2).resource_ranks_per_process(8)
        [(0, 2), (1, 3), (4, 6), (5, 7)]
    """

    def __init__(
        self,
        start: int,
        end: int,
        num_hardware_per_process: int = 1,
        stride: int = 1,
        node_group: str | Sequence[str] | None = None,
    ) -> None:
        """Create the strategy.

        Args:
            start: First resource rank (RLinf: ``start_hardware_rank``).
            end: Last resource rank, inclusive (RLinf: ``end_hardware_rank``).
            num_hardware_per_process: Resources per process.
            stride: Distance between the resources of one process.
            node_group: Node group label(s) the ranks refer to; ``None`` means the whole cluster.

        Raises:
            ValueError: On negative ranks, ``end < start``, or a range not divisible by
                ``num_hardware_per_process * stride``.
        """
        super().__init__(node_group)
        self.start = _check_int("start", start, 0)
        self.end = _check_int("end", end, 0)
        self.num_hardware_per_process = _check_int("num_hardware_per_process", num_hardware_per_process, 1)
        self.stride = _check_int("stride", stride, 1)
        if end < start:
            raise ValueError(f"PackedPlacementStrategy: end={end} is smaller than start={start}")
        block = self.num_hardware_per_process * self.stride
        count = end - start + 1
        if count % block:
            raise ValueError(
                f"PackedPlacementStrategy({start}, {end}): {count} resources are not divisible by "
                f"num_hardware_per_process * stride = {self.num_hardware_per_process} * {self.stride} = {block}"
            )

    def __repr__(self) -> str:
        return (
            f"PackedPlacementStrategy({self.start}, {self.end}, num_hardware_per_process="
            f"{self.num_hardware_per_process}, stride={self.stride}, node_group={','.join(self._labels)!r})"
        )

    def resource_ranks_per_process(self, num_resources: int) -> list[tuple[int, ...]]:
        """See :class:`PlacementStrategy`."""
        if self.end >= num_resources:
            raise ValueError(
                f"end rank {self.end} is out of range: node group(s) {list(self._labels)} have "
                f"{num_resources} resource(s)"
            )
        block = self.num_hardware_per_process * self.stride
        out: list[tuple[int, ...]] = []
        for block_start in range(self.start, self.end + 1, block):
            for offset in range(self.stride):
                first = block_start + offset
                out.append(tuple(range(first, first + block, self.stride)))
        return out


class FlexiblePlacementStrategy(PlacementStrategy):
    """Give each process an explicit list of resource ranks (all on one node).

    Ranks are counted across the node group(s) (``node_group=None``: the whole cluster, node 1's first accelerator
    is rank ``accelerators_per_node(0)``). Processes keep the given order; several processes may share a resource.

    Example:
        >>> FlexiblePlacementStrategy([[0, 1], [2]]).resource_ranks_per_process(8)
        [(0, 1), (2,)]
    """

    def __init__(
        self, hardware_ranks_list: Sequence[Sequence[int]], node_group: str | Sequence[str] | None = None
    ) -> None:
        """Create the strategy.

        Args:
            hardware_ranks_list: For each process, its resource ranks (sorted ascending on use).
            node_group: Node group label(s) the ranks refer to; ``None`` means the whole cluster.

        Raises:
            ValueError: If the list or an entry is empty, a rank is negative, or a process lists a rank twice.
        """
        super().__init__(node_group)
        given: object = hardware_ranks_list
        if isinstance(given, str) or not hardware_ranks_list:
            raise ValueError(
                f"FlexiblePlacementStrategy: expected a non-empty list of rank lists, got {hardware_ranks_list!r}"
            )
        lists: list[tuple[int, ...]] = []
        for i, ranks in enumerate(hardware_ranks_list):
            entry: object = ranks
            if isinstance(entry, str | int) or not ranks:
                raise ValueError(
                    f"FlexiblePlacementStrategy: process {i} needs a non-empty list of ranks, got {ranks!r}"
                )
            for r in ranks:
                _check_int(f"FlexiblePlacementStrategy: process {i} rank", r, 0)
            if len(set(ranks)) != len(ranks):
                raise ValueError(f"FlexiblePlacementStrategy: process {i} lists a rank twice: {list(ranks)}")
            lists.append(tuple(sorted(ranks)))
        self.hardware_ranks_list: tuple[tuple[int, ...], ...] = tuple(lists)

    def __repr__(self) -> str:
        return f"FlexiblePlacementStrategy({[list(r) for r in self.hardware_ranks_list]}, node_group={','.join(self._labels)!r})"

    def resource_ranks_per_process(self, num_resources: int) -> list[tuple[int, ...]]:
        """See :class:`PlacementStrategy`."""
        return list(self.hardware_ranks_list)


class NodePlacementStrategy(PlacementStrategy):
    """One process per listed node rank; each sees all accelerators of its node.

    Node ranks are counted inside the node group (default: every node of the cluster). A node may be listed several
    times to run several processes there.

    Example:
        >>> NodePlacementStrategy([0, 0, 1]).resource_ranks_per_process(2)
        [(0,), (0,), (1,)]
    """

    def __init__(self, node_ranks: Sequence[int], node_group: str | Sequence[str] | None = None) -> None:
        """Create the strategy.

        Args:
            node_ranks: Node rank of each process (within the node group).
            node_group: Node group label(s); ``None`` means every node (the reserved ``node`` group).

        Raises:
            ValueError: If the list is empty or a rank is negative.
        """
        super().__init__("node" if node_group is None else node_group)
        if isinstance(node_ranks, str | int) or not node_ranks:
            raise ValueError(
                f"NodePlacementStrategy: expected a non-empty list of node ranks, got {node_ranks!r}"
            )
        self.node_ranks = tuple(_check_int("NodePlacementStrategy: node rank", r, 0) for r in node_ranks)

    def __repr__(self) -> str:
        return f"NodePlacementStrategy({list(self.node_ranks)}, node_group={','.join(self._labels)!r})"

    def resource_ranks_per_process(self, num_resources: int) -> list[tuple[int, ...]]:
        """See :class:`PlacementStrategy`."""
        return [(r,) for r in self.node_ranks]

    def get_placement(self, cluster: ClusterView) -> list[Placement]:
        """Resolve on ``cluster``; the node group's nodes are the resources whatever hardware they have.

        Raises:
            ValueError: If a node rank is outside the node group or the group is unknown.
        """
        nodes: list[_Resource] = []
        for label in self._labels:
            group = _find_group(cluster, label)
            ranks = range(cluster.num_nodes) if group is None else group.node_ranks
            nodes.extend(_Resource(n, 0, label, "node") for n in ranks)
        space = _ResourceSpace(
            labels=self._labels, resources=tuple(nodes), words=("node",) * len(self._labels)
        )
        try:
            return build_placements(cluster, space, self.resource_ranks_per_process(len(nodes)))
        except ValueError as e:
            raise ValueError(f"{self!r}: {e}") from None
