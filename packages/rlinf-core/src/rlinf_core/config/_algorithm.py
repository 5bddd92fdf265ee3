"""``algorithm:`` — the RL algorithm settings shared by the actor, the runner and the env workers.

Key names and defaults follow the original RLinf embodied configs (``examples/embodiment/config``).
"""

from __future__ import annotations

from typing import Literal

import attrs
from attrs import validators as v
from rlinf_algos import advantage_registry, policy_loss_registry

from ._offpolicy import OFFPOLICY_LOSS_TYPES, DemoBufferConfig, EntropyTuningConfig, ReplayBufferConfig

__all__ = ["AlgorithmConfig"]

_LEVEL = Literal["chunk_level", "action_level", "token_level"]


def _registered_advantage(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if value not in advantage_registry and value not in OFFPOLICY_LOSS_TYPES:
        allowed = sorted([*advantage_registry, *OFFPOLICY_LOSS_TYPES])
        raise ValueError(f"unknown {attr.name} {value!r}; allowed: {', '.join(allowed)}")


def _registered_loss(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if value not in policy_loss_registry and value not in OFFPOLICY_LOSS_TYPES:
        allowed = sorted([*policy_loss_registry, *OFFPOLICY_LOSS_TYPES])
        raise ValueError(f"unknown {attr.name} {value!r}; allowed: {', '.join(allowed)}")


def _positive_or_none(_inst: object, attr: attrs.Attribute[float | None], value: float | None) -> None:
    if value is not None and value <= 0:
        raise ValueError(f"'{attr.name}' must be > 0 or null: {value}")


@attrs.frozen(kw_only=True)
class AlgorithmConfig:
    """RL algorithm settings (config ``algorithm``)."""

    adv_type: str = attrs.field(default="gae", validator=_registered_advantage)
    """Advantage estimator in the rlinf-algos registry: gae, grpo, grpo_video, grpo_dynamic, reinpp, opd, raw, or a
    registered one; ``embodied_sac`` with ``loss_type: embodied_sac``."""
    loss_type: str = attrs.field(default="actor_critic", validator=_registered_loss)
    """Policy loss in the rlinf-algos registry: actor, actor_critic, decoupled_actor_critic, opd, or a registered one;
    ``embodied_sac`` selects off-policy training (SAC, CrossQ, RLPD, TD3-style smoothing) from a replay buffer."""
    loss_agg_func: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    """How per-token (per-step) losses become one number: mean over valid tokens, or mean over sequences of
    their token sum / token mean."""
    update_epoch: int = attrs.field(default=4, validator=v.ge(1))
    """Passes over each rollout batch per training step; off-policy: gradient steps per training step (unless
    ``utd_ratio`` is set)."""
    rollout_epoch: int = attrs.field(default=1, validator=v.ge(1))
    """Rollouts collected (and concatenated) per training step."""
    eval_rollout_epoch: int = attrs.field(default=1, validator=v.ge(1))
    """Rounds per evaluation: each resets every ``env.eval`` env from the next seeds and runs one episode per env
    (``total_num_envs * eval_rollout_epoch`` episodes; with ``init_state_sampling: sequential`` the rounds walk
    through a LIBERO suite's (task, initial state) pairs)."""
    group_size: int = attrs.field(default=1, validator=v.ge(1))
    """Envs per GRPO group (sharing initial states)."""
    normalize_advantages: bool = True
    """Standardise advantages over the whole batch (masked mean and std) before the update."""
    reward_type: _LEVEL = "chunk_level"
    """Reward granularity: one per chunk (summed over its actions) or one per action."""
    logprob_type: _LEVEL = "action_level"
    """Granularity of the log-prob ratio: per action dimension (token), per action, or per chunk."""
    entropy_type: _LEVEL = "action_level"
    """Granularity at which the entropy bonus sums the policy entropy (as ``logprob_type``)."""
    gamma: float = attrs.field(default=0.99, validator=[v.ge(0.0), v.le(1.0)])
    """Discount factor of GAE and of the truncation bootstrap."""
    gae_lambda: float = attrs.field(default=0.95, validator=[v.ge(0.0), v.le(1.0)])
    """GAE smoothing factor λ (1: Monte-Carlo returns minus values, 0: one-step TD errors)."""
    clip_ratio_low: float = attrs.field(default=0.2, validator=v.gt(0.0))
    """PPO clip ε_low: the ratio is clipped below at ``1 - clip_ratio_low``."""
    clip_ratio_high: float = attrs.field(default=0.2, validator=v.gt(0.0))
    """PPO clip ε_high: the ratio is clipped above at ``1 + clip_ratio_high`` (DAPO clip-higher: > ε_low)."""
    clip_ratio_c: float | None = attrs.field(default=None, validator=_positive_or_none)
    """Dual-clip constant (> 1) or null for no dual clip (RLinf's embodied default)."""
    value_clip: float = attrs.field(default=0.2, validator=v.gt(0.0))
    """Critic loss: new values are clipped to within this distance of the rollout values."""
    huber_delta: float = attrs.field(default=10.0, validator=v.gt(0.0))
    """Critic loss: the Huber loss is quadratic below this error, linear above."""
    entropy_bonus: float = attrs.field(default=0.0, validator=v.ge(0.0))
    """Coefficient of the entropy subtracted from the loss (0: no entropy term)."""
    kl_beta: float = attrs.field(default=0.0, validator=v.ge(0.0))
    """Coefficient of the KL-to-reference term added to the LLM actor loss (0: no reference model)."""
    kl_penalty: Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"] = "kl"
    """Per-token KL estimator of ``kl_beta`` and ``reinpp_kl_beta`` (``k3`` = ``low_var_kl``: low variance, >= 0)."""
    importance_sampling_fix: bool = False
    """LLM: correct for the rollout engine sampling from a slightly different distribution than the trainer
    scores (another engine, dtype or kernel): each token's advantage is multiplied by
    ``min(exp(old_logprob - rollout_logprob), importance_sampling_clip)`` (truncated importance sampling; needs
    the rollout's log-probs, which the reasoning and agent runners always pass). Logged as ``actor/is_*``."""
    importance_sampling_clip: float = attrs.field(default=2.0, validator=v.gt(0.0))
    """The truncation of ``importance_sampling_fix``'s weights (RLinf's example config uses 1.0)."""
    critic_warmup_steps: int = attrs.field(default=0, validator=v.ge(0))
    """Optimizer steps during which only the critic learns (policy loss zeroed)."""
    bootstrap_type: Literal["standard", "always"] = "standard"
    """Add γ·V(final obs) to the last reward of a chunk that ended by truncation (standard) or by any done (always)."""
    use_reinpp_baseline: bool = False
    """Reinforce++: subtract each group's mean reward first (Reinforce++-baseline; needs ``group_size``)."""
    reinpp_kl_beta: float = attrs.field(default=0.0, validator=v.ge(0.0))
    """Reinforce++: per-token KL-to-reference penalty folded into the reward (estimator ``kl_penalty``)."""
    dynamic_sampling: bool = False
    """DAPO dynamic sampling (reasoning): drop groups whose rewards are all equal and keep generating until
    ``data.rollout_batch_size`` groups remain or ``max_num_gen_batches`` batches were generated."""
    max_num_gen_batches: int = attrs.field(default=1, validator=v.ge(1))
    """Generation batches per training step at most under ``dynamic_sampling``."""
    overlong_filter: bool = False
    """DAPO overlong filtering (reasoning): responses cut at the length limit get no loss."""
    overlong_buffer_len: int = attrs.field(default=0, validator=v.ge(0))
    """DAPO soft overlong punishment: length window ``L_cache`` before the limit (``0``: off)."""
    overlong_penalty_factor: float = attrs.field(default=1.0, validator=v.ge(0.0))
    """Scale of the soft overlong punishment (in ``[-factor, 0]``) added to the reward."""
    staleness_threshold: int = attrs.field(default=1, validator=v.ge(0))
    """Asynchronous embodied runs (``runner.mode: async``): how many updates the weights that chose a
    sample's action may lag behind the weights the sample trains (the env and rollout wait rather than
    exceed it); ``0`` gives the synchronous run's numbers."""
    # ------------------------------------------------------------------ off-policy (loss_type: embodied_sac)
    utd_ratio: float | None = attrs.field(default=None, validator=_positive_or_none)
    """Off-policy: gradient steps per collected transition (update-to-data ratio); a training step then makes
    ``round(utd_ratio x transitions collected)`` steps (``null``: ``update_epoch`` steps)."""
    random_warmup_steps: int = attrs.field(default=0, validator=v.ge(0))
    """Off-policy: training steps at the start whose actions are drawn uniformly from the action bounds."""
    tau: float = attrs.field(default=0.005, validator=[v.ge(0.0), v.le(1.0)])
    """Off-policy: Polyak factor of the target critics, ``θ' ← (1 - τ) θ' + τ θ``."""
    target_update_freq: int = attrs.field(default=1, validator=v.ge(1))
    """Off-policy: critic steps between soft target updates."""
    critic_actor_ratio: int = attrs.field(default=1, validator=v.ge(1))
    """Off-policy: critic steps per actor (and temperature) step."""
    agg_q: Literal["min", "mean"] = "min"
    """Off-policy: how the Q heads combine in the critic target (``min``: clipped double Q)."""
    actor_agg_q: Literal["min", "mean"] | None = None
    """Off-policy: how the Q heads combine in the actor loss (``null``: as ``agg_q``; RLPD uses ``mean``)."""
    backup_entropy: bool = True
    """Off-policy: subtract ``α log π(a'|s')`` from the bootstrapped value."""
    critic_subsample_size: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Off-policy: Q heads drawn (with replacement) for each target (REDQ / RLPD); ``null``: all heads."""
    q_head_type: Literal["default", "crossq"] = "default"
    """Off-policy: ``crossq`` uses batch-renormalised critics evaluated jointly on ``(s, a)`` and ``(s', a')``
    and no target networks (CrossQ)."""
    target_policy_noise: float | None = attrs.field(default=None, validator=_positive_or_none)
    """Off-policy: TD3-style target smoothing: the target action is the policy's mean plus clipped Gaussian noise
    of this std (and no entropy backup); ``null``: SAC's sampled target action."""
    target_noise_clip: float = attrs.field(default=0.5, validator=v.gt(0.0))
    """Off-policy: clip of the TD3 target noise."""
    replay_buffer: ReplayBufferConfig = attrs.field(factory=ReplayBufferConfig)
    """Off-policy: the online replay buffer."""
    demo_buffer: DemoBufferConfig | None = None
    """Off-policy: demonstrations sampled half-and-half with the online buffer (RLPD); ``null``: none."""
    entropy_tuning: EntropyTuningConfig = attrs.field(factory=EntropyTuningConfig)
    """Off-policy: the entropy temperature."""

    @property
    def is_offpolicy(self) -> bool:
        """Whether ``loss_type`` selects the off-policy (replay buffer) training path."""
        return self.loss_type in OFFPOLICY_LOSS_TYPES

    def __attrs_post_init__(self) -> None:
        if (self.loss_type in OFFPOLICY_LOSS_TYPES) != (self.adv_type in OFFPOLICY_LOSS_TYPES):
            raise ValueError(
                f"loss_type {self.loss_type!r} and adv_type {self.adv_type!r}: off-policy training is selected by "
                f"both together (allowed off-policy values: {', '.join(OFFPOLICY_LOSS_TYPES)})"
            )
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (dual clip) or null, got {self.clip_ratio_c}")
        if self.adv_type == "gae" and self.loss_type not in ("actor_critic", "decoupled_actor_critic"):
            raise ValueError(
                f"adv_type 'gae' needs a critic: loss_type must be 'actor_critic' or 'decoupled_actor_critic', got {self.loss_type!r}"
            )
