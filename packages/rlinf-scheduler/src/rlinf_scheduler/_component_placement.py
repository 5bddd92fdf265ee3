"""Component placement: ``cluster.component_placement`` → one placement strategy per component.

:class:`ComponentPlacement` parses every entry and resolves it on the cluster when it is built, so an invalid
placement is a ``ValueError`` (quoting the component and the text) before anything launches.
:class:`HybridComponentPlacement` allows any overlap (embodied runs); :class:`ModelParallelComponentPlacement`
(reasoning runs) detects collocated / disaggregated layouts of actor and rollout and honours their
tensor/pipeline parallel sizes. :func:`resolve_placement` does it all on paper, without Ray.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._config import ClusterConfig, NodeGroupConfig, normalize_node_group_labels
from ._placement import (
    ClusterView,
    FlexiblePlacementStrategy,
    PackedPlacementStrategy,
    Placement,
    PlacementStrategy,
    StaticClusterView,
    _view_node_groups,
    build_placements,
    resource_space,
)
from ._placement_grammar import parse_placement, segments_to_process_resources

__all__ = [
    "ComponentPlacement",
    "HybridComponentPlacement",
    "ModelParallelComponentPlacement",
    "PlacementMode",
    "resolve_placement",
]


class PlacementMode(enum.Enum):
    """How the components of a run share devices.

    COLLOCATED: actor and rollout use the same devices (weights sync in place).
    DISAGGREGATED: the model-parallel components use disjoint devices (they run as a pipeline).
    HYBRID: any overlap is allowed (embodied runs).
    """

    COLLOCATED = "collocated"
    DISAGGREGATED = "disaggregated"
    HYBRID = "hybrid"


@attrs.frozen
class _Entry:
    key: str
    text: str
    labels: tuple[str, ...]
    strategy: PlacementStrategy
    placements: tuple[Placement, ...]


@attrs.frozen
class _ViewWithGroups:
    """A cluster view that lacks node groups, completed with the config's."""

    view: ClusterView
    node_groups: tuple[NodeGroupConfig, ...]

    @property
    def num_nodes(self) -> int:
        return self.view.num_nodes

    @property
    def accelerator_type(self) -> str:
        return self.view.accelerator_type

    def accelerators_per_node(self, node_rank: int) -> int:
        return self.view.accelerators_per_node(node_rank)


def _as_cluster_config(cluster_config: ClusterConfig | Mapping[str, Any]) -> ClusterConfig:
    if isinstance(cluster_config, ClusterConfig):
        return cluster_config
    if isinstance(cluster_config, Mapping):
        section = cluster_config.get("cluster", cluster_config)
        if not isinstance(section, Mapping):
            raise ValueError(f"cluster: expected a mapping, got {section!r}")
        return ClusterConfig.from_dict(section)
    raise ValueError(
        f"cluster_config: expected a ClusterConfig or a mapping, got {type(cluster_config).__name__}"
    )


def _split_value(key: str, value: Any) -> tuple[tuple[str, ...], str]:
    if isinstance(value, Mapping):
        labels = normalize_node_group_labels(value.get("node_group"))
        return labels, str(value["placement"])
    return ("cluster",), str(value)


class ComponentPlacement:
    """Parse ``cluster.component_placement`` and resolve each component on ``cluster``.

    Args:
        cluster_config: A :class:`ClusterConfig`, or a mapping accepted by :meth:`ClusterConfig.from_dict`
            (the ``cluster`` section, or a whole config holding a ``cluster`` key).
        cluster: The cluster: the runtime ``Cluster`` or any :class:`ClusterView`.

    Raises:
        ValueError: If an entry is invalid (grammar, out-of-range ranks, a process spanning nodes, unknown node
            group, a component placed twice); the message names the component and quotes the placement.

    Example:
        >>> from rlinf_scheduler import StaticClusterView
        >>> cp = HybridComponentPlacement({"component_placement": {"actor": "0-7", "env,rollout": "0-3"}},
        ...                               StaticClusterView(num_nodes=1, accelerators=8))
        >>> cp.get_world_size("actor"), [p.local_accelerators for p in cp.get_placements("env")]
        (8, [(0,), (1,), (2,), (3,)])
    """

    def __init__(self, cluster_config: ClusterConfig | Mapping[str, Any], cluster: ClusterView) -> None:
        self._config = _as_cluster_config(cluster_config)
        if not _view_node_groups(cluster) and self._config.node_groups:
            cluster = _ViewWithGroups(cluster, self._config.node_groups)
        self._cluster: ClusterView = cluster
        self._entries: dict[str, _Entry] = {}
        for key, value in self._config.component_placement.items():
            names = [n.strip() for n in key.split(",")]
            labels, text = _split_value(key, value)
            where = f"component_placement[{key!r}]"
            try:
                space = resource_space(cluster, labels)
                segments = parse_placement(text, num_resources=len(space.resources), resource_name=space.word)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            per_process = segments_to_process_resources(segments)
            try:
                placements = build_placements(cluster, space, per_process)
            except ValueError as e:
                raise ValueError(f"{where}: placement {text!r}: {e}") from None
            strategy = FlexiblePlacementStrategy(per_process, node_group=labels)
            for name in names:
                if name in self._entries:
                    raise ValueError(
                        f"{where} = {text!r}: component {name!r} is already placed by "
                        f"component_placement[{self._entries[name].key!r}]; each component may appear once"
                    )
                self._entries[name] = _Entry(key, text, labels, strategy, tuple(placements))

    def _replace_strategy(self, name: str, strategy: PlacementStrategy) -> None:
        entry = self._entries[name]
        try:
            placements = strategy.get_placement(self._cluster)
        except ValueError as e:
            raise ValueError(
                f"component_placement[{entry.key!r}] = {entry.text!r} (component {name!r}): {e}"
            ) from None
        self._entries[name] = attrs.evolve(entry, strategy=strategy, placements=tuple(placements))

    def _entry(self, name: str) -> _Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"unknown component {name!r}; placed components: {self.components}") from None

    @property
    def cluster_config(self) -> ClusterConfig:
        """The cluster configuration this placement was parsed from."""
        return self._config

    @property
    def placement_mode(self) -> PlacementMode:
        """How components share devices (:attr:`PlacementMode.HYBRID` for this class)."""
        return PlacementMode.HYBRID

    @property
    def components(self) -> list[str]:
        """Component names, in configuration order."""
        return list(self._entries)

    def has_component(self, name: str) -> bool:
        """Whether ``name`` is placed."""
        return name in self._entries

    def get_strategy(self, name: str) -> PlacementStrategy:
        """The placement strategy to launch ``name`` with.

        Raises:
            KeyError: If ``name`` is not placed (the message lists the placed components).
        """
        return self._entry(name).strategy

    def get_placements(self, name: str) -> list[Placement]:
        """The resolved placements of ``name``, one per process in rank order."""
        return list(self._entry(name).placements)

    def get_world_size(self, name: str) -> int:
        """Number of processes of ``name``."""
        return len(self._entry(name).placements)

    def get_hardware_ranks(self, name: str) -> list[int]:
        """Resource ranks (accelerators, hardware units or nodes) ``name`` uses, ascending."""
        return sorted({r for p in self._entry(name).placements for r in p.resource_ranks})

    def get_node_group(self, name: str) -> tuple[str, ...]:
        """Node group label(s) the resource ranks of ``name`` refer to."""
        return self._entry(name).labels

    def placements(self) -> dict[str, list[Placement]]:
        """All components' placements: ``{component: [Placement, ...]}``."""
        return {name: list(entry.placements) for name, entry in self._entries.items()}


class HybridComponentPlacement(ComponentPlacement):
    """Component placement for embodied runs: any overlap between components is allowed.

    Args:
        cluster_config: See :class:`ComponentPlacement`.
        cluster: See :class:`ComponentPlacement`.
    """


_MODEL_PARALLEL = ("actor", "rollout", "inference", "critic", "critic_inference")


def _check_size(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected an integer >= 1, got {value!r}")
    return value


class ModelParallelComponentPlacement(ComponentPlacement):
    """Component placement for reasoning runs with model-parallel actor and rollout.

    Components: ``actor`` and ``rollout`` (required), ``inference`` (or RLinf's ``actor_inference``), ``critic``,
    ``critic_inference``, ``reward`` (optional); other components keep their grammar placement. The model-parallel
    ones must use one process per accelerator on a contiguous range. The mode is

    - collocated when actor and rollout use the same accelerators (no ``inference`` then);
    - disaggregated when actor, rollout, inference, critic and critic_inference are pairwise disjoint
      (``reward`` may overlap anything);
    - otherwise a ``ValueError`` explaining which components overlap.

    The actor gets one process per accelerator; the rollout one process per ``rollout_tp_size`` accelerators when
    collocated, per ``rollout_tp_size * rollout_pp_size`` when disaggregated (as in RLinf).

    Args:
        cluster_config: See :class:`ComponentPlacement`.
        cluster: See :class:`ComponentPlacement`.
        actor_tp_size: Actor tensor parallel size (RLinf ``actor.model.tensor_model_parallel_size``).
        actor_pp_size: Actor pipeline parallel size (``actor.model.pipeline_model_parallel_size``).
        actor_cp_size: Actor context parallel size (``actor.model.context_parallel_size``).
        rollout_tp_size: Rollout tensor parallel size (``rollout.tensor_parallel_size``).
        rollout_pp_size: Rollout pipeline parallel size (``rollout.pipeline_parallel_size``).
        inference_tp_size: Inference tensor parallel size; ``None``: the actor's.
        inference_pp_size: Inference pipeline parallel size; ``None``: the actor's.

    Raises:
        ValueError: On an invalid placement, a layout that is neither collocated nor disaggregated, or parallel
            sizes that do not fit the accelerators.
    """

    def __init__(
        self,
        cluster_config: ClusterConfig | Mapping[str, Any],
        cluster: ClusterView,
        *,
        actor_tp_size: int = 1,
        actor_pp_size: int = 1,
        actor_cp_size: int = 1,
        rollout_tp_size: int = 1,
        rollout_pp_size: int = 1,
        inference_tp_size: int | None = None,
        inference_pp_size: int | None = None,
    ) -> None:
        super().__init__(cluster_config, cluster)
        self._actor_tp = _check_size("actor_tp_size", actor_tp_size)
        self._actor_pp = _check_size("actor_pp_size", actor_pp_size)
        self._actor_cp = _check_size("actor_cp_size", actor_cp_size)
        self._rollout_tp = _check_size("rollout_tp_size", rollout_tp_size)
        self._rollout_pp = _check_size("rollout_pp_size", rollout_pp_size)
        self._inference_tp = _check_size(
            "inference_tp_size", actor_tp_size if inference_tp_size is None else inference_tp_size
        )
        self._inference_pp = _check_size(
            "inference_pp_size", actor_pp_size if inference_pp_size is None else inference_pp_size
        )
        if self.has_component("inference") and self.has_component("actor_inference"):
            raise ValueError(
                "component_placement: give 'inference' or its RLinf alias 'actor_inference', not both"
            )
        self._inference_name = "actor_inference" if self.has_component("actor_inference") else "inference"
        missing = [c for c in ("actor", "rollout") if not self.has_component(c)]
        if missing:
            raise ValueError(
                f"ModelParallelComponentPlacement: component_placement must place {missing}; "
                f"placed: {self.components}"
            )
        self._devices: dict[str, list[int]] = {}
        for name in (*_MODEL_PARALLEL, "actor_inference"):
            if self.has_component(name):
                self._devices[name] = self._check_model_parallel_component(name)
        self._mode = self._detect_mode()
        self._check_sizes()
        self._generate_strategies()

    # -- validation --------------------------------------------------------------------------------------------

    def _where(self, name: str) -> str:
        entry = self._entry(name)
        return f"component_placement[{entry.key!r}] = {entry.text!r} (component {name!r})"

    def _check_model_parallel_component(self, name: str) -> list[int]:
        placements = self.get_placements(name)
        others = sorted({p.resource_kind for p in placements} - {"accelerator"})
        if others:
            raise ValueError(
                f"{self._where(name)}: model-parallel components need accelerators, but its node group(s) give "
                f"{' and '.join(others)} resources (set simulated_accelerators_per_node on a CPU-only machine)"
            )
        if any(len(p.resource_ranks) != 1 for p in placements) or len(
            {p.resource_ranks for p in placements}
        ) != len(placements):
            raise ValueError(
                f"{self._where(name)}: model-parallel components take one process per accelerator "
                "(tensor/pipeline parallel sizes group them); write the accelerators without ':process_ranks'"
            )
        devices = self.get_hardware_ranks(name)
        if devices != list(range(devices[0], devices[-1] + 1)):
            raise ValueError(f"{self._where(name)}: accelerators {devices} must be contiguous")
        return devices

    def _physical(self, name: str) -> set[tuple[int, int]]:
        return {(p.node_rank, d) for p in self.get_placements(name) for d in p.local_accelerators}

    def _detect_mode(self) -> PlacementMode:
        actor = self._devices["actor"]
        inference = self._devices.get(self._inference_name)
        # Compare physical devices (node, index): equal ranks in different node groups are different devices.
        if self._physical("actor") == self._physical("rollout"):
            if inference is not None:
                raise ValueError(
                    f"{self._where(self._inference_name)}: collocated mode (actor and rollout share accelerators "
                    f"{actor}) does not use a separate inference component; remove it or disaggregate"
                )
            if "critic_inference" in self._devices:
                raise ValueError(
                    f"{self._where('critic_inference')}: collocated mode does not use a separate critic_inference"
                )
            return PlacementMode.COLLOCATED
        overlaps: list[str] = []
        names = [n for n in (*_MODEL_PARALLEL, "actor_inference") if n in self._devices]
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                other = self._physical(b)
                shared = sorted(
                    r
                    for p in self.get_placements(a)
                    for r, d in zip(p.resource_ranks, p.local_accelerators, strict=True)
                    if (p.node_rank, d) in other
                )
                if shared:
                    groups = self.get_node_group(a), self.get_node_group(b)
                    ranks_of = (
                        f" (ranks of {a}'s node group {','.join(groups[0])})"
                        if groups[0] != groups[1]
                        else ""
                    )
                    overlaps.append(
                        f"{a} {self._devices[a]} and {b} {self._devices[b]} share {shared}{ranks_of}"
                    )
        if overlaps:
            raise ValueError(
                "component_placement: neither collocated (actor and rollout on the same accelerators) nor "
                "disaggregated (actor, rollout, inference, critic, critic_inference on disjoint accelerators): "
                + "; ".join(overlaps)
                + f". Placements: { {n: self._entry(n).text for n in names} }"
            )
        return PlacementMode.DISAGGREGATED

    def _check_sizes(self) -> None:
        actor_n, rollout_n = len(self._devices["actor"]), len(self._devices["rollout"])
        actor_mp = self._actor_tp * self._actor_pp * self._actor_cp
        if actor_n % actor_mp:
            raise ValueError(
                f"{self._where('actor')}: {actor_n} accelerators are not divisible by actor_tp_size * actor_pp_size "
                f"* actor_cp_size = {self._actor_tp} * {self._actor_pp} * {self._actor_cp}"
            )
        if rollout_n % (self._rollout_tp * self._rollout_pp):
            raise ValueError(
                f"{self._where('rollout')}: {rollout_n} accelerators are not divisible by rollout_tp_size * "
                f"rollout_pp_size = {self._rollout_tp} * {self._rollout_pp}"
            )
        if (
            self._mode is PlacementMode.COLLOCATED
            and self._actor_tp > self._rollout_tp
            and self._actor_tp % self._rollout_tp
        ):
            raise ValueError(
                f"collocated mode: actor_tp_size {self._actor_tp} must be a multiple of rollout_tp_size "
                f"{self._rollout_tp}"
            )
        if self._inference_name in self._devices:
            inf_n = len(self._devices[self._inference_name])
            inf_mp = self._inference_tp * self._inference_pp
            if inf_n % inf_mp:
                raise ValueError(
                    f"{self._where(self._inference_name)}: {inf_n} accelerators are not divisible by "
                    f"inference_tp_size * inference_pp_size = {self._inference_tp} * {self._inference_pp}"
                )

    def _generate_strategies(self) -> None:
        for name in (*_MODEL_PARALLEL, "actor_inference"):
            if name not in self._devices:
                continue
            devices = self._devices[name]
            per_process = 1
            if name == "rollout":
                per_process = self._rollout_tp * (
                    self._rollout_pp if self._mode is PlacementMode.DISAGGREGATED else 1
                )
            strategy = PackedPlacementStrategy(
                devices[0],
                devices[-1],
                num_hardware_per_process=per_process,
                node_group=self.get_node_group(name),
            )
            self._replace_strategy(name, strategy)

    # -- properties --------------------------------------------------------------------------------------------

    @property
    def placement_mode(self) -> PlacementMode:
        """:attr:`PlacementMode.COLLOCATED` or :attr:`PlacementMode.DISAGGREGATED`."""
        return self._mode

    @property
    def is_collocated(self) -> bool:
        """Actor and rollout share their accelerators."""
        return self._mode is PlacementMode.COLLOCATED

    @property
    def is_disaggregated(self) -> bool:
        """The model-parallel components use disjoint accelerators."""
        return self._mode is PlacementMode.DISAGGREGATED

    @property
    def has_dedicated_inference(self) -> bool:
        """An ``inference`` (or ``actor_inference``) component has its own accelerators."""
        return self._inference_name in self._devices

    @property
    def actor_tp_size(self) -> int:
        """Actor tensor parallel size."""
        return self._actor_tp

    @property
    def actor_pp_size(self) -> int:
        """Actor pipeline parallel size."""
        return self._actor_pp

    @property
    def actor_cp_size(self) -> int:
        """Actor context parallel size."""
        return self._actor_cp

    @property
    def actor_world_size(self) -> int:
        """Accelerators (= processes) of the actor."""
        return len(self._devices["actor"])

    @property
    def actor_dp_size(self) -> int:
        """Actor data parallel size: accelerators / (tp * pp * cp)."""
        return self.actor_world_size // (self._actor_tp * self._actor_pp * self._actor_cp)

    @property
    def rollout_tp_size(self) -> int:
        """Rollout tensor parallel size."""
        return self._rollout_tp

    @property
    def rollout_pp_size(self) -> int:
        """Rollout pipeline parallel size."""
        return self._rollout_pp

    @property
    def rollout_world_size(self) -> int:
        """Accelerators of the rollout (RLinf's meaning; the process count is ``get_world_size("rollout")``)."""
        return len(self._devices["rollout"])

    @property
    def rollout_dp_size(self) -> int:
        """Rollout data parallel size: accelerators / (tp * pp)."""
        return self.rollout_world_size // (self._rollout_tp * self._rollout_pp)

    @property
    def inference_tp_size(self) -> int:
        """Inference tensor parallel size (the actor's unless given)."""
        return self._inference_tp

    @property
    def inference_pp_size(self) -> int:
        """Inference pipeline parallel size (the actor's unless given)."""
        return self._inference_pp

    @property
    def inference_world_size(self) -> int:
        """Accelerators of the inference component (0 if none)."""
        return len(self._devices.get(self._inference_name, ()))

    @property
    def inference_dp_size(self) -> int:
        """Inference data parallel size (0 if none)."""
        return self.inference_world_size // (self._inference_tp * self._inference_pp)

    @property
    def critic_world_size(self) -> int:
        """Accelerators of the critic (0 if none)."""
        return len(self._devices.get("critic", ()))

    @property
    def reward_world_size(self) -> int:
        """Processes of the reward component (0 if none)."""
        return self.get_world_size("reward") if self.has_component("reward") else 0


def resolve_placement(
    component_placement: Mapping[str, Any] | ClusterConfig,
    *,
    num_nodes: int,
    accelerators_per_node: int | Sequence[int],
    node_groups: Sequence[NodeGroupConfig | Mapping[str, Any]] = (),
    accelerator_type: str = "cpu",
) -> dict[str, list[Placement]]:
    """Resolve a ``component_placement`` on a cluster described on paper (no Ray).

    Args:
        component_placement: ``{component(s): placement}`` as in ``cluster.component_placement``, or a
            :class:`ClusterConfig` (its ``component_placement`` and ``node_groups`` are used).
        num_nodes: Number of nodes.
        accelerators_per_node: Accelerators on every node, or one count per node (0: nodes are the resources).
        node_groups: Node groups (``NodeGroupConfig`` or RLinf-shaped mappings), when not given by a ClusterConfig.
        accelerator_type: Accelerator type reported in the placements.

    Returns:
        ``{component: [Placement, ...]}`` with one placement per process in rank order.

    Raises:
        ValueError: If any entry is invalid; the message names the component and quotes the placement text.

    Example:
        >>> out = resolve_placement({"actor,env,rollout": "all"}, num_nodes=2, accelerators_per_node=8)
        >>> [(p.rank, p.node_rank, p.local_accelerators) for p in out["env"][7:9]]
        [(7, 0, (7,)), (8, 1, (0,))]
    """
    if isinstance(component_placement, ClusterConfig):
        if node_groups:
            raise ValueError("node_groups: give node groups in the ClusterConfig or as an argument, not both")
        groups: Any = component_placement.node_groups
        placement_map: Any = component_placement.component_placement
    else:
        groups, placement_map = node_groups, component_placement
    config = ClusterConfig(num_nodes=num_nodes, component_placement=placement_map, node_groups=groups)
    view = StaticClusterView(
        num_nodes=num_nodes,
        accelerators=accelerators_per_node,
        accelerator_type=accelerator_type,
        node_groups=config.node_groups,
    )
    return HybridComponentPlacement(config, view).placements()
