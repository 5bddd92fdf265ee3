"""``actor:`` — the training-side configuration (key names follow the original RLinf)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs
from attrs import validators as v

from .policies import PolicyConfig
from .policies._config import checkpoint_weights_file

__all__ = ["EmbodiedActorConfig", "ExpertConfig", "OptimConfig"]


def _positive_or_none(_inst: object, attr: attrs.Attribute[Any], value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"'{attr.name}' must be > 0 or null: {value}")


GATINGS = ("mixture", "discrepancy", "intervention")
"""The values of ``actor.expert.gating``."""


def _one_of(field: str, allowed: tuple[str, ...]) -> Any:
    def check(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
        if value not in allowed:
            raise ValueError(f"{field}: {value!r} is not one of {', '.join(allowed)}")

    return check


@attrs.frozen(kw_only=True)
class OptimConfig:
    """Adam(W) settings (config ``actor.optim``)."""

    lr: float = attrs.field(default=3e-4, validator=v.gt(0.0))
    """Learning rate of the policy parameters (and of the critic unless ``value_lr`` is set)."""
    value_lr: float | None = attrs.field(default=None, validator=_positive_or_none)
    """Learning rate of the critic parameters (default: ``lr``)."""
    adam_beta1: float = attrs.field(default=0.9, validator=[v.ge(0.0), v.lt(1.0)])
    """Adam decay rate of the first-moment (mean) estimate."""
    adam_beta2: float = attrs.field(default=0.999, validator=[v.ge(0.0), v.lt(1.0)])
    """Adam decay rate of the second-moment (squared gradient) estimate."""
    adam_eps: float = attrs.field(default=1e-8, validator=v.gt(0.0))
    """Added to the denominator of the Adam update for numerical stability."""
    weight_decay: float = attrs.field(default=0.0, validator=v.ge(0.0))
    """Decoupled (AdamW) weight decay."""
    clip_grad: float | None = attrs.field(default=0.5, validator=_positive_or_none)
    """Max global gradient norm (null: no clipping)."""
    lr_schedule: Literal["constant", "linear"] = "constant"
    """``linear`` decays both learning rates to 0 over ``runner.max_steps`` training steps."""
    reset_lr_schedule_on_resume: bool = False
    """On a resume whose step budget (``runner.max_steps`` / ``max_epochs``) differs from the checkpoint's run:
    ``false`` keeps the schedule the run started with, ``true`` rebuilds it over the new budget (a warning names
    both totals either way)."""


@attrs.frozen(kw_only=True)
class ExpertConfig:
    """The expert (HG-)DAgger imitates (config ``actor.expert``; ``algorithm.loss_type: embodied_dagger``).

    The expert is a policy trained earlier (by this project: any embodied config's checkpoint) on an
    observation entry the learner does not see, typically ManiSkill's ``privileged_state`` beside the camera
    images (``env.*.obs_mode: rgb+state``).
    """

    model: PolicyConfig = attrs.field(factory=PolicyConfig)
    """The expert's architecture: the ``actor.model`` of the run that trained it."""
    checkpoint: str = ""
    """The expert's weights: a checkpoint directory (``.../global_step_<N>``) or its ``actor/model.pt`` (empty for
    ``gating: intervention``, whose expert is a person)."""
    obs_key: str | None = "privileged_state"
    """The observation entry the expert acts on (``null``: the whole observation, an array)."""
    beta: float = attrs.field(default=1.0, validator=[v.ge(0.0), v.le(1.0)])
    """``mixture`` gating: probability that the expert's action is executed instead of the learner's in the first
    rollout."""
    beta_decay: float = attrs.field(default=0.5, validator=[v.ge(0.0), v.le(1.0)])
    """Per training step: rollout ``i`` executes the expert's action with probability ``beta * beta_decay**i``
    (DAgger's mixture ``π_i = β_i π* + (1 - β_i) π̂_i``)."""
    gating: Literal["mixture", "discrepancy", "intervention"] = attrs.field(
        default="mixture", validator=_one_of("actor.expert.gating", GATINGS)
    )
    """Who controls a training rollout's steps and which steps are aggregated.

    ``mixture``: DAgger's ``β`` mixture, every visited step aggregated with the expert's label.
    ``discrepancy``: HG-DAgger with a simulated human: the learner drives, the expert takes over while
    ``‖a_learner − a_expert‖`` exceeds ``gate_threshold`` and hands back once it falls below
    ``release_threshold``; only the expert's steps are aggregated. ``intervention``: HG-DAgger with a real
    human: the env reports in its step info which steps a person took over and their actions (no expert
    policy: leave ``checkpoint`` empty); only those steps are aggregated."""
    gate_threshold: float = attrs.field(default=0.5, validator=v.gt(0.0))
    """``discrepancy`` gating: the expert takes control when the discrepancy (the mean over the chunk's steps of
    the L2 norm of the action difference, actions normalised to ``[-1, 1]`` per dimension) exceeds this."""
    release_threshold: float = attrs.field(default=0.25, validator=v.ge(0.0))
    """``discrepancy`` gating: the expert keeps control until the discrepancy falls below this (hysteresis:
    at most ``gate_threshold``)."""

    def __attrs_post_init__(self) -> None:
        if self.release_threshold > self.gate_threshold:
            raise ValueError(
                f"actor.expert.release_threshold ({self.release_threshold}) must be <= actor.expert.gate_threshold "
                f"({self.gate_threshold}): the expert hands control back below the threshold it took it at"
            )
        if self.gating == "intervention":
            if self.checkpoint:
                raise ValueError(
                    "actor.expert.checkpoint: gating 'intervention' labels with the human's actions the env "
                    "reports; drop the checkpoint (or use gating 'discrepancy' for a simulated human)"
                )
            return
        if not self.checkpoint:
            raise ValueError(
                f"actor.expert.checkpoint: give the expert's checkpoint directory or model.pt (gating "
                f"{self.gating!r} runs the expert policy; only 'intervention' needs none)"
            )
        if self.model.model_path is not None:
            raise ValueError(
                "actor.expert.model.model_path: the expert's weights come from actor.expert.checkpoint; drop it"
            )

    def weights_file(self) -> Path:
        """The expert's ``model.pt``."""
        return checkpoint_weights_file(self.checkpoint)


@attrs.frozen(kw_only=True)
class EmbodiedActorConfig:
    """The actor (training) component (config ``actor``)."""

    model: PolicyConfig = attrs.field(factory=PolicyConfig)
    optim: OptimConfig = attrs.field(factory=OptimConfig)
    expert: ExpertConfig | None = None
    """DAgger and HG-DAgger (``algorithm.loss_type: embodied_dagger``): the expert the policy imitates and how it
    takes control (``gating``)."""
    global_batch_size: int = attrs.field(default=256, validator=v.ge(1))
    """Samples per optimizer step, over all actor ranks."""
    micro_batch_size: int = attrs.field(default=256, validator=v.ge(1))
    """Samples per forward/backward on one rank (gradient accumulation up to the global batch)."""
    seed: int = 1234
    """Seed of the parameter initialisation and of the mini-batch shuffle (the same on every rank)."""
    training_backend: Literal["fsdp"] = "fsdp"
    """FSDP2 (``fully_shard``) when the actor group has more than one rank; plain torch for one rank."""
    enable_offload: bool = False
    """Move parameters and optimizer state to CPU between training phases (collocated GPU runs)."""
    torch_num_threads: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """``torch.set_num_threads`` in each actor process (null: leave what the process has; a Ray worker without
    ``num_cpus`` starts with one thread). More than one helps a CPU actor when it trains while the env waits."""

    def __attrs_post_init__(self) -> None:
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"actor.global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"actor.micro_batch_size ({self.micro_batch_size})"
            )
