"""The PPO update schedule, written once for every actor (embodied, LLM on FSDP2, LLM on Megatron).

One update is ``epochs`` passes over a batch. Each pass cuts the batch into mini-batches (one optimizer step
each); every rank takes its share of each mini-batch and splits it into micro-batches whose gradients are
accumulated. The pieces:

- :func:`shuffled_minibatches`: one epoch's mini-batches from a permutation drawn from a generator seeded
  identically on every rank, rank ``r`` keeping the contiguous block ``r`` of each (the LLM actors; the
  embodied trainer draws its own stratified mini-batches and plugs them in the same way);
- :func:`micro_batches`: a rank's rows cut into micro-batches;
- :func:`run_update`: the epochs x mini-batches loop, counting optimizer steps;
- :func:`accumulate_gradients`: ``zero_grad``, then ``(loss / num_micro).backward()`` per micro-batch (the
  backends that run their own backward; Megatron's pipeline schedule accumulates by itself);
- :class:`MetricMeans` and :func:`mean_over_ranks`: per-key means of the micro-batch metrics, then the mean
  over ranks (every rank ran the same number of micro-batches, so the mean of the rank means is global);
- :func:`lr_scale` and :func:`clip_gradients`: the learning-rate schedule and the global gradient norm.

Float additions happen in the same order as in a hand-written loop, so results are bit-identical to it.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

if TYPE_CHECKING:
    from .._config import OptimConfig

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
    "run_update",
    "shuffled_minibatches",
    "token_budget_micro_batches",
]

SUM_PREFIX = "__sum__/"
"""Metrics under this prefix are sufficient statistics to be summed (e.g. for the explained variance)."""

_Micro = TypeVar("_Micro")


class MetricMeans:
    """Running per-key sums and counts of metrics; keys under :data:`SUM_PREFIX` are summed apart.

    Values may be Python floats or 0-d tensors. Tensors stay where they are (on the GPU) and are summed in
    float64 there, so adding a micro-batch's metrics never waits for the device; :meth:`means` and
    :meth:`total_values` read them back once, at the end of the update. float64 sums of float32 values are
    the sums Python floats would give, bit for bit.

    Attributes:
        sums: weighted sum of the values of each averaged key.
        counts: sum of the weights of each averaged key (the number of values when all weigh 1).
        totals: sum of each :data:`SUM_PREFIX` key (not averaged).
    """

    def __init__(self) -> None:
        self.sums: defaultdict[str, float | torch.Tensor] = defaultdict(float)
        self.counts: defaultdict[str, float] = defaultdict(float)
        self.totals: defaultdict[str, float | torch.Tensor] = defaultdict(float)

    def add(self, metrics: Mapping[str, float | torch.Tensor], weight: float = 1.0) -> None:
        """Add one value per key (a micro-batch's metrics, or an optimizer step's gradient norm).

        Args:
            metrics: the values (floats or 0-d tensors).
            weight: their weight in the means (a micro-batch's share of its mini-batch's loss).
        """
        for key, val in metrics.items():
            if isinstance(val, torch.Tensor):
                val = val.detach().reshape(()).to(torch.float64)
            if key.startswith(SUM_PREFIX):
                self.totals[key] += val
            else:
                self.sums[key] += val * weight
                self.counts[key] += weight

    def means(self) -> dict[str, float]:
        """The (weighted) mean of each averaged key, keys sorted."""
        keys = sorted(self.sums)
        return dict(zip(keys, _as_floats([self.sums[k] / self.counts[k] for k in keys]), strict=True))

    def weighted_sums(self) -> dict[str, float]:
        """The weighted sum of each averaged key (divide by :attr:`counts` for the means), keys sorted."""
        keys = sorted(self.sums)
        return dict(zip(keys, _as_floats([self.sums[k] for k in keys]), strict=True))

    def total_values(self) -> dict[str, float]:
        """The sum of each :data:`SUM_PREFIX` key, keys sorted."""
        keys = sorted(self.totals)
        return dict(zip(keys, _as_floats([self.totals[k] for k in keys]), strict=True))


def _as_floats(values: Sequence[float | torch.Tensor]) -> list[float]:
    """Python floats of ``values``, reading all tensors back in one transfer."""
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if not tensors:
        return [float(v) for v in values]
    device = tensors[0].device
    fetched = iter(torch.stack([t.to(device) for t in tensors]).tolist())
    return [next(fetched) if isinstance(v, torch.Tensor) else float(v) for v in values]


def check_layout(rank: int, world_size: int, global_batch_size: int, micro_batch_size: int) -> None:
    """Refuse a rank outside the group, or a batch the ranks cannot split into whole micro-batches.

    Raises:
        ValueError: naming ``rank``/``world_size`` or the batch keys.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in [0, world_size={world_size}), got rank={rank}")
    if global_batch_size % (micro_batch_size * world_size):
        raise ValueError(
            f"actor.global_batch_size ({global_batch_size}) must be a multiple of "
            f"actor.micro_batch_size ({micro_batch_size}) x actor world size ({world_size})"
        )


def mean_over_ranks(
    metrics: Mapping[str, float],
    world_size: int,
    reduce_sum: Callable[[torch.Tensor], torch.Tensor] | None,
) -> dict[str, float]:
    """Average per-rank metric means over ``world_size`` ranks (float64 sum, then divide); one rank: a copy.

    Args:
        metrics: this rank's means.
        world_size: number of data-parallel ranks.
        reduce_sum: sums a ``[K]`` tensor over the ranks (required when ``world_size > 1``).
    """
    if world_size == 1:
        return dict(metrics)
    if reduce_sum is None:
        raise ValueError(f"world_size={world_size} needs reduce_sum (a sum over the data-parallel ranks)")
    keys = list(metrics)
    total = reduce_sum(torch.tensor([metrics[k] for k in keys], dtype=torch.float64))
    return dict(zip(keys, (total / world_size).tolist(), strict=True))


def shuffled_minibatches(
    num_rows: int,
    *,
    global_batch_size: int,
    rank: int,
    world_size: int,
    generator: torch.Generator,
) -> list[torch.Tensor]:
    """One epoch's mini-batches: this rank's rows of each, from one permutation of ``num_rows`` rows.

    The permutation is drawn from ``generator`` (seeded identically on every rank, so all ranks agree) and cut
    into mini-batches of ``global_batch_size`` rows (the last one may be smaller); rank ``r`` keeps the
    contiguous block ``r`` of ``1/world_size`` of each. W ranks thus see exactly the one-rank mini-batches.

    Returns:
        One int64 tensor of row indices per mini-batch.
    """
    perm = torch.randperm(num_rows, generator=generator)
    out = []
    for start in range(0, num_rows, global_batch_size):
        mini = perm[start : start + global_batch_size]
        share = mini.shape[0] // world_size
        out.append(mini[rank * share : (rank + 1) * share])
    return out


def micro_batches(rows: torch.Tensor, size: int) -> list[torch.Tensor]:
    """``rows`` cut into ``len(rows) // size`` micro-batches of ``size`` indices (a remainder is dropped)."""
    return [rows[k * size : (k + 1) * size] for k in range(rows.shape[0] // size)]


def token_budget_micro_batches(
    rows: torch.Tensor, tokens: torch.Tensor, budget: int, *, count: int | None = None
) -> list[torch.Tensor]:
    """``rows`` cut, in order, into micro-batches of at most ``budget`` tokens each (as far as rows allow).

    Without ``count``: the fewest contiguous micro-batches whose token sums stay within ``budget`` (a row longer
    than the budget is a micro-batch of its own). With ``count`` (at least that many, at most ``len(rows)``):
    exactly ``count`` non-empty contiguous micro-batches with the largest token sum as small as possible, so that
    data-parallel ranks, which must run the same number of forward and backward passes, can agree on the largest
    count any of them needs.

    Args:
        rows: ``[n]`` row indices of one mini-batch (this rank's).
        tokens: ``[n]`` token count of each of those rows (e.g. its attended tokens).
        budget: ``actor.max_tokens_per_mbs``.
        count: the number of micro-batches to make (``None``: as few as the budget allows).

    Returns:
        The micro-batches as int64 index tensors (views of ``rows``).
    """
    n = rows.shape[0]
    sizes = [int(t) for t in tokens.tolist()]
    if n == 0:
        return []

    def cuts(cap: int) -> list[int]:
        """Start index of each micro-batch of the greedy packing under ``cap`` tokens."""
        starts, total = [0], 0
        for i, size in enumerate(sizes):
            if total and total + size > cap:
                starts.append(i)
                total = 0
            total += size
        return starts

    if count is None:
        starts = cuts(budget)
    else:
        if not 1 <= count <= n:
            raise ValueError(f"count must be in [1, {n}] (the rows of the mini-batch), got {count}")
        lo, hi = max(sizes), sum(sizes)  # the smallest cap that greedy packs into <= count micro-batches
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if len(cuts(mid)) <= count else (mid + 1, hi)
        starts = cuts(lo)
        while len(starts) < count:  # split the largest splittable micro-batch at its token midpoint
            bounds = [*starts, n]
            spans = [(sum(sizes[a:b]), a, b) for a, b in itertools.pairwise(bounds) if b - a > 1]
            _, a, b = max(spans)
            half, acc, cut = sum(sizes[a:b]) / 2, 0, a + 1
            for i in range(a, b - 1):
                acc += sizes[i]
                if acc >= half:
                    cut = i + 1
                    break
            starts = sorted([*starts, cut])
    bounds = [*starts, n]
    return [rows[a:b] for a, b in itertools.pairwise(bounds)]


def loss_shares(
    micro: Sequence[torch.Tensor], loss_mask: torch.Tensor, loss_agg_func: str
) -> list[float] | None:
    """Weights of micro-batches of unequal size: each one's share of its mini-batch's loss normaliser.

    A token mean (``token-mean``) weighs by loss-mask tokens, the sequence means by rows, so that gradients
    accumulated with these weights are those of the loss over the whole mini-batch.

    Args:
        micro: the micro-batches' row indices.
        loss_mask: ``[N, T]`` loss mask of the rows the indices point into.
        loss_agg_func: ``algorithm.loss_agg_func``.

    Returns:
        One weight per micro-batch (summing to 1), or ``None`` when the mini-batch has no loss token.
    """
    if loss_agg_func.lower() == "token-mean":
        sizes = [float(loss_mask[m].sum()) for m in micro]
    else:
        sizes = [float(m.shape[0]) for m in micro]
    total = sum(sizes)
    return None if total == 0 else [size / total for size in sizes]


def run_update(
    *,
    epochs: int,
    minibatches: Callable[[], Iterable[torch.Tensor]],
    step: Callable[[torch.Tensor], None],
) -> int:
    """``epochs`` passes, each over ``minibatches()`` (drawn once per epoch), calling ``step(rows)`` on each.

    Args:
        epochs: ``algorithm.update_epoch``.
        minibatches: draws one epoch's mini-batches (this rank's rows of each).
        step: one optimizer step on a mini-batch.

    Returns:
        The number of optimizer steps (mini-batches) run.
    """
    steps = 0
    for _epoch in range(epochs):
        for rows in minibatches():
            step(rows)
            steps += 1
    return steps


def accumulate_gradients(
    micro: Sequence[_Micro],
    loss_fn: Callable[[_Micro], tuple[torch.Tensor, Mapping[str, float | torch.Tensor]]],
    optimizer: torch.optim.Optimizer,
    metrics: MetricMeans,
    weights: Sequence[float] | None = None,
) -> None:
    """Zero the gradients, then ``(loss * w).backward()`` for each micro-batch, adding its metrics.

    Args:
        micro: the micro-batches (whatever ``loss_fn`` takes).
        loss_fn: a micro-batch's loss and metrics.
        optimizer: whose gradients are zeroed first.
        metrics: collects each micro-batch's metrics.
        weights: one weight per micro-batch (``None``: ``1 / len(micro)`` each, so the accumulated gradient is
            the mean over micro-batches of the micro-batch losses' gradients). Micro-batches of unequal size
            pass their share of the mini-batch (of tokens for a token mean, of rows for a sequence mean), which
            makes the accumulated gradient that of the whole mini-batch's loss; their metrics are averaged with
            the same weights.
    """
    if weights is not None and len(weights) != len(micro):
        raise ValueError(f"{len(weights)} weights for {len(micro)} micro-batches")
    optimizer.zero_grad(set_to_none=True)
    for k, mb in enumerate(micro):
        loss, values = loss_fn(mb)
        w = 1.0 / len(micro) if weights is None else weights[k]
        (loss * w).backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        metrics.add(values, 1.0 if weights is None else w)


def clip_gradients(parameters: Iterable[nn.Parameter], max_norm: float | None) -> float:
    """Clip the global gradient norm to ``max_norm`` (``None``: no clipping); returns the norm before clipping.

    Under FSDP2 the norm is a replicated ``DTensor``: its full value is read, identical on every rank.
    """
    norm = nn.utils.clip_grad_norm_(parameters, max_norm if max_norm is not None else math.inf)
    full = getattr(norm, "full_tensor", None)
    return float(full() if callable(full) else norm)


def adamw(
    params: Iterable[Any], optim: OptimConfig, *, lr: float | None = None, fused: bool | None = None
) -> torch.optim.AdamW:
    """AdamW with ``actor.optim``'s betas, epsilon and weight decay over ``params`` (tensors or param groups).

    ``lr``: the learning rate of groups that set none (default ``optim.lr``). ``fused``: torch's fused kernel
    (one kernel over every parameter; the same update up to the order of float operations; ``None``: torch's
    default implementation). The state layout is the same either way, so checkpoints load across the choice.
    """
    return torch.optim.AdamW(
        params,
        lr=optim.lr if lr is None else lr,
        betas=(optim.adam_beta1, optim.adam_beta2),
        eps=optim.adam_eps,
        weight_decay=optim.weight_decay,
        fused=fused,
    )


def lr_scale(schedule: str, train_steps: int, total_steps: int | None) -> float:
    """Learning-rate factor after ``train_steps`` updates: ``linear`` decays 1 → 0 over ``total_steps``, else 1."""
    if schedule == "linear" and total_steps:
        return max(0.0, 1.0 - train_steps / total_steps)
    return 1.0


def resumed_schedule_total(
    saved: int | None, configured: int | None, *, reset: bool, warn: Callable[[str], object]
) -> int | None:
    """The learning-rate schedule total a resumed run uses: the one it started with, unless told otherwise.

    A resume whose ``runner.max_steps`` / ``max_epochs`` gives another total than the checkpoint's run keeps the
    saved total (the decay continues as the interrupted run would have), or, with ``reset``
    (``actor.optim.reset_lr_schedule_on_resume``), rebuilds it over the new total; either way ``warn`` is
    called with a message naming both totals.

    Args:
        saved: the total stored in the checkpoint (``None``: an older checkpoint without one; ``configured``
            is used silently).
        configured: the total of the resumed run's configuration.
        reset: use ``configured`` instead of ``saved``.
        warn: receives the warning text (e.g. a worker's ``log_warning``).

    Returns:
        The total the schedule uses from now on.
    """
    if saved is None or saved == configured:
        return configured
    if reset:
        warn(
            f"resume changes the step budget: the checkpoint's run had {saved} training steps, this run has "
            f"{configured}; the learning-rate schedule is rebuilt over {configured} "
            f"(actor.optim.reset_lr_schedule_on_resume=true)"
        )
        return configured
    warn(
        f"resume changes the step budget: the checkpoint's run had {saved} training steps, this run has "
        f"{configured}; the learning-rate schedule keeps its total of {saved} "
        f"(set actor.optim.reset_lr_schedule_on_resume=true to rebuild it over {configured})"
    )
    return saved
