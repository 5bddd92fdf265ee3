"""Off-policy and offline RL losses as pure array functions (SAC, CrossQ, IQL, TD3 smoothing, Polyak updates).

Everything here is a function of Q-values, log-probabilities and targets that the caller computed with its
own networks; nothing owns a model, an optimiser or a random generator. The math follows RLinf 0.4's
``EmbodiedSACFSDPPolicy`` (SAC / CrossQ / RLPD) and ``EmbodiedIQLFSDPPolicy`` (IQL) workers.

Layouts: ``B`` is the batch, ``H`` the number of Q heads (critic ensemble members), ``C`` the action-chunk
length (rewards and terminations of one chunked transition), ``K`` any trailing log-prob axis (chunk or
action dimensions, summed to one joint log-prob per sample).

Targets are returned *detached* and the losses detach their targets again: with torch tensors the gradient
of a critic loss flows only into ``q_values``, the actor loss only into ``log_probs`` and the Q-values of
the policy's actions, and the temperature loss only into ``alpha``. Detaching uses the array's own
``.detach()`` when it has one (torch); arrays without autograd (numpy, ...) are used as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, Literal

from .._array import Array, as_float, check_ndim, namespace, to_bool

__all__ = [
    "aggregate_q",
    "crossq_critic_target",
    "expectile_loss",
    "iql_actor_loss",
    "iql_critic_loss",
    "iql_critic_target",
    "iql_value_loss",
    "sac_actor_loss",
    "sac_alpha",
    "sac_alpha_param_init",
    "sac_critic_loss",
    "sac_critic_target",
    "sac_temperature_loss",
    "split_crossq_q",
    "subsample_q_heads",
    "td3_critic_target",
    "td3_target_actions",
]

QAgg = Literal["min", "mean"]
BootstrapType = Literal["standard", "always"]
AlphaType = Literal["softplus", "exp", "fixed_alpha"]

_Q_AGGS = ("min", "mean")
_BOOTSTRAP_TYPES = ("standard", "always")
_ALPHA_TYPES = ("softplus", "exp", "fixed_alpha")


# --------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------


def _stop_gradient(x: Any) -> Any:
    """``x.detach()`` when ``x`` carries autograd (torch); ``x`` itself otherwise (numpy, floats)."""
    detach = getattr(x, "detach", None)
    return detach() if callable(detach) else x


def _shape(x: Array) -> tuple[int, ...]:
    return tuple(int(d) for d in x.shape)


def _check_choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def _check_batch(name: str, x: Array, batch: int, layout: str) -> None:
    if int(x.shape[0]) != batch:
        raise ValueError(f"{name} must have layout {layout} with B={batch}, got shape {_shape(x)}")


def _as_column(name: str, x: Array, layout: str) -> Array:
    """``[B]`` → ``[B, 1]``; ``[B, K]`` → row sum ``[B, 1]`` (RLinf ``x.sum(-1, keepdim=True)``)."""
    xp = namespace(x)
    check_ndim(name, x, (1, 2), layout)
    if x.ndim == 1:
        return xp.reshape(x, (-1, 1))
    return xp.sum(x, axis=-1, keepdims=True)


def _alpha_value(alpha: float | Array) -> float | Array:
    """Alpha as used inside the critic/actor losses: a constant (RLinf passes ``alpha.item()``)."""
    if isinstance(alpha, int | float):
        return float(alpha)
    return _stop_gradient(alpha)


# --------------------------------------------------------------------------------------------------------
# Q-head aggregation and subsampling
# --------------------------------------------------------------------------------------------------------


def aggregate_q(q_values: Array, *, agg: QAgg = "min") -> Array:
    """Aggregate an ensemble of Q heads into one value per sample.

    Args:
        q_values: ``[B, H]`` Q-values of ``H`` heads.
        agg: ``"min"`` (clipped double-Q, RLinf default ``algorithm.agg_q``) or ``"mean"``.

    Returns:
        ``[B, 1]`` minimum or mean over the heads (keeps gradients of the selected entries).
    """
    _check_choice("agg", agg, _Q_AGGS)
    xp = namespace(q_values)
    check_ndim("q_values", q_values, 2, "[B, H]")
    if agg == "min":
        return xp.min(q_values, axis=1, keepdims=True)
    return xp.mean(q_values, axis=1, keepdims=True)


def subsample_q_heads(q_values: Array, head_index: Array) -> Array:
    """Select a subset of Q heads (REDQ / RLPD target subsampling, RLinf ``critic_subsample_size``).

    RLinf draws ``critic_subsample_size`` head indices *with replacement* (``torch.randint`` with its own
    seeded generator); here the caller draws them and passes them in, so this function stays deterministic.

    Args:
        q_values: ``[B, H]`` Q-values.
        head_index: ``[K]`` integer head indices in ``[0, H)``; repeats are allowed.

    Returns:
        ``[B, K]`` the selected columns.
    """
    xp = namespace(q_values, head_index)
    check_ndim("q_values", q_values, 2, "[B, H]")
    check_ndim("head_index", head_index, 1, "[K]")
    if not xp.isdtype(head_index.dtype, "integral"):
        raise ValueError(f"head_index must be an integer array, got dtype {head_index.dtype}")
    num_heads = int(q_values.shape[1])
    if int(head_index.shape[0]) == 0:
        raise ValueError("head_index must select at least one head, got shape (0,)")
    if bool(xp.any(head_index < 0)) or bool(xp.any(head_index >= num_heads)):
        raise ValueError(f"head_index entries must lie in [0, {num_heads}), got {head_index}")
    return xp.take(q_values, head_index, axis=1)


# --------------------------------------------------------------------------------------------------------
# SAC / CrossQ critic
# --------------------------------------------------------------------------------------------------------


def _soft_bellman_target(
    rewards: Array,
    next_q_values: Array,
    next_log_probs: Array | None,
    terminations: Array | None,
    *,
    gamma: float,
    alpha: float | Array,
    agg_q: QAgg,
    backup_entropy: bool,
    bootstrap_type: BootstrapType,
) -> Array:
    _check_choice("agg_q", agg_q, _Q_AGGS)
    _check_choice("bootstrap_type", bootstrap_type, _BOOTSTRAP_TYPES)
    xp = namespace(rewards, next_q_values, next_log_probs, terminations)
    check_ndim("next_q_values", next_q_values, 2, "[B, H]")
    batch = int(next_q_values.shape[0])
    r = as_float(xp, _as_column("rewards", _stop_gradient(rewards), "[B] or [B, C]"), like=next_q_values)
    _check_batch("rewards", rewards, batch, "[B] or [B, C]")
    q_next = aggregate_q(_stop_gradient(next_q_values), agg=agg_q)
    if backup_entropy:
        if next_log_probs is None:
            raise ValueError("next_log_probs is required when backup_entropy=True")
        _check_batch("next_log_probs", next_log_probs, batch, "[B] or [B, K]")
        logp = _as_column("next_log_probs", _stop_gradient(next_log_probs), "[B] or [B, K]")
        q_next = q_next - _alpha_value(alpha) * logp
    if bootstrap_type == "always":
        return r + gamma * q_next
    if terminations is None:
        raise ValueError('terminations is required when bootstrap_type="standard"')
    check_ndim("terminations", terminations, (1, 2), "[B] or [B, C]")
    _check_batch("terminations", terminations, batch, "[B] or [B, C]")
    term = to_bool(xp, _stop_gradient(terminations))
    done = term[:, None] if term.ndim == 1 else xp.any(term, axis=-1, keepdims=True)
    not_done = as_float(xp, ~done, like=q_next)
    return r + not_done * gamma * q_next


def sac_critic_target(
    rewards: Array,
    next_q_values: Array,
    next_log_probs: Array | None,
    terminations: Array | None,
    *,
    gamma: float,
    alpha: float | Array = 0.0,
    agg_q: QAgg = "min",
    backup_entropy: bool = True,
    bootstrap_type: BootstrapType = "standard",
    head_index: Array | None = None,
) -> Array:
    """Soft Bellman target of SAC / RLPD (RLinf ``EmbodiedSACFSDPPolicy.forward_critic``).

    ``y = Σ_c r_c + γ · (1 - any_c done_c) · (agg_h Q'_h(s', a') - α · log π(a'|s'))`` with
    ``a' ~ π(·|s')``. Rewards of a chunk are summed *undiscounted* and bootstrapped with a single ``γ``
    (RLinf); for the DSRL/openpi variant pass ``rewards[:, :1]`` and ``gamma=γ**C``.

    Args:
        rewards: ``[B, C]`` per-step rewards of the chunked transition (or ``[B]``).
        next_q_values: ``[B, H]`` target-network Q-values of ``(s', a')``.
        next_log_probs: ``[B]`` or ``[B, K]`` log-probs of ``a'`` (summed over ``K``); may be ``None`` when
            ``backup_entropy=False``.
        terminations: ``[B, C]`` (or ``[B]``) true-termination flags; any flag in the chunk stops the
            bootstrap. Ignored (may be ``None``) when ``bootstrap_type="always"``.
        gamma: discount for the bootstrap term.
        alpha: entropy temperature (float or 0-d/1-element array; always used as a constant).
        agg_q: ``"min"`` or ``"mean"`` over the (selected) heads (RLinf ``algorithm.agg_q``).
        backup_entropy: subtract ``α·log π(a'|s')`` from the next value (RLinf default True).
        bootstrap_type: ``"standard"`` masks terminated transitions, ``"always"`` always bootstraps.
        head_index: optional ``[K]`` head indices (see `subsample_q_heads`), applied before ``agg_q``.

    Returns:
        ``[B, 1]`` target, detached from every input.
    """
    if head_index is not None:
        next_q_values = subsample_q_heads(_stop_gradient(next_q_values), head_index)
    return _soft_bellman_target(
        rewards,
        next_q_values,
        next_log_probs,
        terminations,
        gamma=gamma,
        alpha=alpha,
        agg_q=agg_q,
        backup_entropy=backup_entropy,
        bootstrap_type=bootstrap_type,
    )


def split_crossq_q(joint_q_values: Array) -> tuple[Array, Array]:
    """Split CrossQ's joint critic output into ``(Q(s, a), Q(s', a'))``.

    CrossQ evaluates the online critic once on ``concat([(s, a), (s', a')], batch)`` so that its batch
    renormalisation sees both distributions (RLinf ``ForwardType.CROSSQ_Q``).

    Args:
        joint_q_values: ``[2B, H]`` Q-values of the concatenated batch.

    Returns:
        ``(q_values [B, H], next_q_values [B, H])``; ``next_q_values`` is detached.
    """
    check_ndim("joint_q_values", joint_q_values, 2, "[2B, H]")
    n = int(joint_q_values.shape[0])
    if n % 2:
        raise ValueError(
            f"joint_q_values must have an even batch [2B, H], got shape {_shape(joint_q_values)}"
        )
    half = n // 2
    return joint_q_values[:half, ...], _stop_gradient(joint_q_values[half:, ...])


def crossq_critic_target(
    rewards: Array,
    next_q_values: Array,
    next_log_probs: Array | None,
    terminations: Array | None,
    *,
    gamma: float,
    alpha: float | Array = 0.0,
    agg_q: QAgg = "min",
    backup_entropy: bool = True,
    bootstrap_type: BootstrapType = "standard",
) -> Array:
    """CrossQ Bellman target (RLinf ``algorithm.q_head_type: crossq``).

    Identical to `sac_critic_target` except that ``next_q_values`` come from the *online* critic's joint
    forward pass (see `split_crossq_q`), no target network is used and no heads are subsampled. The
    online next Q-values are detached.

    Args:
        rewards: ``[B, C]`` (or ``[B]``) chunk rewards, summed undiscounted.
        next_q_values: ``[B, H]`` online Q-values of ``(s', a')``.
        next_log_probs: ``[B]`` / ``[B, K]`` log-probs of ``a'`` (or ``None`` without entropy backup).
        terminations: ``[B, C]`` / ``[B]`` termination flags (``None`` allowed with ``"always"``).
        gamma: discount.
        alpha: entropy temperature (constant).
        agg_q: ``"min"`` or ``"mean"``.
        backup_entropy: subtract ``α·log π(a'|s')``.
        bootstrap_type: ``"standard"`` or ``"always"`` (the CrossQ ManiSkill example uses ``"always"``).

    Returns:
        ``[B, 1]`` detached target.
    """
    return _soft_bellman_target(
        rewards,
        next_q_values,
        next_log_probs,
        terminations,
        gamma=gamma,
        alpha=alpha,
        agg_q=agg_q,
        backup_entropy=backup_entropy,
        bootstrap_type=bootstrap_type,
    )


def sac_critic_loss(q_values: Array, target: Array) -> Array:
    """Mean squared TD error over all heads and samples (RLinf ``F.mse_loss(Q_all, y.expand_as(Q_all))``).

    Args:
        q_values: ``[B, H]`` online Q-values of the replayed ``(s, a)``.
        target: ``[B, 1]`` or ``[B]`` Bellman target (detached here).

    Returns:
        0-d loss ``mean_{b,h} (Q_h(s_b, a_b) - y_b)²``.
    """
    xp = namespace(q_values, target)
    check_ndim("q_values", q_values, 2, "[B, H]")
    check_ndim("target", target, (1, 2), "[B, 1] or [B]")
    batch = int(q_values.shape[0])
    if int(target.shape[0]) != batch or (target.ndim == 2 and int(target.shape[1]) != 1):
        raise ValueError(
            f"target must have layout [B, 1] or [B] with B={batch}, got shape {_shape(target)} "
            f"(q_values shape {_shape(q_values)})"
        )
    y = xp.reshape(_stop_gradient(target), (-1, 1))
    y = as_float(xp, y, like=q_values)
    return xp.mean((q_values - y) ** 2)


# --------------------------------------------------------------------------------------------------------
# SAC actor and temperature
# --------------------------------------------------------------------------------------------------------


def sac_actor_loss(
    log_probs: Array,
    q_values: Array,
    *,
    alpha: float | Array,
    agg_q: QAgg = "min",
) -> tuple[Array, Array]:
    """SAC policy loss ``mean(α · log π(a|s) - agg_h Q_h(s, a))`` with ``a ~ π(·|s)`` reparameterised.

    RLinf ``forward_actor``: the log-prob is summed over the chunk, the Q heads are aggregated with
    ``actor_agg_q`` (falling back to ``agg_q``), and α is a constant (``alpha.item()``).

    Args:
        log_probs: ``[B]`` or ``[B, K]`` log-probs of the sampled actions (summed over ``K``).
        q_values: ``[B, H]`` online Q-values of ``(s, π(s))``; gradients flow through them to the actions.
        alpha: entropy temperature (detached).
        agg_q: ``"min"`` or ``"mean"`` over heads.

    Returns:
        ``(loss, entropy)``: 0-d loss and the detached entropy estimate ``-mean(log π)``.
    """
    xp = namespace(log_probs, q_values)
    check_ndim("q_values", q_values, 2, "[B, H]")
    _check_batch("log_probs", log_probs, int(q_values.shape[0]), "[B] or [B, K]")
    logp = _as_column("log_probs", log_probs, "[B] or [B, K]")
    q_pi = aggregate_q(q_values, agg=agg_q)
    loss = xp.mean(_alpha_value(alpha) * logp - q_pi)
    entropy = -xp.mean(_stop_gradient(logp))
    return loss, entropy


def sac_alpha_param_init(initial_alpha: float, *, alpha_type: AlphaType = "softplus") -> float:
    """Initial value of the unconstrained temperature parameter for ``initial_alpha``.

    ``softplus``: ``log(exp(α₀) - 1)``; ``exp``: ``log(α₀)``; ``fixed_alpha``: ``α₀`` itself (RLinf
    ``EntropyTemperature``; default ``initial_alpha`` 0.01).

    Args:
        initial_alpha: the desired starting temperature, > 0.
        alpha_type: parametrisation, one of ``"softplus"``, ``"exp"``, ``"fixed_alpha"``.

    Returns:
        The parameter value ``b`` with ``sac_alpha(b) == initial_alpha``.
    """
    _check_choice("alpha_type", alpha_type, _ALPHA_TYPES)
    if not initial_alpha > 0.0 or not math.isfinite(initial_alpha):
        raise ValueError(f"initial_alpha must be a finite positive number, got {initial_alpha!r}")
    if alpha_type == "softplus":
        return math.log(math.expm1(initial_alpha))
    if alpha_type == "exp":
        return math.log(initial_alpha)
    return float(initial_alpha)


def sac_alpha(param: Array, *, alpha_type: AlphaType = "softplus") -> Array:
    """Temperature ``α`` from its parameter (keeps autograd so the temperature loss can train it).

    Args:
        param: the learnable parameter (any shape, usually ``[1]``).
        alpha_type: ``"softplus"`` (``α = softplus(b)``, torch's threshold 20), ``"exp"`` (``α = exp(b)``)
            or ``"fixed_alpha"`` (``α = b``, not trained).

    Returns:
        ``α``, same shape as ``param``.
    """
    _check_choice("alpha_type", alpha_type, _ALPHA_TYPES)
    xp = namespace(param)
    if alpha_type == "exp":
        return xp.exp(param)
    if alpha_type == "fixed_alpha":
        return param
    # torch.nn.functional.softplus(beta=1, threshold=20): linear above the threshold. The inner ``where``
    # keeps the unused branch finite so its gradient (multiplied by zero) cannot become NaN.
    above = param > 20.0
    safe = xp.where(above, xp.zeros_like(param), param)
    return xp.where(above, param, xp.log1p(xp.exp(safe)))


def sac_temperature_loss(alpha: Array, log_probs: Array, *, target_entropy: float) -> Array:
    """Automatic entropy tuning loss ``-α · (mean(log π) + H_target)`` (RLinf ``forward_alpha``).

    Args:
        alpha: ``α`` from `sac_alpha` (gradients flow into it), usually shape ``[1]`` or ``[]``.
        log_probs: ``[B]`` or ``[B, K]`` log-probs of fresh policy samples (summed over ``K``, detached).
        target_entropy: RLinf default ``-action_dim``.

    Returns:
        The loss, same shape as ``alpha``.
    """
    xp = namespace(alpha, log_probs)
    logp = _as_column("log_probs", _stop_gradient(log_probs), "[B] or [B, K]")
    return -alpha * (xp.mean(logp) + target_entropy)


# --------------------------------------------------------------------------------------------------------
# IQL
# --------------------------------------------------------------------------------------------------------


def expectile_loss(diff: Array, *, expectile: float) -> Array:
    """Element-wise asymmetric squared loss ``|τ - 1(d < 0)| · d²`` (IQL, Kostrikov et al. 2021).

    Args:
        diff: any shape ``[...]``, ``d = target - prediction``.
        expectile: ``τ`` in ``(0, 1)``; 0.5 is half the squared error, 0.7 (RLinf D4RL) favours upper values.

    Returns:
        Same shape as ``diff``.
    """
    if not 0.0 < expectile < 1.0:
        raise ValueError(f"expectile must lie in (0, 1), got {expectile!r}")
    xp = namespace(diff)
    neg = as_float(xp, diff < 0, like=diff)
    return xp.abs(expectile - neg) * diff**2


def _iql_check_q(name: str, q: Array, batch: int | None = None) -> int:
    check_ndim(name, q, 2, "[B, H]")
    if batch is not None:
        _check_batch(name, q, batch, "[B, H]")
    return int(q.shape[0])


def _iql_check_vec(name: str, x: Array, batch: int) -> None:
    check_ndim(name, x, 1, "[B]")
    _check_batch(name, x, batch, "[B]")


def iql_value_loss(target_q_values: Array, values: Array, *, expectile: float) -> Array:
    """IQL value loss ``mean(|τ - 1(d<0)| d²)``, ``d = min_h Q_target,h(s, a) - V(s)``.

    Args:
        target_q_values: ``[B, H]`` target-critic Q-values of the dataset actions (detached here).
        values: ``[B]`` ``V(s)`` (gradients flow into it).
        expectile: ``τ`` (RLinf ``algorithm.expectile``, D4RL 0.7).

    Returns:
        0-d loss.
    """
    xp = namespace(target_q_values, values)
    batch = _iql_check_q("target_q_values", target_q_values)
    _iql_check_vec("values", values, batch)
    q = xp.min(_stop_gradient(target_q_values), axis=1)
    return xp.mean(expectile_loss(q - values, expectile=expectile))


def iql_actor_loss(
    log_probs: Array,
    target_q_values: Array,
    values: Array,
    *,
    temperature: float,
    max_weight: float = 100.0,
) -> tuple[Array, Array]:
    """Advantage-weighted regression loss ``-mean(min(exp(β·A), w_max) · log π(a|s))``.

    ``A = min_h Q_target,h(s, a) - V(s)`` is computed without gradients (RLinf uses ``V`` after its update).

    Args:
        log_probs: ``[B]`` log-probs of the dataset actions under the current policy.
        target_q_values: ``[B, H]`` target-critic Q-values (detached).
        values: ``[B]`` ``V(s)`` (detached).
        temperature: ``β`` (RLinf ``algorithm.temperature``, D4RL 3.0).
        max_weight: clamp of the exponentiated advantage (RLinf 100).

    Returns:
        ``(loss, advantages)``: 0-d loss and the detached ``[B]`` advantages (for ``adv_mean``/``adv_std``).
    """
    xp = namespace(log_probs, target_q_values, values)
    batch = _iql_check_q("target_q_values", target_q_values)
    _iql_check_vec("values", values, batch)
    _iql_check_vec("log_probs", log_probs, batch)
    adv = xp.min(_stop_gradient(target_q_values), axis=1) - _stop_gradient(values)
    weights = xp.clip(xp.exp(adv * temperature), max=max_weight)
    return -xp.mean(weights * log_probs), adv


def iql_critic_target(rewards: Array, next_values: Array, masks: Array, *, gamma: float) -> Array:
    """IQL critic target ``y = r + γ · mask · V(s')`` (``mask`` = 1 - terminal, D4RL convention).

    Args:
        rewards: ``[B]`` rewards.
        next_values: ``[B]`` ``V(s')``.
        masks: ``[B]`` bootstrap masks (1.0 to bootstrap, 0.0 at true terminals).
        gamma: discount.

    Returns:
        ``[B]`` detached target.
    """
    xp = namespace(rewards, next_values, masks)
    check_ndim("rewards", rewards, 1, "[B]")
    batch = int(rewards.shape[0])
    _iql_check_vec("next_values", next_values, batch)
    _iql_check_vec("masks", masks, batch)
    v = _stop_gradient(next_values)
    m = as_float(xp, _stop_gradient(masks), like=v)
    return as_float(xp, _stop_gradient(rewards), like=v) + gamma * m * v


def iql_critic_loss(q_values: Array, target: Array) -> Array:
    """IQL critic loss ``mean_b Σ_h (Q_h(s, a) - y)²`` (RLinf ``((q1-y)² + (q2-y)²).mean()``).

    Note the sum over heads: with two heads this is twice `sac_critic_loss`'s mean over heads.

    Args:
        q_values: ``[B, H]`` online Q-values of the dataset actions.
        target: ``[B]`` target from `iql_critic_target` (detached here).

    Returns:
        0-d loss.
    """
    xp = namespace(q_values, target)
    batch = _iql_check_q("q_values", q_values)
    _iql_check_vec("target", target, batch)
    y = as_float(xp, xp.reshape(_stop_gradient(target), (-1, 1)), like=q_values)
    return xp.mean(xp.sum((q_values - y) ** 2, axis=1))


# --------------------------------------------------------------------------------------------------------
# TD3 target policy smoothing
# --------------------------------------------------------------------------------------------------------


def td3_target_actions(
    next_actions: Array,
    noise: Array,
    *,
    noise_std: float = 0.2,
    noise_clip: float = 0.5,
    action_low: float | Array = -1.0,
    action_high: float | Array = 1.0,
) -> Array:
    """TD3 target policy smoothing ``clip(π'(s') + clip(σ·ε, -c, c), low, high)`` (Fujimoto et al. 2018).

    Args:
        next_actions: ``[B, ...]`` target-policy actions ``π'(s')``.
        noise: standard-normal samples ``ε``, same shape (drawn by the caller's generator).
        noise_std: ``σ``.
        noise_clip: ``c`` ≥ 0.
        action_low: lower action bound (float or array broadcastable to ``next_actions``).
        action_high: upper action bound.

    Returns:
        Smoothed target actions, same shape, detached.
    """
    if noise_clip < 0.0 or noise_std < 0.0:
        raise ValueError(f"noise_std and noise_clip must be >= 0, got {noise_std!r} and {noise_clip!r}")
    xp = namespace(next_actions, noise)
    if _shape(next_actions) != _shape(noise):
        raise ValueError(
            f"noise must have the shape of next_actions {list(_shape(next_actions))}, got {list(_shape(noise))}"
        )
    eps = xp.clip(noise_std * _stop_gradient(noise), min=-noise_clip, max=noise_clip)
    smoothed = _stop_gradient(next_actions) + as_float(xp, eps, like=next_actions)
    low = _stop_gradient(action_low)
    high = _stop_gradient(action_high)
    return xp.minimum(xp.maximum(smoothed, low + xp.zeros_like(smoothed)), high + xp.zeros_like(smoothed))


def td3_critic_target(
    rewards: Array,
    next_q_values: Array,
    terminations: Array | None,
    *,
    gamma: float,
    agg_q: QAgg = "min",
    bootstrap_type: BootstrapType = "standard",
) -> Array:
    """Clipped double-Q target ``y = Σ_c r_c + γ · (1 - done) · min_h Q'_h(s', ã')`` (no entropy term).

    ``ã'`` are the smoothed target actions from `td3_target_actions`. This is `sac_critic_target` with
    ``backup_entropy=False``.

    Args:
        rewards: ``[B, C]`` or ``[B]`` rewards (summed over ``C``).
        next_q_values: ``[B, H]`` target-critic Q-values of ``(s', ã')``.
        terminations: ``[B, C]`` or ``[B]`` termination flags (``None`` with ``"always"``).
        gamma: discount.
        agg_q: ``"min"`` (TD3) or ``"mean"``.
        bootstrap_type: ``"standard"`` or ``"always"``.

    Returns:
        ``[B, 1]`` detached target.
    """
    return _soft_bellman_target(
        rewards,
        next_q_values,
        None,
        terminations,
        gamma=gamma,
        alpha=0.0,
        agg_q=agg_q,
        backup_entropy=False,
        bootstrap_type=bootstrap_type,
    )
