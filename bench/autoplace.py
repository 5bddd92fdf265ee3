"""Auto-placement against trying every placement: is the chosen one the fastest, is its predicted time right?

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/autoplace.py CONFIG --slots K [--steps 5]
        [--profile-steps N] [key=value ...]

1. ``rlinf-autoplace``'s profiling runs and search (timed from here: what the user waits for), for one node of
   ``K`` simulated slots: every valid placement, ranked by predicted step time;
2. every one of those placements (one per class of equivalent ones) trained ``--steps`` steps with
   ``runner.profile=true``; its measured step time is the median of the training step plus its weight sync
   over the steps after the first, read from its trace the same way the profile is read.

Prints a table (predicted vs measured per placement) and the two figures of the issue: the chosen placement's
measured step time over the fastest measured one (target <= 1.10) and its prediction error (target <= 20%).
``--json`` writes everything. ``--keep DIR`` keeps every run's trace; ``--replay DIR`` then recomputes the
predictions from those traces without running anything (the profiled runs are ``DIR/profile_*``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
START = time.perf_counter()

from rlinf_runners.apps import run_app  # noqa: E402
from rlinf_runners.autoplace import (  # noqa: E402
    Machine,
    autoplace,
    candidate_from_metadata,
    measure,
    profile_overrides,
    profile_runs,
    resolve_app,
)
from rlinf_scheduler import Timeline  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="steps of each measuring run")
    parser.add_argument(
        "--profile-steps", type=int, default=None, help="steps of each profiling run (default: --steps)"
    )
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--keep", type=Path, default=None, help="keep every run's trace under this directory")
    parser.add_argument("--replay", type=Path, default=None, help="recompute from a --keep directory")
    args = parser.parse_intermixed_args()
    app = resolve_app(args.config, None)
    machine = Machine(1, args.slots, float(os.cpu_count() or 1), True)
    kind = "embodied" if app.name == "embodied" else "sequential"
    with tempfile.TemporaryDirectory(prefix="bench-autoplace-") as tmp:
        work = Path(args.replay or args.keep or tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.replay:
            traces = sorted(work.glob("profile_*/trace.json"))
        else:
            traces = profile_runs(
                app, args.config, args.overrides, machine, args.profile_steps or args.steps, work
            )
        costs, ranked, runs, machine = autoplace(
            app, args.config, args.overrides, machine, traces, top=10_000
        )
        search_s = time.perf_counter() - START
        print(
            f"autoplace: {len(ranked)} valid placements ranked in {search_s:.1f} s from process start",
            flush=True,
        )
        print(f"model: {costs}; {machine.cores:.2f} cores", flush=True)
        for run in runs:
            print(
                f"profiled {run.candidate.describe()}: {run.step_s:.3f} s/step, cpu {dict(run.calls)}, "
                f"cpu/wall {dict(run.cpu_per_wall)}"
            )
        rows = []
        for i, placement in enumerate(ranked):
            log = work / f"measure_{i}"
            if args.replay:
                found = [
                    p
                    for p in work.glob("measure_*/trace.json")
                    if candidate_from_metadata(Timeline.load(p)[1], app.components)[0] == placement.candidate
                ]
                if not found:
                    continue
                trace = found[0]
            else:
                cfg = app.load_config(
                    args.config,
                    [*args.overrides, *placement.overrides, *profile_overrides(log, args.steps, app)],
                )
                trace = run_app(app, cfg).trace_file
            timeline, _ = Timeline.load(trace)
            measured = measure(timeline, placement.candidate, machine, kind)  # type: ignore[arg-type]
            rows.append(
                {
                    **placement.as_dict(),
                    "measured_step_s": measured.step_s,
                    "error": placement.seconds / measured.step_s - 1.0,
                }
            )
            print(
                f"[{i + 1}/{len(ranked)}] {placement.candidate.describe():<48} predicted {placement.seconds:7.3f}"
                f"  measured {measured.step_s:7.3f} s/step",
                flush=True,
            )
    best = min(rows, key=lambda r: r["measured_step_s"])
    chosen = rows[0]
    ratio = chosen["measured_step_s"] / best["measured_step_s"]
    print("\n| rank | placement | stages | mode | predicted s/step | measured s/step | error |")
    print("|---:|---|---:|---|---:|---:|---:|")
    for i, r in enumerate(rows, 1):
        placement = ", ".join(f"{k}: {v}" for k, v in r["component_placement"].items())
        print(
            f"| {i} | {placement} | {r['pipeline_stage_num']} | {r['mode']} | {r['predicted_step_s']:.3f} | "
            f"{r['measured_step_s']:.3f} | {100 * r['error']:+.0f}% |"
        )
    print(
        f"\nchosen: measured {chosen['measured_step_s']:.3f} s/step = {ratio:.3f}x the fastest measured "
        f"({best['measured_step_s']:.3f} s/step); its prediction {chosen['predicted_step_s']:.3f} s/step is "
        f"{100 * chosen['error']:+.1f}% off; the search took {search_s:.1f} s from process start"
    )
    if args.json is not None:
        payload = {
            "config": str(args.config),
            "slots": args.slots,
            "steps": args.steps,
            "profile_steps": args.profile_steps or args.steps,
            "profiled": [
                {"placement": r.candidate.describe(), "step_s": r.step_s, "calls": dict(r.calls)}
                for r in runs
            ],
            "rows": rows,
            "chosen_over_best": ratio,
            "chosen_error": chosen["error"],
            "search_s": search_s,
        }
        args.json.write_text(json.dumps(payload, indent=2))
    sys.exit(0)


if __name__ == "__main__":
    main()
