"""From profiled runs' timelines to the costs of the step-time model (:mod:`rlinf_runners.autoplace._model`).

A profiled run (``runner.profile: true``) leaves ``trace.json``: every rank's phases as spans, and the driver's
``train_step N`` / ``sync_weights`` spans that delimit steps; each span carries the CPU time its process used.
:func:`measure` reads one run's median step (the steps after the first; on a shared machine a step disturbed by
another tenant's burst is only ever slower, so the middle of the steps and not their mean is the run's steady
state): per call of each component its mean CPU seconds in those steps and how many cores' worth it ran at
once (CPU over busy wall time), the chunk steps per training step, the weight sync and the step time.
:func:`fit` turns the measurements of one or more runs into call costs (``fixed_s + split_s * share`` CPU
seconds, least squares over the runs' different shares; one run: all of it split), each call's parallelism
from the runs where the fewest of its ranks shared a node, the part of a node's cores several of its ranks got
together from the runs where they did (``node_share``), and a constant overhead (what the runs' steps took
beyond the model). A profiled placement's phases are thus predicted as they were measured, and its step time
as measured up to the spread of the runs' overheads.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import attrs
from rlinf_scheduler import DRIVER, Span, Timeline

from ._model import CallCost, Candidate, EmbodiedCosts, Machine, SequentialCosts, _per_node, predict

__all__ = ["Measured", "calibrate", "candidate_from_metadata", "effective_cores", "fit", "measure"]

Kind = Literal["embodied", "sequential"]

_ENV_CALL = "env_step"
_INFERENCE = "inference"
_SEQUENTIAL = ("rollout", "reward", "actor")
"""The phases of a reasoning / agent step, in order."""


@attrs.frozen
class Measured:
    """What one profiled run measured (seconds; per-call figures without contention)."""

    candidate: Candidate
    machine: Machine
    kind: Kind
    calls: Mapping[str, float]
    """Per component: one call's CPU seconds on one rank (env: one stage's env step; rollout: one inference;
    actor and the sequential phases: their whole part of a step)."""
    cpu_per_wall: Mapping[str, float]
    """Per component: CPU seconds per busy wall-clock second of its calls (``-1``: no CPU times recorded)."""
    chunks: float
    """Chunk steps per training step (embodied)."""
    sync_s: float
    step_s: float
    """Median measured step: the training step plus its weight sync."""
    steps: int
    """Steps measured (the first step of the run is left out when there are more); the per-call figures are
    those of the median one (the two middle ones when even)."""


def candidate_from_metadata(
    other: Mapping[str, Any], components: Sequence[str]
) -> tuple[Candidate, int, int]:
    """The placement a trace was recorded with, from its ``otherData``: ``(candidate, nodes, slots_per_node)``.

    Raises:
        ValueError: the trace holds no placement (not written by a ``runner.profile`` run), or it is not one
            block per component.
    """
    cluster = other.get("cluster")
    if not isinstance(cluster, Mapping) or "component_placement" not in cluster:
        raise ValueError(
            "the trace has no cluster placement in otherData (record it with runner.profile=true)"
        )
    nodes = int(cluster.get("num_nodes") or 1)
    per_node = cluster.get("simulated_accelerators_per_node")
    if not per_node:
        raise ValueError(
            "the trace's run used real accelerators: give --accelerators-per-node of its cluster"
        )
    stages = int(other.get("pipeline_stage_num") or 1)
    blocks: dict[str, tuple[int, int]] = {}
    for key, value in dict(cluster["component_placement"]).items():
        text = str(value).replace(" ", "")
        if text == "all":
            lo, hi = 0, nodes * int(per_node)
        elif "-" in text:
            a, b = text.split("-", 1)
            lo, hi = int(a), int(b) + 1
        elif text.isdigit():
            lo, hi = int(text), int(text) + 1
        else:
            raise ValueError(f"cluster.component_placement {key}: {value!r} is not one block of slots")
        for name in key.split(","):
            blocks[name.strip()] = (lo, hi)
    missing = [c for c in components if c not in blocks]
    if missing:
        raise ValueError(f"the trace's placement does not place {missing}")
    return Candidate(tuple((c, blocks[c]) for c in components), stages), nodes, int(per_node)


def measure(timeline: Timeline, candidate: Candidate, machine: Machine, kind: Kind) -> Measured:
    """The per-call costs, chunk count, sync and step time of one profiled run.

    Raises:
        ValueError: the timeline has no ``train_step`` span of the driver, or no env / inference spans in an
            embodied step.
    """
    driver = timeline.spans(DRIVER)
    windows = sorted((s for s in driver if s.name.startswith("train_step ")), key=lambda s: s.start_us)
    if not windows:
        raise ValueError("the trace has no 'train_step' span of the driver (profile at least one step)")
    if len(windows) > 1:
        windows = windows[1:]  # the first step pays one-off costs (channels, warm-up)
    measured = len(windows)
    windows = _middle(windows)
    syncs = sorted((s for s in driver if s.name == "sync_weights"), key=lambda s: s.start_us)
    sync_s = statistics.median(s.dur_us for s in (syncs[1:] or syncs)) / 1e6 if syncs else 0.0
    step_s = _mean([w.dur_us for w in windows]) / 1e6 + sync_s
    busy = _Busy(timeline)
    by_group: dict[str, list[str]] = {}
    for label in timeline.labels:
        by_group.setdefault(label.rsplit(":", 1)[0], []).append(label)
    calls: dict[str, float] = {}
    ratio: dict[str, float] = {}
    chunks = 0.0
    if kind == "embodied":
        env_spans = _named(timeline, by_group.get("env", []), _ENV_CALL, windows)
        infer_spans = _named(timeline, by_group.get("rollout", []), _INFERENCE, windows)
        if not env_spans or not infer_spans:
            raise ValueError(
                f"the trace's steps hold no '{_ENV_CALL}' or '{_INFERENCE}' spans (not an embodied run)"
            )
        for group, spans in (("env", env_spans), ("rollout", infer_spans)):
            calls[group], ratio[group] = _call_costs(busy, spans, machine.cores)
        n_env = len(by_group["env"])
        chunks = len(env_spans) / (len(windows) * n_env * candidate.stages)
        calls["actor"], ratio["actor"] = _phase_costs(
            timeline, busy, by_group.get("actor", []), windows, machine
        )
    else:
        for group in _SEQUENTIAL:
            calls[group], ratio[group] = _phase_costs(
                timeline, busy, by_group.get(group, []), windows, machine
            )
    return Measured(candidate, machine, kind, calls, ratio, chunks, sync_s, step_s, measured)


def effective_cores(runs: Sequence[Measured]) -> float | None:
    """The cores a node's busy processes actually got, from runs where several ran at once (``None``: none did).

    In a run where ``n`` ranks of the main CPU consumer (the env; generation for reasoning) share a node, their
    CPU seconds per wall-clock second add up to the cores they had: fewer than the node's when other
    processes (the rollout, Ray's own, other tenants) take a part. The mean over such runs, at most the
    node's cores, and at least what any one process of any run got (the node had that many).
    """
    estimates = []
    for run in runs:
        group = "env" if run.kind == "embodied" else "rollout"
        procs = _per_node(run.candidate, group, run.machine)
        ratio = run.cpu_per_wall.get(group, -1.0)
        if procs >= 2 and ratio > 0:
            estimates.append(min(run.machine.cores, procs * ratio))
    if not estimates:
        return None
    alone = max(ratio for run in runs for ratio in run.cpu_per_wall.values())
    return min(max(run.machine.cores for run in runs), max(_mean(estimates), alone))


def calibrate(runs: Sequence[Measured], machine: Machine) -> tuple[list[Measured], Machine]:
    """``runs`` and ``machine`` with a node's cores set to what the profiled processes got of it.

    The cores are :func:`effective_cores` (unchanged where no run tells), at most each machine's own.
    """
    cores = effective_cores(runs)
    if cores is None:
        return list(runs), machine
    out = [attrs.evolve(r, machine=attrs.evolve(r.machine, cores=min(cores, r.machine.cores))) for r in runs]
    return out, attrs.evolve(machine, cores=min(cores, machine.cores))


def fit(runs: Sequence[Measured]) -> EmbodiedCosts | SequentialCosts:
    """The model's costs from one or more measured runs of the same config (different placements).

    Raises:
        ValueError: no runs, or runs of different kinds.
    """
    if not runs:
        raise ValueError("fit needs at least one measured run")
    kind = runs[0].kind
    if any(r.kind != kind for r in runs):
        raise ValueError("fit: the runs are of different kinds (embodied and sequential)")
    sync_s = _mean([r.sync_s for r in runs])

    def cost(group: str, share: Callable[[Measured], float]) -> CallCost:
        call = _fit_call([(share(r), r.calls[group]) for r in runs])
        return attrs.evolve(call, **_concurrency(runs, group))

    costs: EmbodiedCosts | SequentialCosts
    if kind == "embodied":
        costs = EmbodiedCosts(
            env=cost("env", lambda r: 1.0 / (r.candidate.ranks("env") * r.candidate.stages)),
            rollout=cost("rollout", lambda r: 1.0 / (r.candidate.ranks("rollout") * r.candidate.stages)),
            actor=cost("actor", lambda r: 1.0 / r.candidate.ranks("actor")),
            chunks=_mean([r.chunks for r in runs]),
            sync_s=sync_s,
        )
    else:
        phases = tuple((g, cost(g, functools.partial(_rank_share, group=g))) for g in _SEQUENTIAL)
        costs = SequentialCosts(phases=phases, sync_s=sync_s)
    overhead = _mean([r.step_s - predict(r.candidate, costs, r.machine) for r in runs])
    return attrs.evolve(costs, overhead_s=overhead)


# ------------------------------------------------------------------------------------------------ helpers
def _concurrency(runs: Sequence[Measured], group: str) -> dict[str, Any]:
    """``parallelism`` and ``node_share`` of ``group``'s calls, as the runs measured them.

    The parallelism is the CPU over busy wall time of the runs where the fewest of the group's ranks shared a
    node: one rank alone, it is what the call got (below 1 when another process took part of its core, as it
    will again); several, the contention is taken out through ``node_share``, and a call alone gets at least
    one core. ``node_share``: what ``n >= 2`` ranks busy on one node got together (``n`` times the CPU over
    wall time of each), over the node's cores, averaged over the runs where that happened. With both, the
    model gives each run's calls the wall time they took in it (no CPU times recorded: one core, none).
    """
    measured = [(_per_node(r.candidate, group, r.machine), r) for r in runs if r.cpu_per_wall[group] > 0]
    if not measured:
        return {"parallelism": 1.0, "node_share": None}
    fewest = min(n for n, _ in measured)
    parallelism = _mean([r.cpu_per_wall[group] for n, r in measured if n == fewest])
    if fewest > 1:
        parallelism = max(1.0, parallelism)
    shares = [n * r.cpu_per_wall[group] / r.machine.cores for n, r in measured if n > 1]
    return {"parallelism": parallelism, "node_share": _mean(shares) if shares else None}


def _middle(windows: Sequence[Span]) -> list[Span]:
    """The median step by duration (the two middle ones when even), in time order."""
    ranked = sorted(windows, key=lambda w: w.dur_us)
    half = len(ranked) // 2
    middle = ranked[half - 1 : half + 1] if len(ranked) % 2 == 0 else ranked[half : half + 1]
    return sorted(middle, key=lambda w: w.start_us)


def _rank_share(run: Measured, group: str) -> float:
    return 1.0 / run.candidate.ranks(group)


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values) if values else 0.0


def _fit_call(points: Sequence[tuple[float, float]]) -> CallCost:
    """Least squares ``seconds = fixed + split * share`` with both terms >= 0."""
    shares = {round(x, 12) for x, _ in points}
    if len(shares) < 2:  # one share: assume the call splits entirely with the batch
        x = _mean([p[0] for p in points])
        return CallCost(0.0, _mean([y for _, y in points]) / x)
    mx, my = _mean([x for x, _ in points]), _mean([y for _, y in points])
    sxx = math.fsum((x - mx) ** 2 for x, _ in points)
    sxy = math.fsum((x - mx) * (y - my) for x, y in points)
    split = sxy / sxx
    fixed = my - split * mx
    if split < 0:  # no faster with a smaller share: a fixed cost
        return CallCost(my, 0.0)
    if fixed < 0:  # all of it splits: through the origin
        return CallCost(0.0, math.fsum(x * y for x, y in points) / math.fsum(x * x for x, _ in points))
    return CallCost(fixed, split)


def _named(
    timeline: Timeline, labels: Sequence[str], name: str, windows: Sequence[Span]
) -> list[tuple[str, Span]]:
    out = []
    for label in labels:
        for span in timeline.spans(label):
            if span.name == name and any(w.start_us <= span.start_us < w.end_us for w in windows):
                out.append((label, span))
    return out


def _call_costs(busy: _Busy, spans: Sequence[tuple[str, Span]], cores: float) -> tuple[float, float]:
    """Mean CPU seconds of the calls and their CPU over wall time (``-1``: not recorded).

    Spans recorded without CPU time: their wall time with the node's oversubscription taken out, one thread.
    """
    if all(s.cpu_us >= 0 for _, s in spans):
        cpu = math.fsum(s.cpu_us for _, s in spans)
        wall = math.fsum(s.dur_us for _, s in spans)
        return cpu / len(spans) / 1e6, cpu / wall if wall > 0 else -1.0
    return _mean([busy.alone(label, s, cores) for label, s in spans]), -1.0


def _phase_costs(
    timeline: Timeline, busy: _Busy, labels: Sequence[str], windows: Sequence[Span], machine: Machine
) -> tuple[float, float]:
    """A group's mean CPU seconds per rank and step in its outermost compute spans, and CPU over busy wall."""
    if not labels:
        return 0.0, -1.0
    cpu = wall = 0.0
    measured = True
    for label in labels:
        for window in windows:
            for span in _outermost(timeline.spans(label), window):
                measured = measured and span.cpu_us >= 0
                cpu += max(span.cpu_us, 0.0) / 1e6
            for lo, hi in busy.intervals(label, window.start_us, window.end_us):
                wall += (hi - lo) / 1e6
    if not measured:
        alone = 0.0
        for label in labels:
            for window in windows:
                for lo, hi in busy.intervals(label, window.start_us, window.end_us):
                    alone += busy.alone(label, Span("", "", lo, hi - lo, ""), machine.cores)
        return alone / (len(labels) * len(windows)), -1.0
    runs = len(labels) * len(windows)
    return cpu / runs, cpu / wall if wall > 0 else -1.0


def _outermost(spans: Sequence[Span], window: Span) -> list[Span]:
    """Compute spans starting in ``window`` that lie within no other compute span of the same thread."""
    inside = sorted(
        (s for s in spans if s.cat != "wait" and window.start_us <= s.start_us < window.end_us),
        key=lambda s: (s.thread, s.start_us, -s.dur_us),
    )
    out: list[Span] = []
    for span in inside:
        if out and out[-1].thread == span.thread and span.end_us <= out[-1].end_us:
            continue
        out.append(span)
    return out


class _Busy:
    """Each process's busy intervals (compute spans minus wait spans), for contention estimates."""

    def __init__(self, timeline: Timeline) -> None:
        self.nodes = {label: timeline.node(label) for label in timeline.labels}
        self.busy = {label: timeline.busy_intervals(label) for label in timeline.labels}
        self._starts = {label: [lo for lo, _ in iv] for label, iv in self.busy.items()}

    def intervals(self, label: str, lo: float, hi: float) -> list[tuple[float, float]]:
        """Busy intervals of ``label`` clipped to ``[lo, hi]``."""
        out = []
        for a, b in self.busy.get(label, []):
            a, b = max(a, lo), min(b, hi)
            if b > a:
                out.append((a, b))
        return out

    def overlap(self, label: str, lo: float, hi: float) -> float:
        iv, starts = self.busy.get(label, []), self._starts.get(label, [])
        i = max(bisect.bisect_right(starts, lo) - 1, 0)
        total = 0.0
        while i < len(iv) and iv[i][0] < hi:
            a, b = max(iv[i][0], lo), min(iv[i][1], hi)
            if b > a:
                total += b - a
            i += 1
        return total

    def alone(self, label: str, span: Span, cores: float) -> float:
        """``span``'s seconds had its node's cores not been oversubscribed while it ran."""
        if span.dur_us <= 0:
            return 0.0
        lo, hi = span.start_us, span.end_us
        # busy processes on the node meanwhile (the span's own process counts once, busy or in a nested wait)
        node = self.nodes.get(label)
        others = sum(
            self.overlap(other, lo, hi)
            for other in self.busy
            if other not in (label, DRIVER) and self.nodes.get(other) == node
        )
        concurrency = 1.0 + others / (hi - lo)
        return span.dur_us / 1e6 / max(1.0, concurrency / cores)
