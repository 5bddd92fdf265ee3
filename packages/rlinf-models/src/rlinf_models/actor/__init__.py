"""rlinf_models.actor: what every actor shares (the PPO update schedule)."""

from ._schedule import (
    SUM_PREFIX,
    MetricMeans,
    accumulate_gradients,
    adamw,
    check_layout,
    clip_gradients,
    loss_shares,
    lr_scale,
    mean_over_ranks,
    micro_batches,
    resumed_schedule_total,
    run_update,
    shuffled_minibatches,
    token_budget_micro_batches,
)

__all__ = [
    "SUM_PREFIX",
    "MetricMeans",
    "accumulate_gradients",
    "adamw",
    "check_layout",
    "clip_gradients",
    "loss_shares",
    "lr_scale",
    "mean_over_ranks",
    "micro_batches",
    "resumed_schedule_total",
    "run_update",
    "shuffled_minibatches",
    "token_budget_micro_batches",
]
