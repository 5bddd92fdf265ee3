"""The off-policy parts of ``algorithm:`` (SAC family): replay and demo buffers, entropy temperature.

Key names follow RLinf's SAC configs (``algorithm.replay_buffer``, ``algorithm.demo_buffer``,
``algorithm.entropy_tuning``). Sizes are counted in transitions (one chunked step of one env).
"""

from __future__ import annotations

from typing import Literal

import attrs
from attrs import validators as v

__all__ = [
    "OFFPOLICY_LOSS_TYPES",
    "DemoBufferConfig",
    "EntropyOptimConfig",
    "EntropyTuningConfig",
    "ReplayBufferConfig",
]

OFFPOLICY_LOSS_TYPES = ("embodied_sac", "embodied_dagger")
"""``algorithm.loss_type`` (and ``adv_type``) values that select the off-policy (replay buffer) training path:
SAC and its family, or DAgger (imitation of an expert policy on the states the learner visits)."""


@attrs.frozen(kw_only=True)
class ReplayBufferConfig:
    """The online replay buffer (config ``algorithm.replay_buffer``)."""

    cache_size: int = attrs.field(default=100_000, validator=v.ge(1))
    """Capacity in transitions; the oldest are overwritten once it is full (a ring)."""
    sample_window_size: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Sample uniformly from the latest this many transitions (``null``: from everything stored)."""
    min_buffer_size: int = attrs.field(default=256, validator=v.ge(1))
    """Transitions stored before the first gradient step."""
    seed: int = 0
    """Seed of the buffer's own sampling generator (saved in checkpoints)."""


@attrs.frozen(kw_only=True)
class DemoBufferConfig:
    """Demonstrations sampled beside the online buffer, RLPD-style (config ``algorithm.demo_buffer``)."""

    load_path: str = attrs.field(validator=v.min_len(1))
    """A buffer file written by ``ReplayBuffer.save`` (e.g. transitions of an earlier run)."""
    min_buffer_size: int = attrs.field(default=1, validator=v.ge(1))
    """Demo transitions needed before the first gradient step."""
    seed: int = 1
    """Seed of the demo buffer's sampling generator."""


@attrs.frozen(kw_only=True)
class EntropyOptimConfig:
    """Optimizer of the temperature parameter (config ``algorithm.entropy_tuning.optim``)."""

    lr: float = attrs.field(default=3e-4, validator=v.gt(0.0))
    """Adam learning rate of the temperature parameter."""
    clip_grad: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))
    """Max gradient norm of the temperature parameter (null: no clipping)."""


@attrs.frozen(kw_only=True)
class EntropyTuningConfig:
    """SAC's entropy temperature α (config ``algorithm.entropy_tuning``)."""

    alpha_type: Literal["softplus", "exp", "fixed_alpha"] = "softplus"
    """``softplus`` (α = softplus(b)), ``exp`` (α = exp(b), SB3's log-α) or ``fixed_alpha`` (α stays ``initial_alpha``)."""
    initial_alpha: float = attrs.field(default=0.01, validator=v.gt(0.0))
    """Starting temperature."""
    target_entropy: float | None = None
    """Entropy the tuning aims at (``null``: minus the number of action dimensions of a chunk)."""
    optim: EntropyOptimConfig = attrs.field(factory=EntropyOptimConfig)
