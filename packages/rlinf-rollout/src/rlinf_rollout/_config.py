"""``rollout:`` — the inference side of the embodied pipeline (key names follow RLinf's ``rollout`` section)."""

from __future__ import annotations

import attrs
from attrs import validators as v

__all__ = ["EmbodiedRolloutConfig"]


@attrs.frozen(kw_only=True)
class EmbodiedRolloutConfig:
    """The rollout component (config ``rollout``)."""

    pipeline_stage_num: int = attrs.field(default=1, validator=v.ge(1))
    """Env sets per env rank stepped in turn; with 2, simulation of one overlaps inference of the other."""
    enable_offload: bool = False
    """Move the policy off the accelerator while the actor trains (collocated GPU runs); a no-op on CPU."""
    deterministic: bool = False
    """Take the mode of the action distribution during training rollouts too (evaluation always does)."""
    seed: int = 0
    """Seed of the action sampling (rank ``r`` uses ``seed + r``)."""
    torch_num_threads: int = attrs.field(default=1, validator=v.ge(1))
    """torch threads in each rollout process (small policies: one thread avoids oversubscribing the CPUs)."""
    recv_timeout_s: float = attrs.field(default=600.0, validator=v.gt(0.0))
    """Longest wait for observations or weights before the rollout fails with a message naming the sender."""
