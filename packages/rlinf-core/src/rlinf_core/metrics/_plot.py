"""Turn a run directory's ``metrics.jsonl`` into PNG learning curves: ``rlinf-plot RUN_DIR [RUN_DIR ...]``.

``rlinf-plot RUN_DIR --timeline [--step N]`` draws a step of a profiled run's ``trace.json`` instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._logger import read_metrics
from ._timeline import plot_timeline

__all__ = ["main", "plot_run"]

DEFAULT_KEYS = ("eval/return_mean", "env/return_mean", "train/return_mean")


def plot_run(
    run_dirs: Sequence[str | Path],
    *,
    keys: Sequence[str] | None = None,
    x: str = "step",
    out_dir: str | Path | None = None,
) -> list[Path]:
    """Plot each metric key against ``x`` for one or more runs; returns the PNG paths written.

    Args:
        run_dirs: run directories (or ``metrics.jsonl`` files); several runs share each figure.
        keys: metric keys to plot; default: every key except ``step`` and ``time/*``.
        x: ``"step"`` or ``"time/wall_s"``.
        out_dir: where to write PNGs; default ``<first run>/plots``.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise ImportError('plotting needs: pip install "rlinf-core[plot]"') from e

    runs = {str(d): read_metrics(d) for d in run_dirs}
    if keys is None:
        seen: dict[str, None] = {}
        for recs in runs.values():
            for rec in recs:
                seen.update(dict.fromkeys(k for k in rec if k != "step" and not k.startswith("time/")))
        keys = list(seen)
    first = Path(run_dirs[0])
    out = Path(out_dir) if out_dir is not None else (first if first.is_dir() else first.parent) / "plots"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key in keys:
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, recs in runs.items():
            pts = [(r[x], r[key]) for r in recs if key in r and x in r]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, marker="." if len(pts) < 50 else None, label=Path(name).name)
        ax.set_xlabel("wall-clock seconds" if x == "time/wall_s" else x)
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
        if len(runs) > 1:
            ax.legend()
        fig.tight_layout()
        path = out / f"{key.replace('/', '_')}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point (``rlinf-plot``)."""
    parser = argparse.ArgumentParser(prog="rlinf-plot", description=__doc__)
    parser.add_argument("runs", nargs="+", help="run directories or metrics.jsonl files")
    parser.add_argument("--keys", nargs="*", help="metric keys (default: all)")
    parser.add_argument("--x", default="step", choices=["step", "time/wall_s"])
    parser.add_argument("--out", help="output directory (default: <first run>/plots)")
    parser.add_argument("--timeline", action="store_true", help="draw a step of each run's trace.json")
    parser.add_argument(
        "--step", type=int, default=None, help="with --timeline: the step (default: the last)"
    )
    args = parser.parse_args(argv)
    if args.timeline:
        for run in args.runs:
            run_dir = Path(run) if Path(run).is_dir() else Path(run).parent
            out = Path(args.out) if args.out else run_dir / "plots"
            name = f"timeline_step{args.step}.png" if args.step is not None else "timeline.png"
            sys.stdout.write(f"{plot_timeline(run_dir / 'trace.json', out / name, step=args.step)}\n")
        return 0
    for path in plot_run(args.runs, keys=args.keys, x=args.x, out_dir=args.out):
        sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
