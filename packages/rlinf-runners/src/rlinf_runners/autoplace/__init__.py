"""Auto-placement: profile a config, model its step time, and search placements for a cluster size.

``uv run rlinf-autoplace <config.yaml> --nodes N --accelerators-per-node K`` (:func:`main`). The pieces:
:mod:`._model` (candidates, the step-time model, the ranking: pure), :mod:`._fit` (a profiled run's
``trace.json`` → the model's costs), :mod:`._cli` (profiling runs, validation against the app's config rules,
the report). See ``docs/autoplace.md``.
"""

from ._cli import (
    Placement,
    autoplace,
    check_modeled,
    main,
    placement_overrides,
    profile_overrides,
    profile_runs,
    resolve_app,
)
from ._fit import Measured, calibrate, candidate_from_metadata, effective_cores, fit, measure
from ._model import (
    CallCost,
    Candidate,
    EmbodiedCosts,
    Machine,
    SequentialCosts,
    blocks,
    candidates,
    canonical,
    predict,
    rank_candidates,
)

__all__ = [
    "CallCost",
    "Candidate",
    "EmbodiedCosts",
    "Machine",
    "Measured",
    "Placement",
    "SequentialCosts",
    "autoplace",
    "blocks",
    "calibrate",
    "candidate_from_metadata",
    "candidates",
    "canonical",
    "check_modeled",
    "effective_cores",
    "fit",
    "main",
    "measure",
    "placement_overrides",
    "predict",
    "profile_overrides",
    "profile_runs",
    "rank_candidates",
    "resolve_app",
]
