"""Small metric reductions shared by the runners (per-rank results → one record)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["mean", "mean_over_ranks", "prefixed"]


def mean(values: Sequence[float]) -> float:
    """The mean of ``values`` (NaN when empty)."""
    return float(sum(values) / len(values)) if values else math.nan


def mean_over_ranks(results: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per key, the mean over the ranks that reported it (NaN values left out; NaN if none is left)."""
    keys: dict[str, None] = {}
    for r in results:
        keys.update(dict.fromkeys(r))
    out = {}
    for k in keys:
        vals = [float(r[k]) for r in results if k in r and not math.isnan(float(r[k]))]
        out[k] = sum(vals) / len(vals) if vals else math.nan
    return out


def prefixed(metrics: Mapping[str, float], prefix: str) -> dict[str, float]:
    """``metrics`` with every key under ``<prefix>/`` (keys already there are kept as they are)."""
    return {k if k.startswith(f"{prefix}/") else f"{prefix}/{k}": float(v) for k, v in metrics.items()}
