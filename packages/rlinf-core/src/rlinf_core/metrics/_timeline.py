"""A picture of one training step of a profiled run: one row per process, one bar per phase."""

from __future__ import annotations

from pathlib import Path

__all__ = ["plot_timeline"]

_WAIT_COLOR = "#d9d9d9"


def plot_timeline(trace: str | Path, out: str | Path, *, step: int | None = None) -> Path:
    """Draw step ``step`` (default: the last complete one) of a ``trace.json`` as a PNG Gantt chart.

    Rows are the processes (driver first, then each worker rank); compute phases are coloured by name,
    waits (blocked on another component) are grey. Nested phases are drawn over their parents.

    Raises:
        ValueError: the trace has no ``train_step`` span of the driver (or not the one asked for).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle
    except ImportError as e:
        raise ImportError('plotting needs: pip install "rlinf-core[plot]"') from e
    from rlinf_scheduler import DRIVER, WAIT, Timeline

    timeline, _ = Timeline.load(trace)
    steps = {
        int(s.name.split()[1]): s
        for s in timeline.spans(DRIVER)
        if s.name.startswith("train_step ") and s.name.split()[1].isdigit()
    }
    if not steps:
        raise ValueError(f"{trace}: no 'train_step' span of the driver")
    if step is None:
        step = max(steps)
    if step not in steps:
        raise ValueError(f"{trace}: no train_step {step} (steps: {min(steps)}..{max(steps)})")
    window = steps[step]
    lo, hi = window.start_us, window.end_us
    labels = [DRIVER, *(lab for lab in timeline.labels if lab != DRIVER)]
    names: dict[str, None] = {}
    for label in labels:
        for s in timeline.spans(label):
            if s.cat != WAIT and s.end_us > lo and s.start_us < hi:
                names.setdefault(s.name.split(" ")[0] if s.name.startswith("train_step") else s.name)
    cmap = plt.get_cmap("tab20")
    colors = {n: cmap(i % 20) for i, n in enumerate(names)}
    fig, ax = plt.subplots(figsize=(11, 0.45 * len(labels) + 1.6))
    for row, label in enumerate(labels):
        spans = [s for s in timeline.spans(label) if s.end_us > lo and s.start_us < hi]
        # longer spans first, so nested (shorter) phases end up on top
        for s in sorted(spans, key=lambda s: -s.dur_us):
            start, end = max(s.start_us, lo), min(s.end_us, hi)
            name = s.name.split(" ")[0] if s.name.startswith("train_step") else s.name
            color = _WAIT_COLOR if s.cat == WAIT else colors[name]
            ax.broken_barh([((start - lo) / 1e3, (end - start) / 1e3)], (row - 0.38, 0.76), color=color)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"ms since the start of training step {step}")
    ax.set_xlim(0, (hi - lo) / 1e3)
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    handles.append(Rectangle((0, 0), 1, 1, color=_WAIT_COLOR))
    ax.legend(
        handles, [*names, "waiting"], loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=5, fontsize=8
    )
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
