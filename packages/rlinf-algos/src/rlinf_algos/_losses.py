"""PPO-family policy and value losses as pure array functions (RLinf 0.4 numerics and metric names).

Every function takes arrays of one namespace (numpy, torch with autograd, any array-API library) and returns
``(loss, metrics)``: ``loss`` is a 0-d array (differentiable for torch), ``metrics`` maps RLinf's metric names
to detached 0-d arrays. Contract: ``docs/algorithms.md#losses``; references: PPO
(https://arxiv.org/abs/1707.06347), dual clip (https://arxiv.org/abs/1912.09729), clip-higher (DAPO,
https://arxiv.org/abs/2503.14476), decoupled PPO (AReaL, https://arxiv.org/abs/2505.24298).
"""

from __future__ import annotations

from typing import Any

import array_api_compat

from ._aggregation import LossAggFn, masked_mean_ratio
from ._array import Array, as_float, check_same_shape, namespace, to_bool
from ._masked import masked_mean
from ._normalize import compute_critic_explained_variance_stats

__all__ = [
    "check_broadcast_to",
    "compute_decoupled_ppo_actor_loss",
    "compute_opd_actor_loss",
    "compute_ppo_actor_critic_loss",
    "compute_ppo_actor_loss",
    "compute_ppo_critic_loss",
    "huber_loss",
    "rollout_importance_weights",
    "stop_gradient",
]

Metrics = dict[str, Array]

FAST_PATH_METRIC_KEYS = (
    "actor/token_num",
    "actor/policy_loss",
    "actor/policy_loss_mbs_mean",
    "actor/policy_loss_abs",
    "actor/ratio",
    "actor/clipped_ratio",
    "actor/dual_cliped_ratio",
    "actor/approx_kl",
    "actor/clip_fraction",
)


# ----------------------------------------------------------------------------------------------- helpers
def stop_gradient(x: Array) -> Array:
    """``x.detach()`` for autograd tensors; the array itself for libraries without autograd (numpy)."""
    detach = getattr(x, "detach", None)
    return detach() if callable(detach) else x


def _shape(x: Array) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    out: list[int] = []
    for i in range(1, max(len(a), len(b)) + 1):
        da = a[-i] if i <= len(a) else 1
        db = b[-i] if i <= len(b) else 1
        if da != db and 1 not in (da, db):
            return None
        out.append(max(da, db))
    return tuple(reversed(out))


def check_broadcast_to(name: str, x: Array | None, target_name: str, target: Array) -> None:
    """Raise ValueError unless ``x`` broadcasts to ``target``'s shape WITHOUT enlarging it.

    This catches RLinf's silent mis-broadcasts, e.g. ``logprob_type=chunk_level`` (logprobs ``[N]``) with
    ``reward_type=action_level`` (advantages ``[N, 1]``), which would otherwise produce an ``[N, N]`` loss.
    """
    if x is None:
        return
    xs, ts = _shape(x), _shape(target)
    if xs == ts:
        return
    out = _broadcast_shape(xs, ts)
    if out != ts:
        result = "cannot broadcast" if out is None else f"would broadcast to {list(out)}"
        raise ValueError(
            f"{name} with shape {list(xs)} does not fit {target_name} with shape {list(ts)} ({result}); "
            f"{name} must have {target_name}'s shape or broadcast to it (check logprob_type / reward_type)"
        )


def _scalar(xp: Any, value: float, like: Array) -> Array:
    return xp.asarray(value, dtype=like.dtype, device=array_api_compat.device(like))


def _require_float(name: str, xp: Any, x: Array) -> None:
    if not xp.isdtype(x.dtype, "real floating"):
        raise ValueError(f"{name} must be a real floating array (RLinf uses float32), got dtype {x.dtype}")


def _mask_ratio(
    loss_mask: Array | None, loss_mask_sum: Array | None, max_episode_steps: int | float | None
) -> Array | None:
    """``loss_mask_sum / max_episode_steps`` when all three embodied inputs are given (RLinf's switch)."""
    if max_episode_steps is None or loss_mask_sum is None or loss_mask is None:
        return None
    return (loss_mask_sum * 1.0) / max_episode_steps


def huber_loss(error: Array, delta: float) -> Array:
    """Elementwise Huber loss ``0.5 e²`` if ``|e| < δ`` else ``δ (|e| - 0.5 δ)`` (RLinf ``huber_loss``).

    Args:
        error: any shape.
        delta: the switch point δ > 0.

    Returns:
        Same shape as ``error``.
    """
    xp = namespace(error)
    abs_err = xp.abs(error)
    return xp.where(abs_err < delta, 0.5 * error**2, delta * (abs_err - 0.5 * delta))


def _broadcast_copies(mask_shape: tuple[int, ...], shape: tuple[int, ...]) -> int:
    """How many entries of ``shape`` each mask entry covers when the mask is broadcast to it."""
    lead = len(shape) - len(mask_shape)
    copies = 1
    for i, n in enumerate(shape):
        if i < lead or mask_shape[i - lead] == 1:
            copies *= n
    return copies


class _MaskInfo:
    """A loss mask with its boolean/float views and counts, computed once per loss call."""

    def __init__(self, xp: Any, mask: Array, like: Array) -> None:
        self.bool = to_bool(xp, mask)
        self.float = as_float(xp, mask, like=like)
        nonzero = int(xp.count_nonzero(self.bool))
        self.any = nonzero > 0
        # RLinf: ``loss_mask.count_nonzero() or 1`` (clip_fraction / approx_kl denominators).
        self.count = nonzero if nonzero > 0 else 1
        # masked_mean divides by ``mask.sum()`` (the same number for a boolean mask).
        self.mask_sum: Array | int = nonzero if mask.dtype == xp.bool else xp.sum(self.float)
        # Metrics expand a trailing-1 mask to the log-probs' shape (RLinf ``loss_mask.expand_as(ratio)``):
        # token_level gives ratio [N,C,D] with mask [N,C,1], or [N,1,1] under chunk_level rewards, where
        # every mask entry then stands for C x D metric entries.
        rs, ms = _shape(like), _shape(mask)
        expand = len(rs) > 2 and len(ms) > 0 and ms[-1] == 1 and rs[-1] > 1
        self.metric_den: Array | int = self.mask_sum * _broadcast_copies(ms, rs) if expand else self.mask_sum

    def metric_mean(self, total: Array) -> Array:
        """``masked_mean(x, metric_mask)`` from ``total = sum(x * mask)`` (the zero sum if the mask is empty)."""
        return total / self.metric_den if self.any else total


def _aggregate(
    xp: Any,
    values: Array,
    mask: _MaskInfo,
    raw_mask: Array,
    agg: LossAggFn,
    ratio: Array | None,
    *,
    zeroed: bool = False,
) -> Array:
    """``agg(values, mask, ratio)``; the default token-mean reuses the cached mask.

    ``zeroed``: ``values`` is already exactly 0 wherever the mask is false, so ``sum(values * mask)`` is
    ``sum(values)``.
    """
    if ratio is not None:
        return masked_mean_ratio(values, raw_mask, ratio)
    if agg is masked_mean:
        total = xp.sum(values) if zeroed else xp.sum(values * mask.float)
        # masked_mean: sum over the count of mask entries, or the (zero) sum when the mask is empty.
        return total / mask.mask_sum if mask.any else total
    return agg(values, raw_mask, None)


# ------------------------------------------------------------------------------------------- PPO actor
def _fast_path_zero(xp: Any, logprobs: Array) -> tuple[Array, Metrics]:
    zero = _scalar(xp, 0.0, logprobs)
    return zero, {k: _scalar(xp, 0.0, logprobs) for k in FAST_PATH_METRIC_KEYS}


def compute_ppo_actor_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    loss_mask: Array | None = None,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = None,
    loss_agg_func: LossAggFn = masked_mean,
    max_episode_steps: int | float | None = None,
    loss_mask_sum: Array | None = None,
    critic_warmup: bool = False,
    clip_log_ratio_min: float | None = None,
    clip_log_ratio_max: float | None = None,
    fast_path_zero_loss_mask: bool = False,
) -> tuple[Array, Metrics]:
    """PPO clipped surrogate with asymmetric (clip-higher) bounds, optional dual clip and log-ratio clip.

    ``ratio = exp(clamp(logprobs - old_logprobs))`` (0 where masked); per entry
    ``loss = max(-A·ratio, -A·clamp(ratio, 1-clip_ratio_low, 1+clip_ratio_high))``, then, with dual clip,
    ``min(loss, clip_ratio_c·|A|)``; aggregated by ``loss_agg_func(loss, loss_mask, None)`` or, for embodied
    batches (``max_episode_steps`` and ``loss_mask_sum`` and ``loss_mask`` given), by
    :func:`masked_mean_ratio` with ``loss_mask_sum / max_episode_steps``.

    Args:
        logprobs: ``[N, ...]`` current log-probs, e.g. ``[B, L]`` (reasoning), ``[N, C]`` (action level),
            ``[N, C, D]`` (token level), ``[N]`` (chunk level). Gradients flow through this argument only.
        old_logprobs: same shape as ``logprobs`` (behaviour policy).
        advantages: ``logprobs``'s shape or broadcastable to it without enlarging it (``[N, C, 1]``).
        loss_mask: boolean/0-1, broadcastable to ``logprobs``; ``None`` = all valid.
        clip_ratio_low: ε_low (ratio lower bound ``1 - ε_low``).
        clip_ratio_high: ε_high (ratio upper bound ``1 + ε_high``; DAPO clip-higher uses ε_high > ε_low).
        clip_ratio_c: dual-clip constant c > 1, or ``None`` for no dual clip.
        loss_agg_func: aggregator ``agg(values, mask, None)`` (see ``get_loss_agg_func``).
        max_episode_steps: embodied episode limit (switches to the ratio aggregator, see above).
        loss_mask_sum: ``[N, ...]`` valid-step count of each entry's trajectory (embodied).
        critic_warmup: when true the returned loss is a constant 0 (metrics still computed).
        clip_log_ratio_min: lower clamp of ``logprobs - old_logprobs`` before ``exp``.
        clip_log_ratio_max: upper clamp of ``logprobs - old_logprobs`` before ``exp``.
        fast_path_zero_loss_mask: return 0 and zero metrics when ``loss_mask[0]`` has no valid entry
            (RLinf inspects only the first row).

    Returns:
        ``(loss, metrics)`` with metrics ``actor/policy_loss``, ``actor/policy_loss_abs``, ``actor/ratio``,
        ``actor/ratio_abs``, ``actor/clipped_ratio``, ``actor/dual_cliped_ratio``, ``actor/approx_kl``,
        ``actor/clip_fraction`` (RLinf names; the fast path returns its own key set).

    Raises:
        ValueError: if a shape does not fit ``logprobs``, an input is not floating, or ``clip_ratio_c <= 1``.
    """
    xp = namespace(logprobs, old_logprobs, advantages, loss_mask)
    if fast_path_zero_loss_mask and loss_mask is not None and not bool(xp.any(to_bool(xp, loss_mask[0]))):
        return _fast_path_zero(xp, logprobs)
    _check_actor_inputs(xp, logprobs, old_logprobs, advantages, loss_mask, loss_mask_sum)
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1.0, got {clip_ratio_c}")

    ratio_w = _mask_ratio(loss_mask, loss_mask_sum, max_episode_steps)
    raw_mask = (
        loss_mask
        if loss_mask is not None
        else xp.ones(logprobs.shape, dtype=xp.bool, device=array_api_compat.device(logprobs))
    )
    mask = _MaskInfo(xp, raw_mask, logprobs)

    log_ratio = logprobs - old_logprobs
    if clip_log_ratio_min is not None or clip_log_ratio_max is not None:
        log_ratio = xp.clip(log_ratio, min=clip_log_ratio_min, max=clip_log_ratio_max)
    ratio = xp.where(mask.bool, xp.exp(log_ratio), 0.0)
    ratio_d = stop_gradient(ratio)
    clipped_ratio = xp.clip(ratio_d, min=1.0 - clip_ratio_low, max=1.0 + clip_ratio_high)
    neg_adv = -advantages
    loss1 = neg_adv * ratio
    # The clipped branch carries no gradient w.r.t. logprobs where it wins (clamp is flat there) and
    # equals ``loss1`` where it does not bind, so selecting it with ``where`` gives RLinf's values and
    # gradients without differentiating through clamp/maximum. Masked entries are set to exactly 0
    # (RLinf multiplies them by the mask), so the masked sums below need no extra mask pass.
    loss2 = neg_adv * clipped_ratio
    clip_mask = (stop_gradient(loss2) > stop_gradient(loss1)) & mask.bool
    per_entry = xp.where(clip_mask, loss2, loss1)
    dual_mask = None
    if clip_ratio_c is not None:
        loss3 = xp.abs(advantages) * clip_ratio_c  # == sign(A) * c * A, bit for bit
        dual_mask = stop_gradient(loss3) < stop_gradient(per_entry)
        per_entry = xp.where(dual_mask, loss3, per_entry)

    per_entry_d = stop_gradient(per_entry)
    policy_loss_abs = _aggregate(xp, xp.abs(per_entry_d), mask, raw_mask, loss_agg_func, ratio_w, zeroed=True)
    policy_loss = _aggregate(xp, per_entry, mask, raw_mask, loss_agg_func, ratio_w, zeroed=True)
    if critic_warmup:
        policy_loss = _scalar(xp, 0.0, logprobs)

    metrics = _ppo_metrics(xp, mask, stop_gradient(log_ratio), ratio_d, clipped_ratio, clip_mask, dual_mask)
    return policy_loss, {
        "actor/policy_loss": stop_gradient(policy_loss),
        "actor/policy_loss_abs": stop_gradient(policy_loss_abs),
        **metrics,
    }


def _check_actor_inputs(
    xp: Any,
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    loss_mask: Array | None,
    loss_mask_sum: Array | None,
) -> None:
    check_same_shape(logprobs=logprobs, old_logprobs=old_logprobs)
    check_broadcast_to("advantages", advantages, "logprobs", logprobs)
    check_broadcast_to("loss_mask", loss_mask, "logprobs", logprobs)
    check_broadcast_to("loss_mask_sum", loss_mask_sum, "logprobs", logprobs)
    for name, x in (("logprobs", logprobs), ("old_logprobs", old_logprobs), ("advantages", advantages)):
        _require_float(name, xp, x)


def _ppo_metrics(
    xp: Any,
    mask: _MaskInfo,
    log_ratio: Array,
    ratio: Array,
    clipped_ratio: Array,
    clip_mask: Array,
    dual_mask: Array | None,
) -> Metrics:
    """Detached PPO metrics (inputs already detached); RLinf's denominators, fewest passes."""
    fmask = mask.float
    # ``ratio`` is already 0 where the mask is false, so its masked sum is its plain sum, and
    # ``|ratio - mask|`` is ``|ratio - 1|`` on valid entries and 0 elsewhere.
    ratio_sum = xp.sum(ratio)
    ratio_abs_sum = xp.sum(xp.abs(ratio - fmask))
    clipped_sum = xp.sum(clipped_ratio * fmask)
    if dual_mask is None:
        dual_sum = xp.zeros((), dtype=ratio.dtype, device=array_api_compat.device(ratio))
    else:
        dual_sum = xp.sum(xp.where(dual_mask, ratio, 0.0))
    clip_count = xp.astype(xp.count_nonzero(clip_mask), ratio.dtype)
    kl_sum = xp.sum(xp.where(mask.bool, log_ratio, 0.0))
    count = float(mask.count)
    return {
        "actor/ratio": mask.metric_mean(ratio_sum),
        "actor/ratio_abs": mask.metric_mean(ratio_abs_sum),
        "actor/clipped_ratio": mask.metric_mean(clipped_sum),
        "actor/dual_cliped_ratio": mask.metric_mean(dual_sum),
        "actor/approx_kl": -kl_sum / count,
        "actor/clip_fraction": clip_count / count,
    }


# ----------------------------------------------------------------------------------------- PPO critic
def compute_ppo_critic_loss(
    values: Array,
    returns: Array,
    prev_values: Array,
    loss_mask: Array | None = None,
    *,
    value_clip: float,
    huber_delta: float,
    max_episode_steps: int | float | None = None,
    loss_mask_sum: Array | None = None,
    loss_agg_func: LossAggFn | None = None,
) -> tuple[Array, Metrics]:
    """Clipped Huber value loss ``max(huber(R - V), huber(R - V_clip))`` (RLinf ``compute_ppo_critic_loss``).

    ``V_clip = prev_values + clamp(values - prev_values, ±value_clip)``. Aggregated with token-mean over
    ``loss_mask`` (any ``loss_agg_func`` is ignored, as in RLinf) or, for embodied batches, with
    :func:`masked_mean_ratio`. No value coefficient is applied.

    Args:
        values: ``[N, ...]`` current value predictions (gradients flow through this argument).
        returns: same shape (targets).
        prev_values: same shape (values at rollout time).
        loss_mask: boolean/0-1 broadcastable to ``values``; ``None`` = plain mean.
        value_clip: clip range of the value update.
        huber_delta: Huber switch point.
        max_episode_steps: embodied episode limit (with ``loss_mask`` and ``loss_mask_sum``: ratio mean).
        loss_mask_sum: embodied valid-length counts, broadcastable to ``values``.
        loss_agg_func: accepted and IGNORED, as in RLinf (its Megatron critic passes one).

    Returns:
        ``(loss, metrics)`` with ``critic/value_loss``, ``critic/value_clip_ratio`` and the five
        ``__sum__/_critic_explained_variance/*`` sufficient statistics (see
        :func:`compute_critic_explained_variance_from_stats`).
    """
    xp = namespace(values, returns, prev_values, loss_mask)
    if value_clip is None or huber_delta is None:
        raise TypeError(
            "compute_ppo_critic_loss needs value_clip and huber_delta (got "
            f"value_clip={value_clip!r}, huber_delta={huber_delta!r})"
        )
    check_same_shape(values=values, returns=returns, prev_values=prev_values)
    check_broadcast_to("loss_mask", loss_mask, "values", values)
    check_broadcast_to("loss_mask_sum", loss_mask_sum, "values", values)
    del loss_agg_func  # RLinf's critic always token-means (or ratio-means) its loss
    ratio_w = _mask_ratio(loss_mask, loss_mask_sum, max_episode_steps)

    v_clipped = prev_values + xp.clip(values - prev_values, min=-value_clip, max=value_clip)
    per_entry = xp.maximum(
        huber_loss(returns - values, huber_delta), huber_loss(returns - v_clipped, huber_delta)
    )
    if ratio_w is not None:
        value_loss = masked_mean_ratio(per_entry, loss_mask, ratio_w)
    else:
        value_loss = masked_mean(per_entry, loss_mask)
    # Only float rounding makes this non-zero; the op order is RLinf's.
    clip_ratio = xp.mean(xp.astype(xp.abs(stop_gradient(v_clipped) - prev_values) > value_clip, values.dtype))
    metrics: Metrics = {
        "critic/value_loss": stop_gradient(value_loss),
        "critic/value_clip_ratio": clip_ratio,
    }
    metrics.update(compute_critic_explained_variance_stats(returns, values, loss_mask))
    return value_loss, metrics


def compute_ppo_actor_critic_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    values: Array,
    returns: Array,
    prev_values: Array,
    loss_mask: Array | None = None,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    value_clip: float,
    huber_delta: float,
    clip_ratio_c: float | None = None,
    loss_agg_func: LossAggFn = masked_mean,
    max_episode_steps: int | float | None = None,
    loss_mask_sum: Array | None = None,
    critic_warmup: bool = False,
    clip_log_ratio_min: float | None = None,
    clip_log_ratio_max: float | None = None,
    fast_path_zero_loss_mask: bool = False,
) -> tuple[Array, Metrics]:
    """PPO actor loss plus clipped Huber critic loss, summed without a value coefficient (``"actor_critic"``).

    Args: as :func:`compute_ppo_actor_loss` and :func:`compute_ppo_critic_loss` (values/returns/prev_values
    share the actor's entry shape, e.g. ``[N]`` chunk level or ``[N, C]`` action level).

    Returns:
        ``(actor_loss + critic_loss, actor metrics | critic metrics)``.
    """
    actor_loss, metrics = compute_ppo_actor_loss(
        logprobs, old_logprobs, advantages, loss_mask,
        clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
        loss_agg_func=loss_agg_func, max_episode_steps=max_episode_steps, loss_mask_sum=loss_mask_sum,
        critic_warmup=critic_warmup, clip_log_ratio_min=clip_log_ratio_min,
        clip_log_ratio_max=clip_log_ratio_max, fast_path_zero_loss_mask=fast_path_zero_loss_mask,
    )  # fmt: skip
    critic_loss, critic_metrics = compute_ppo_critic_loss(
        values, returns, prev_values, loss_mask, value_clip=value_clip, huber_delta=huber_delta,
        max_episode_steps=max_episode_steps, loss_mask_sum=loss_mask_sum,
    )  # fmt: skip
    metrics.update(critic_metrics)
    return actor_loss + critic_loss, metrics


# -------------------------------------------------------------------------------------- decoupled PPO
def _proximal_from_versions(
    xp: Any, logprobs: Array, old_logprobs: Array, versions: Array, current_version: float
) -> Array:
    """AReaL's interpolated proximal policy: ``old + α (new - old)``, ``α = (v-1-v_b)/(v-v_b)`` in [0, 1]."""
    v_behav = xp.astype(versions, logprobs.dtype)
    v_theta = float(current_version)
    diff = v_theta - v_behav
    gap = (v_theta - 1.0) - v_behav
    valid = (diff > 0) & (versions >= 0)
    safe_diff = xp.where(valid, diff, 1.0)
    alpha = xp.where(valid, gap / safe_diff, 0.0)
    while alpha.ndim < logprobs.ndim:
        alpha = xp.expand_dims(alpha, axis=-1)
    alpha = xp.clip(alpha, min=0.0, max=1.0)
    return stop_gradient(old_logprobs + alpha * (logprobs - old_logprobs))


def compute_decoupled_ppo_actor_loss(
    logprobs: Array,
    old_logprobs: Array,
    advantages: Array,
    loss_mask: Array | None = None,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    proximal_logprobs: Array | None = None,
    versions: Array | None = None,
    current_version: float | None = None,
    clip_ratio_c: float | None = None,
    loss_agg_func: LossAggFn = masked_mean,
    max_episode_steps: int | float | None = None,
    loss_mask_sum: Array | None = None,
    critic_warmup: bool = False,
    behave_weight_threshold: float | None = None,
) -> tuple[Array, Metrics]:
    """Decoupled (asynchronous) PPO: clip against a proximal policy, importance-weight the behaviour gap.

    The proximal log-probs are ``proximal_logprobs`` if given; else ``old_logprobs`` (no version info);
    else AReaL's interpolation from per-entry ``versions`` and ``current_version``. Per entry
    ``pg = max(-A·r, -A·clamp(r, 1-ε_low, 1+ε_high))`` with ``r = exp(logprobs - prox)`` (optional dual
    clip), weighted by ``w = exp(prox - old_logprobs)`` and aggregated over
    ``behav_mask = mask & (w <= behave_weight_threshold)``.

    Args:
        logprobs: ``[N, ...]`` current log-probs (gradients flow here).
        old_logprobs: same shape, behaviour-policy log-probs.
        advantages: broadcastable to ``logprobs``.
        loss_mask: boolean/0-1 broadcastable to ``logprobs``; ``None`` = all valid.
        clip_ratio_low: ε_low.
        clip_ratio_high: ε_high.
        proximal_logprobs: same shape as ``logprobs``, or ``None``.
        versions: integer policy version that produced each entry (``< 0`` = not generated), ``[N, ...]``.
        current_version: the version being trained.
        clip_ratio_c: dual-clip constant c > 1, or ``None``.
        loss_agg_func: aggregator (replaced by the ratio mean for embodied batches).
        max_episode_steps: embodied episode limit.
        loss_mask_sum: embodied valid-length counts.
        critic_warmup: when true the returned loss is a constant 0.
        behave_weight_threshold: drop entries whose behaviour weight exceeds it.

    Returns:
        ``(loss, metrics)`` with ``actor/policy_loss``, ``actor/proximal_ratio``,
        ``actor/clipped_proximal_ratio``, ``actor/clip_fraction``, ``actor/dual_clip_fraction``,
        ``actor/behav_clip_fraction``, ``actor/proximal_approx_kl``, ``actor/behav_approx_kl`` and, when
        ``versions`` matches the mask's shape, ``actor/average_version`` and ``actor/current_version``.
    """
    xp = namespace(logprobs, old_logprobs, advantages, loss_mask, proximal_logprobs)
    _check_actor_inputs(xp, logprobs, old_logprobs, advantages, loss_mask, loss_mask_sum)
    check_same_shape(logprobs=logprobs, proximal_logprobs=proximal_logprobs)
    if clip_ratio_c is not None and not clip_ratio_c > 1.0:
        raise ValueError(f"clip_ratio_c must be greater than 1.0, got {clip_ratio_c}")
    # RLinf fills a missing mask BEFORE testing for the embodied ratio aggregator (unlike the PPO actor).
    raw_mask = (
        loss_mask
        if loss_mask is not None
        else xp.ones(logprobs.shape, dtype=xp.bool, device=array_api_compat.device(logprobs))
    )
    ratio_w = _mask_ratio(raw_mask, loss_mask_sum, max_episode_steps)
    bmask = to_bool(xp, raw_mask)

    if proximal_logprobs is None:
        if versions is None or current_version is None:
            prox = stop_gradient(old_logprobs)
        else:
            prox = _proximal_from_versions(xp, logprobs, old_logprobs, versions, current_version)
    else:
        prox = proximal_logprobs

    count = int(xp.count_nonzero(bmask)) or 1
    prox_ratio = xp.where(bmask, xp.exp(logprobs - prox), 0.0)
    clipped = xp.clip(prox_ratio, min=1.0 - clip_ratio_low, max=1.0 + clip_ratio_high)
    loss1 = -advantages * prox_ratio
    loss2 = -advantages * clipped
    pg = xp.maximum(loss1, loss2)
    dual_mask = xp.zeros(pg.shape, dtype=xp.bool, device=array_api_compat.device(pg))
    if clip_ratio_c is not None:
        loss3 = xp.sign(advantages) * clip_ratio_c * advantages
        dual_mask = stop_gradient(loss3) < stop_gradient(pg)
        pg = xp.minimum(pg, loss3)

    behav_w = xp.exp(prox - old_logprobs)
    behav_mask = bmask if behave_weight_threshold is None else (behav_w <= behave_weight_threshold) & bmask
    behav_count = int(xp.count_nonzero(behav_mask)) or 1
    if ratio_w is not None:
        pg_loss = masked_mean_ratio(pg * behav_w, behav_mask, ratio_w)
    else:
        pg_loss = loss_agg_func(pg * behav_w, behav_mask, None)
    if critic_warmup:
        pg_loss = _scalar(xp, 0.0, logprobs)

    d_prox, d_lp, d_old = stop_gradient(prox), stop_gradient(logprobs), stop_gradient(old_logprobs)

    def fraction(m: Array) -> Array:
        return xp.astype(xp.count_nonzero(m), logprobs.dtype) / count

    clip_frac = fraction((stop_gradient(loss1) < stop_gradient(loss2)) & bmask)
    metrics: Metrics = {
        "actor/policy_loss": stop_gradient(pg_loss),
        "actor/proximal_ratio": masked_mean(stop_gradient(prox_ratio), bmask),
        "actor/clipped_proximal_ratio": masked_mean(stop_gradient(clipped), bmask),
        "actor/clip_fraction": clip_frac,
        "actor/dual_clip_fraction": fraction(dual_mask & bmask),
        "actor/behav_clip_fraction": _scalar(xp, 1.0 - behav_count / count, logprobs),
        "actor/proximal_approx_kl": -xp.sum(xp.where(bmask, d_lp - d_prox, 0.0)) / count,
        "actor/behav_approx_kl": -xp.sum(xp.where(behav_mask, d_prox - d_old, 0.0)) / behav_count,
    }
    if (
        versions is not None
        and current_version is not None
        and _shape(versions) == _shape(bmask)
        and bool(xp.any(bmask))
    ):
        metrics["actor/average_version"] = xp.mean(xp.astype(versions[bmask], logprobs.dtype))
        metrics["actor/current_version"] = _scalar(xp, float(current_version), logprobs)
    return pg_loss, metrics


# ------------------------------------------------------------------------ rollout / trainer mismatch
def rollout_importance_weights(
    trainer_logprobs: Array,
    rollout_logprobs: Array,
    loss_mask: Array | None = None,
    *,
    clip: float,
) -> tuple[Array, Metrics]:
    """Truncated importance weights of the trainer's policy over the rollout engine's (no gradient).

    ``w = min(exp(trainer_logprobs - rollout_logprobs), clip)``, RLinf's ``importance_sampling_fix``. The rollout engine (vLLM, SGLang, another dtype or kernel) samples from a slightly different distribution
    than the trainer scores; multiplying the advantages by ``w`` corrects the policy gradient for that gap,
    truncated at ``clip`` to bound its variance (truncated importance sampling).

    Args:
        trainer_logprobs: ``[...]`` log-probs of the sampled tokens under the trainer's behaviour policy (the
            recomputed old log-probs).
        rollout_logprobs: same shape, as reported by the rollout engine.
        loss_mask: boolean (or 0/1) broadcastable to the log-probs: the tokens the metrics cover.
        clip: the truncation ``C > 0``.

    Returns:
        ``(w, metrics)``: ``w`` shaped like the log-probs (1 where the mask is false), and
        ``actor/is_weight_mean`` (masked mean of the untruncated weights), ``actor/is_weight_max`` and
        ``actor/is_clip_fraction`` (share of masked tokens truncated).

    Raises:
        ValueError: on a shape mismatch or ``clip <= 0``.
    """
    if not clip > 0:
        raise ValueError(f"importance_sampling_clip must be > 0, got {clip}")
    check_same_shape(trainer_logprobs=trainer_logprobs, rollout_logprobs=rollout_logprobs)
    xp = namespace(trainer_logprobs, rollout_logprobs, loss_mask)
    # exp of a clamped log-ratio: a token the rollout found far less likely cannot overflow to inf
    log_w = xp.clip(stop_gradient(trainer_logprobs) - stop_gradient(rollout_logprobs), min=-20.0, max=20.0)
    raw = xp.exp(log_w)
    everywhere = xp.ones(raw.shape, dtype=xp.bool, device=array_api_compat.device(raw))
    mask = everywhere if loss_mask is None else xp.broadcast_to(to_bool(xp, loss_mask), raw.shape)
    weights = xp.where(mask, xp.clip(raw, max=float(clip)), 1.0)
    count = int(xp.count_nonzero(mask))
    clipped = xp.count_nonzero((raw > clip) & mask)
    metrics: Metrics = {
        "actor/is_weight_mean": masked_mean(raw, mask),
        "actor/is_weight_max": xp.max(xp.where(mask, raw, 0.0)) if count else _scalar(xp, 0.0, raw),
        "actor/is_clip_fraction": xp.astype(clipped, raw.dtype) / max(count, 1),
    }
    return weights, metrics


# ------------------------------------------------------------------------------------------------- OPD
def compute_opd_actor_loss(
    logprobs: Array,
    advantages: Array,
    loss_mask: Array,
    loss_mask_sum: Array,
    *,
    loss_agg_func: LossAggFn = masked_mean,
    max_episode_steps: int | float | None = None,
) -> tuple[Array, Metrics]:
    """On-policy distillation loss ``agg(-logprobs · stop_grad(advantages))`` (RLinf ``"opd"``).

    ``advantages`` are the dense rewards ``teacher_logprobs - student_logprobs`` (see the ``opd`` advantage).

    Args:
        logprobs: ``[N, C, D]`` (token level) or ``[N, C]`` student log-probs (gradients flow here).
        advantages: exactly ``logprobs``'s shape.
        loss_mask: ``logprobs``'s shape, or with one fewer trailing dim / a trailing 1 (expanded).
        loss_mask_sum: as ``loss_mask``.
        loss_agg_func: aggregator; replaced by :func:`masked_mean_ratio` when ``max_episode_steps`` is set.
        max_episode_steps: embodied episode limit.

    Returns:
        ``(loss, metrics)`` with ``actor/policy_loss``, ``actor/opd_reward`` (masked mean reward) and
        ``actor/opd_reverse_kl`` (its negation).
    """
    xp = namespace(logprobs, advantages, loss_mask, loss_mask_sum)
    if loss_mask is None or loss_mask_sum is None:
        raise ValueError("compute_opd_actor_loss needs loss_mask and loss_mask_sum (got None)")
    check_same_shape(logprobs=logprobs, advantages=advantages)
    _require_float("logprobs", xp, logprobs)
    _require_float("advantages", xp, advantages)
    loss_mask = _expand_token_dim(xp, "loss_mask", loss_mask, logprobs)
    loss_mask_sum = _expand_token_dim(xp, "loss_mask_sum", loss_mask_sum, logprobs)
    ratio_w = None
    if max_episode_steps is not None:
        ratio_w = (loss_mask_sum * 1.0) / max_episode_steps
        loss_agg_func = masked_mean_ratio
    rewards = stop_gradient(advantages)
    loss = loss_agg_func(-logprobs * rewards, loss_mask, ratio_w)
    reward_mean = masked_mean(rewards, loss_mask)
    return loss, {
        "actor/policy_loss": stop_gradient(loss),
        "actor/opd_reward": reward_mean,
        "actor/opd_reverse_kl": masked_mean(-rewards, loss_mask),
    }


def _expand_token_dim(xp: Any, name: str, x: Array, logprobs: Array) -> Array:
    """Unsqueeze a missing trailing dim and expand a trailing 1 to ``logprobs``'s shape (else ValueError)."""
    if x.ndim == logprobs.ndim - 1:
        x = xp.expand_dims(x, axis=-1)
    xs, ts = _shape(x), _shape(logprobs)
    if xs != ts:
        if len(xs) != len(ts) or xs[:-1] != ts[:-1] or xs[-1] != 1:
            raise ValueError(
                f"{name} with shape {list(xs)} must match logprobs shape {list(ts)} "
                "(or equal it except for a trailing dim of 1)"
            )
        x = xp.broadcast_to(x, ts)
    return x
