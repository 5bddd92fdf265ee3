"""``PolicyConfig``: the policy architecture (config ``actor.model``); importing it does not import torch."""

from __future__ import annotations

from typing import Literal

import attrs
from attrs import validators as v

__all__ = ["PolicyConfig"]


@attrs.frozen(kw_only=True)
class PolicyConfig:
    """Policy architecture (config ``actor.model``)."""

    model_type: Literal["mlp", "cnn"] = "mlp"
    """``mlp`` for vector observations, ``cnn`` for ``[H, W, C]`` uint8 images."""
    hidden_sizes: tuple[int, ...] = attrs.field(default=(64, 64), validator=v.deep_iterable(v.gt(0)))
    """Widths of the hidden layers of the actor and critic MLPs."""
    activation: Literal["tanh", "relu", "gelu"] = "tanh"
    """Non-linearity between the hidden layers."""
    num_action_chunks: int = attrs.field(default=1, validator=v.ge(1))
    """Actions emitted per observation (executed open-loop by the env)."""
    add_value_head: bool = True
    """A critic head (needed for GAE / actor_critic losses)."""
    init_log_std: float = 0.0
    """Initial log standard deviation of continuous actions (state-independent)."""
    ortho_init: bool = True
    """Orthogonal initialisation as in CleanRL / SB3 PPO."""
