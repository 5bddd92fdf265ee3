"""The placement search: candidate placements, the step-time model, and the ranking (pure, no Ray).

A candidate gives each component a block of accelerator slots (its ranks: one per slot) and the number of
rollout pipeline stages. The model predicts a training step's seconds from per-call costs fitted on profiled
runs (:mod:`rlinf_runners.autoplace._fit`):

- a call of a component (an env step of one pipeline stage, one inference, one actor update) needs
  ``fixed_s + split_s * share`` CPU seconds on one rank, ``share`` being the rank's part of the batch
  (``1 / (ranks * stages)`` for env and rollout, ``1 / ranks`` for the actor), and runs ``parallelism``
  threads' worth of it at once (a physics engine's worker threads, torch's intra-op threads): alone, it takes
  ``cpu / parallelism`` seconds;
- a node's ``cores`` bound what runs at once: a phase takes at least the CPU seconds its busy processes need
  on the node over its cores (over the part of them that several ranks of the component got together when
  profiled, ``node_share``);
- embodied steps alternate env and rollout once per chunk step and stage, then the actor trains. With two or
  more pipeline stages env and rollout overlap, one stage simulating while the other is inferred — on real
  accelerators only when they do not share a slot (a slot runs one thing at a time); on simulated slots,
  which are labels on a CPU machine, whenever the cores allow;
- reasoning and agent steps run generation, reward and the actor one after the other;
- a step also pays the weight sync and a constant overhead (what the profiled steps took beyond the model).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import Literal

import attrs

__all__ = [
    "CallCost",
    "Candidate",
    "EmbodiedCosts",
    "Machine",
    "SequentialCosts",
    "blocks",
    "candidates",
    "predict",
]

Mode = Literal["collocated", "disaggregated", "hybrid"]


@attrs.frozen
class CallCost:
    """One call on one rank: ``fixed_s + split_s * share`` CPU seconds, ``parallelism`` of them at a time."""

    fixed_s: float = attrs.field(validator=attrs.validators.ge(0.0))
    split_s: float = attrs.field(validator=attrs.validators.ge(0.0))
    parallelism: float = attrs.field(default=1.0, validator=attrs.validators.gt(0.0))
    """CPU seconds per wall-clock second of one rank's call with no other rank of its component on the node
    (below 1 when even one thread did not get a whole core)."""
    node_share: float | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.gt(0.0))
    )
    """With several ranks of the component busy on one node: the CPU seconds per wall-clock second they got
    together, as a part of the node's cores (measured where several shared a node: ranks that wait on each
    other's collectives or on memory turn fewer of the cores into CPU time); ``None``: all of them."""

    def seconds(self, share: float) -> float:
        """CPU seconds of one call."""
        return self.fixed_s + self.split_s * share

    def wall(self, share: float) -> float:
        """Wall-clock seconds of one call with cores to spare."""
        return self.seconds(share) / self.parallelism


@attrs.frozen
class Machine:
    """The cluster the search places on."""

    nodes: int = attrs.field(validator=attrs.validators.ge(1))
    slots_per_node: int = attrs.field(validator=attrs.validators.ge(1))
    cores: float = attrs.field(validator=attrs.validators.gt(0.0))
    """CPU cores of a node that the workers' processes share."""
    simulated: bool = True
    """Simulated slots (labels on CPU processes): components overlap whenever the cores allow; real
    accelerators run one thing at a time per slot."""

    @property
    def slots(self) -> int:
        """All slots of the cluster."""
        return self.nodes * self.slots_per_node


@attrs.frozen
class Candidate:
    """A placement: each component's block of slots ``[lo, hi)`` (one rank per slot) and the pipeline stages."""

    blocks: tuple[tuple[str, tuple[int, int]], ...]
    """``(component, (lo, hi))`` pairs in the app's component order."""
    stages: int = 1

    def block(self, component: str) -> tuple[int, int]:
        """The slots of ``component``."""
        return dict(self.blocks)[component]

    def ranks(self, component: str) -> int:
        """Ranks of ``component`` (one per slot)."""
        lo, hi = self.block(component)
        return hi - lo

    @property
    def mode(self) -> Mode:
        """``collocated`` (one block for all), ``disaggregated`` (pairwise disjoint blocks) or ``hybrid``."""
        spans = [b for _, b in self.blocks]
        if len(set(spans)) == 1:
            return "collocated"
        if all(_disjoint(a, b) for a, b in itertools.combinations(spans, 2)):
            return "disaggregated"
        return "hybrid"

    def component_placement(self) -> dict[str, str]:
        """The ``cluster.component_placement`` mapping: components with the same block share a key."""
        by_block: dict[tuple[int, int], list[str]] = {}
        for name, b in self.blocks:
            by_block.setdefault(b, []).append(name)
        return {",".join(names): _slots_text(b) for b, names in by_block.items()}

    def describe(self) -> str:
        """One line: ``actor: 0-1, env,rollout: 2-3 (2 stages)``."""
        parts = ", ".join(f"{k}: {v}" for k, v in self.component_placement().items())
        return f"{parts} ({self.stages} stage{'s' if self.stages > 1 else ''})"


def _slots_text(block: tuple[int, int]) -> str:
    lo, hi = block
    return str(lo) if hi - lo == 1 else f"{lo}-{hi - 1}"


def _disjoint(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[1] <= b[0] or b[1] <= a[0]


def blocks(machine: Machine) -> list[tuple[int, int]]:
    """The slot blocks a component may get: aligned blocks whose size divides a node, or whole nodes.

    Sizes are the divisors of ``slots_per_node`` (a block inside one node, starting at a multiple of its size)
    and multiples of a node that divide the cluster (whole nodes), as accelerator topologies are cut.
    """
    k, total = machine.slots_per_node, machine.slots
    sizes = [s for s in range(1, k + 1) if k % s == 0]
    sizes += [k * m for m in range(2, machine.nodes + 1) if machine.nodes % m == 0]
    return [(lo, lo + s) for s in sizes for lo in range(0, total, s)]


def candidates(
    components: Sequence[str], machine: Machine, stage_options: Sequence[int] = (1,)
) -> Iterator[Candidate]:
    """Every assignment of a block to each component, for each stage count (equal up to slot order or not)."""
    options = blocks(machine)
    for combo in itertools.product(options, repeat=len(components)):
        for stages in stage_options:
            yield Candidate(tuple(zip(components, combo, strict=True)), stages)


# -------------------------------------------------------------------------------------------------- costs
@attrs.frozen
class EmbodiedCosts:
    """An embodied (env ↔ rollout loop, then actor) step's costs."""

    env: CallCost
    """One env call: stepping one pipeline stage's envs of one rank for one chunk."""
    rollout: CallCost
    """One inference call: one stage's observations of the env ranks a rollout rank serves."""
    actor: CallCost
    """The actor's update of one step on one rank (receiving the batch, advantages, the epochs)."""
    chunks: float
    """Chunk steps per training step (each: every stage once through env and rollout)."""
    sync_s: float = 0.0
    """Weight sync per step."""
    overhead_s: float = 0.0
    """Constant per step beyond the model (driver, messages)."""


@attrs.frozen
class SequentialCosts:
    """A reasoning / agent step's costs: its phases run one after another."""

    phases: tuple[tuple[str, CallCost], ...]
    """``(component, cost of its part of one step)`` in order (a component may appear more than once)."""
    sync_s: float = 0.0
    overhead_s: float = 0.0


def _per_node(candidate: Candidate, component: str, machine: Machine) -> int:
    """The most ranks of ``component`` on one node."""
    lo, hi = candidate.block(component)
    k = machine.slots_per_node
    return max(min(hi, (n + 1) * k) - max(lo, n * k) for n in range(lo // k, (hi - 1) // k + 1))


def _phase(cost: CallCost, share: float, processes: int, machine: Machine) -> float:
    """Wall seconds of ``processes`` ranks each making the call at once on one node."""
    cores = machine.cores
    if processes > 1 and cost.node_share is not None:
        cores *= cost.node_share
    return max(cost.wall(share), processes * cost.seconds(share) / cores)


def _shared_nodes(candidate: Candidate, a: str, b: str, machine: Machine) -> bool:
    k = machine.slots_per_node
    (la, ha), (lb, hb) = candidate.block(a), candidate.block(b)
    return bool(set(range(la // k, (ha - 1) // k + 1)) & set(range(lb // k, (hb - 1) // k + 1)))


def predict(candidate: Candidate, costs: EmbodiedCosts | SequentialCosts, machine: Machine) -> float:
    """Predicted seconds of one training step of ``candidate`` on ``machine``."""
    if isinstance(costs, SequentialCosts):
        total = costs.sync_s + costs.overhead_s
        for component, cost in costs.phases:
            n = candidate.ranks(component)
            total += _phase(cost, 1.0 / n, _per_node(candidate, component, machine), machine)
        return total
    s = candidate.stages
    n_env, n_roll, n_act = (candidate.ranks(c) for c in ("env", "rollout", "actor"))
    share_env, share_roll = 1.0 / (n_env * s), 1.0 / (n_roll * s)
    env_procs, roll_procs = _per_node(candidate, "env", machine), _per_node(candidate, "rollout", machine)
    overlap = s > 1 and (machine.simulated or _disjoint(candidate.block("env"), candidate.block("rollout")))
    if overlap:
        # the longer of the critical path (stages alternate, one fill/drain per chunk) and the CPU seconds the
        # busy processes of a node need of its cores
        env_w, infer_w = costs.env.wall(share_env), costs.rollout.wall(share_roll)
        pipelined = s * max(env_w, infer_w) + min(env_w, infer_w)
        work = env_procs * costs.env.seconds(share_env)
        shared = _shared_nodes(candidate, "env", "rollout", machine)
        work_roll = roll_procs * costs.rollout.seconds(share_roll)
        per_chunk = max(
            pipelined, s * (work + work_roll) / machine.cores if shared else s * work / machine.cores
        )
        if not shared:
            per_chunk = max(per_chunk, s * work_roll / machine.cores)
    else:
        per_chunk = s * (
            _phase(costs.env, share_env, env_procs, machine)
            + _phase(costs.rollout, share_roll, roll_procs, machine)
        )
    actor = _phase(costs.actor, 1.0 / n_act, _per_node(candidate, "actor", machine), machine)
    return costs.chunks * per_chunk + actor + costs.sync_s + costs.overhead_s


def rank_candidates(
    pool: Sequence[Candidate], costs: EmbodiedCosts | SequentialCosts, machine: Machine
) -> list[tuple[float, Candidate]]:
    """``(predicted seconds, candidate)`` fastest first; ties go to fewer slots, then to fewer stages."""
    scored = [(predict(c, costs, machine), c) for c in pool]
    return sorted(scored, key=lambda x: (round(x[0], 9), _slots_used(x[1]), x[1].stages, x[1].blocks))


def _slots_used(candidate: Candidate) -> int:
    used: set[int] = set()
    for _, (lo, hi) in candidate.blocks:
        used.update(range(lo, hi))
    return len(used)


def canonical(candidate: Candidate, machine: Machine) -> tuple[object, ...]:
    """A key equal for candidates that differ only by which nodes, and which slots of a node, they use.

    Nodes and the slots of each node are numbered in the order the components first use them; each
    component's block becomes the set of ``(node, slot)`` numbers it covers.
    """
    k = machine.slots_per_node
    nodes: dict[int, int] = {}
    slots: dict[int, int] = {}
    key = []
    for name, (lo, hi) in candidate.blocks:
        covered = []
        for slot in range(lo, hi):
            node = nodes.setdefault(slot // k, len(nodes))
            slots.setdefault(slot, sum(1 for s in slots if s // k == slot // k))
            covered.append((node, slots[slot]))
        key.append((name, frozenset(covered)))
    return (tuple(key), candidate.stages)


def usage_table(scored: Sequence[tuple[float, Candidate]]) -> Mapping[str, tuple[float, Candidate]]:
    """The best ``(predicted seconds, candidate)`` of each mode among ``scored`` (sorted fastest first)."""
    best: dict[str, tuple[float, Candidate]] = {}
    for seconds, c in scored:
        best.setdefault(c.mode, (seconds, c))
    return best
