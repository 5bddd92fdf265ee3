"""``rlinf-autoplace CONFIG --nodes N --accelerators-per-node K [key=value ...]``: the fastest placement.

Profiles the config for a few steps in collocated mode on one slot and on one node's slots (or reads the
traces given with ``--trace``), fits the step-time model, predicts every candidate placement of the
cluster size given, checks the fastest ones against the app's config rules and prints them with their
predicted step times, then the best ``cluster.component_placement`` (and ``rollout.pipeline_stage_num``) as
YAML to paste into the config.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from ._fit import Measured, calibrate, candidate_from_metadata, fit, measure
from ._model import Candidate, EmbodiedCosts, Machine, SequentialCosts, candidates, canonical, rank_candidates

__all__ = [
    "Placement",
    "autoplace",
    "check_modeled",
    "main",
    "placement_overrides",
    "profile_overrides",
    "profile_runs",
    "resolve_app",
]

STAGE_OPTIONS = (1, 2, 4)
"""Pipeline stage counts tried for embodied configs."""


class Placement:
    """One ranked candidate: predicted step seconds and the config overrides that select it."""

    def __init__(self, seconds: float, candidate: Candidate, overrides: list[str]) -> None:
        self.seconds = seconds
        self.candidate = candidate
        self.overrides = overrides

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly: predicted seconds, mode, placement, stages, overrides."""
        return {
            "predicted_step_s": self.seconds,
            "mode": self.candidate.mode,
            "component_placement": self.candidate.component_placement(),
            "pipeline_stage_num": self.candidate.stages,
            "overrides": self.overrides,
        }


def placement_overrides(app: Any, candidate: Candidate, machine: Machine) -> list[str]:
    """The config overrides that run ``candidate`` on ``machine``."""
    out = [
        f"cluster.num_nodes={machine.nodes}",
        f"cluster.component_placement={json.dumps(candidate.component_placement())}",
    ]
    if machine.simulated:
        out.append(f"cluster.simulated_accelerators_per_node={machine.slots_per_node}")
    if app.name == "embodied":
        out.append(f"rollout.pipeline_stage_num={candidate.stages}")
    else:  # the cost model adds up phases run in sequence; a pipelined step overlaps them
        out.append("runner.pipeline=false")
    return out


class _Checker:
    """Whether the app accepts a candidate: its config checks, with the candidate's placement and stages.

    The config file and overrides are loaded once per machine; each candidate is an ``attrs.evolve`` of that
    config, checked with the app's cross-section checks and the world sizes its placement gives.
    """

    def __init__(self, app: Any, config: Path, overrides: Sequence[str]) -> None:
        self.app, self.config, self.overrides = app, config, list(overrides)
        self._base: dict[Machine, Any] = {}

    def __call__(self, candidate: Candidate, machine: Machine) -> str | None:
        """``None`` when the app accepts ``candidate`` on ``machine``; else why not."""
        from rlinf_core.config import ConfigError

        try:
            if machine not in self._base:
                self._base[machine] = self.app.load_config(
                    self.config, [*self.overrides, *placement_overrides(self.app, candidate, machine)]
                )
            base = self._base[machine]
            cfg = attrs.evolve(
                base, cluster=attrs.evolve(base.cluster, component_placement=candidate.component_placement())
            )
            if self.app.name == "embodied":
                cfg = attrs.evolve(
                    cfg, rollout=attrs.evolve(cfg.rollout, pipeline_stage_num=candidate.stages)
                )
            self.app.check(cfg)
            self.app.check(cfg, self.app.world_sizes(cfg))
        except (ConfigError, ValueError, TypeError) as e:
            return str(e)
        return None


def check_modeled(app: Any, cfg: Any) -> None:
    """Refuse a loaded config whose steps the model does not describe, naming the field and what it covers.

    Raises:
        ValueError: an asynchronous embodied runner (``runner.mode: async``, asynchronous PPO or SAC: rollout
            and training overlap across steps), an explicitly pipelined reasoning / agent step
            (``runner.pipeline: true``), or dynamic scaling (``runner.dynamic_scaling: true``).
    """
    runner = cfg.runner
    if app.name == "embodied" and runner.mode != "sync":
        raise ValueError(
            f"auto-placement models the synchronous embodied runner only: runner.mode={runner.mode!r} is not "
            "modeled (its rollout and training overlap across steps); supported: runner.mode=sync (set it to "
            "place the synchronous counterpart of this config)"
        )
    if app.name != "embodied" and runner.pipeline:
        raise ValueError(
            "auto-placement models phases run in sequence: set runner.pipeline=null (a disaggregated "
            "placement it prints then runs pipelined, which overlaps them) or false"
        )
    if runner.dynamic_scaling:
        raise ValueError(
            "auto-placement models static placements: set runner.dynamic_scaling=false (dynamic scaling "
            "then applies to a disaggregated placement it prints)"
        )


def profile_overrides(log_path: Path, steps: int, app: Any) -> list[str]:
    """Overrides of a profiling run: ``steps`` steps, traced, no evaluation or checkpoint, logs in ``log_path``."""
    out = [
        "runner.profile=true",
        f"runner.max_epochs={steps}",
        "runner.max_steps=-1",
        "runner.val_check_interval=-1",
        "runner.save_interval=-1",
        "runner.resume_dir=null",
        "runner.stop_eval_return=null",
        "runner.progress_bar=false",
        "runner.logger.logger_backends=[]",
        f"runner.logger.log_path={log_path}",
    ]
    if app.name != "embodied":
        out.append("sft.steps=0")  # the warm-up is not part of a step
    return out


def profile_runs(
    app: Any, config: Path, overrides: Sequence[str], machine: Machine, steps: int, work_dir: Path
) -> list[Path]:
    """Profile the config on one slot and on a node's slots, ``steps`` steps each; returns their traces.

    Raises:
        ValueError: the config is one the model does not cover (:func:`check_modeled`), before any run.
    """
    from .. import apps as apps_mod

    check_modeled(app, app.load_config(config, list(overrides)))
    components = tuple(app.components)
    check = _Checker(app, config, overrides)
    stages = _config_stages(app, config, overrides)
    one_node = attrs.evolve(machine, nodes=1)

    def collocated(size: int, actor: int) -> Candidate:
        return Candidate(tuple((c, (0, actor if c == "actor" else size)) for c in components), stages)

    # two points of the cost curve: everything on one slot, and the most slots of a node the config accepts
    # (the actor on one slot if its batch does not split over more)
    points = [collocated(1, 1)]
    k = machine.slots_per_node
    for size in sorted((s for s in range(2, k + 1) if k % s == 0), reverse=True):
        tries = [collocated(size, size), collocated(size, 1)]
        problems = [check(c, one_node) for c in tries]
        valid = [c for c, p in zip(tries, problems, strict=True) if p is None]
        if valid:
            points.append(valid[0])
            break
        print(f"profile: not on {size} slots: {problems[0]}", file=sys.stderr)
    traces: list[Path] = []
    for candidate in points:
        size = max(hi for _, (_, hi) in candidate.blocks)
        log_path = work_dir / f"profile_{len(traces)}"
        cfg = app.load_config(
            config,
            [
                *overrides,
                *placement_overrides(app, candidate, one_node),
                *profile_overrides(log_path, steps, app),
            ],
        )
        print(f"profile: {steps} steps of {candidate.describe()} ...", file=sys.stderr)
        result = apps_mod.run_app(app, cfg)
        assert result.trace_file is not None  # runner.profile=true
        traces.append(result.trace_file)
    return traces


def _config_stages(app: Any, config: Path, overrides: Sequence[str]) -> int:
    if app.name != "embodied":
        return 1
    cfg = app.load_config(config, list(overrides))
    return int(cfg.rollout.pipeline_stage_num)


def autoplace(
    app: Any,
    config: Path,
    overrides: Sequence[str],
    machine: Machine,
    traces: Sequence[Path],
    *,
    top: int = 10,
    calibrate_cores: bool = True,
) -> tuple[EmbodiedCosts | SequentialCosts, list[Placement], list[Measured], Machine]:
    """Fit the model on ``traces`` and rank the valid placements of ``machine`` (fastest first, ``top`` kept).

    With ``calibrate_cores`` the nodes' cores are those the profiled processes actually got
    (:func:`~rlinf_runners.autoplace._fit.effective_cores`), at most ``machine.cores``. Returns the costs,
    the ranking, the measured runs and the machine the prediction used.

    Raises:
        ValueError: a trace cannot be read as a profiled run of this app, or no candidate is valid.
    """
    from rlinf_scheduler import Timeline

    components = tuple(app.components)
    check = _Checker(app, config, overrides)
    kind = "embodied" if app.name == "embodied" else "sequential"
    runs = []
    for path in traces:
        timeline, other = Timeline.load(path)
        candidate, _, per_node = candidate_from_metadata(other, components)
        node_cores = float(other.get("driver_cpu_count") or machine.cores)
        profiled_on = Machine(1, per_node, min(node_cores, machine.cores), machine.simulated)
        runs.append(measure(timeline, candidate, profiled_on, kind))  # type: ignore[arg-type]
    if calibrate_cores:  # what the profiled processes got of a node
        runs, machine = calibrate(runs, machine)
    costs = fit(runs)
    stages = STAGE_OPTIONS if kind == "embodied" else (1,)
    ranked = rank_candidates(list(candidates(components, machine, stages)), costs, machine)
    seen: set[tuple[object, ...]] = set()
    out: list[Placement] = []
    for seconds, candidate in ranked:
        key = canonical(candidate, machine)
        if key in seen:
            continue
        seen.add(key)
        if check(candidate, machine) is None:
            out.append(Placement(seconds, candidate, placement_overrides(app, candidate, machine)))
            if len(out) >= top:
                break
    if not out:
        raise ValueError("no placement of this cluster size passes the config's checks")
    return costs, out, runs, machine


def _yaml(best: Placement, app_name: str) -> str:
    lines = ["cluster:", "  component_placement:"]
    lines += [f"    {k}: {v}" for k, v in best.candidate.component_placement().items()]
    if app_name == "embodied":
        lines += ["rollout:", f"  pipeline_stage_num: {best.candidate.stages}"]
    return "\n".join(lines)


def resolve_app(config: Path, name: str | None) -> Any:
    """The app of ``config`` (``name``, or the ``apps/<name>/config`` directory the file is in).

    Raises:
        ValueError: an unknown app name, or a path that does not tell.
    """
    from ..apps import APPS

    if name is None:
        parts = config.resolve().parts
        found = [p for i, p in enumerate(parts[:-1]) if p in APPS and "config" in parts[i + 1 :]]
        if not found:
            raise ValueError(f"cannot tell the app of {config}: give --app ({', '.join(APPS)})")
        name = found[-1]
    if name not in APPS:
        raise ValueError(f"--app {name!r} is not an app; allowed: {', '.join(APPS)}")
    parts = config.resolve().parts
    app_dir = Path(*parts[: len(parts) - 1 - parts[::-1].index("config")]) if "config" in parts else None
    return APPS[name](app_dir)


def main(argv: Sequence[str] | None = None) -> int:
    """The ``rlinf-autoplace`` command (exit codes: 0 done, 1 a profiling run failed, 2 bad arguments)."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    parser = argparse.ArgumentParser(prog="rlinf-autoplace", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path, help="the app's YAML config")
    parser.add_argument("overrides", nargs="*", help="key.sub=value overrides of the config")
    parser.add_argument("--nodes", type=int, required=True, help="nodes of the cluster to place on")
    parser.add_argument("--accelerators-per-node", type=int, required=True, help="slots (GPUs) per node")
    parser.add_argument("--app", default=None, help="embodied, reasoning or agent (default: from the path)")
    parser.add_argument("--trace", type=Path, action="append", default=[], help="a profiled run's trace.json")
    parser.add_argument("--profile-steps", type=int, default=4, help="steps of each profiling run")
    parser.add_argument(
        "--cores", type=float, default=None, help="CPU cores per node (default: this machine's)"
    )
    parser.add_argument(
        "--real-accelerators",
        action="store_true",
        help="the slots are real GPUs (one thing at a time per slot), not simulated slots on CPU processes",
    )
    parser.add_argument("--top", type=int, default=10, help="placements to list")
    parser.add_argument("--json", type=Path, default=None, help="also write the ranking as JSON here")
    args = parser.parse_intermixed_args(argv)
    for name, value in (("--nodes", args.nodes), ("--accelerators-per-node", args.accelerators_per_node)):
        if value < 1:
            parser.error(f"{name} must be >= 1, got {value}")
    if args.profile_steps < 2:
        parser.error(f"--profile-steps must be >= 2 (the first step is left out), got {args.profile_steps}")
    from rlinf_core.config import ConfigError

    try:
        app = resolve_app(args.config, args.app)
        # a bad config, or one the model does not cover, fails here, before any profiling
        check_modeled(app, app.load_config(args.config, args.overrides))
        machine = Machine(
            args.nodes,
            args.accelerators_per_node,
            args.cores or float(os.cpu_count() or 1),
            not args.real_accelerators,
        )
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    traces = list(args.trace)
    with tempfile.TemporaryDirectory(prefix="rlinf-autoplace-") as work:
        if not traces:
            try:
                traces = profile_runs(
                    app, args.config, args.overrides, machine, args.profile_steps, Path(work)
                )
            except Exception as e:  # a failed profiling run: its traceback was printed by the runner
                print(f"error: profiling failed: {e}", file=sys.stderr)
                return 1
        try:
            costs, ranked, runs, used = autoplace(
                app,
                args.config,
                args.overrides,
                machine,
                traces,
                top=args.top,
                calibrate_cores=args.cores is None,
            )
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    for run in runs:
        print(
            f"profiled {run.candidate.describe()}: {run.step_s:.3f} s/step over {run.steps} steps; "
            + ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in run.calls.items())
        )
    print(f"model: {costs}; {used.cores:.2f} cores per node")
    print(f"\n{'rank':>4}  {'s/step':>8}  {'mode':<13}  placement")
    for i, p in enumerate(ranked, 1):
        print(f"{i:>4}  {p.seconds:8.3f}  {p.candidate.mode:<13}  {p.candidate.describe()}")
    print(
        f"\nbest for {args.nodes} node(s) x {args.accelerators_per_node} slot(s):\n{_yaml(ranked[0], app.name)}"
    )
    if args.json is not None:
        args.json.write_text(json.dumps([p.as_dict() for p in ranked], indent=2))
    return 0
