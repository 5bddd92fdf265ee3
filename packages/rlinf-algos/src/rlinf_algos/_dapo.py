"""DAPO's data-side pieces (https://arxiv.org/abs/2503.14476): dynamic sampling and overlong handling.

DAPO's other two pieces live elsewhere: clip-higher is ``clip_ratio_high > clip_ratio_low`` in
:func:`rlinf_algos.compute_ppo_actor_loss`, and token-level loss averaging is the ``"token-mean"`` aggregator.
"""

from __future__ import annotations

from ._array import Array, as_float, check_ndim, namespace, to_bool

__all__ = ["dynamic_sampling_filter", "overlong_filter", "overlong_reward_penalty"]


def dynamic_sampling_filter(rewards: Array, *, group_size: int) -> Array:
    """Keep mask of DAPO dynamic sampling: drop every group whose rewards are all equal.

    A group with identical rewards (all correct or all wrong) has zero GRPO advantage and contributes no
    gradient; DAPO over-samples and discards such groups.

    Args:
        rewards: ``[B]`` one scalar reward per response, ``B = n_groups * group_size`` with each group's
            responses contiguous (RLinf's layout).
        group_size: responses per prompt.

    Returns:
        ``[B]`` boolean: True for responses of groups whose rewards are not all equal.

    Raises:
        ValueError: if ``rewards`` is not 1-D or ``B`` is not a multiple of ``group_size``.
    """
    xp = namespace(rewards)
    check_ndim("rewards", rewards, 1, "[B]")
    n = int(rewards.shape[0])
    if group_size < 1 or n % group_size:
        raise ValueError(f"rewards has {n} entries, not a multiple of group_size={group_size}")
    groups = xp.reshape(rewards, (n // group_size, group_size))
    varied = xp.max(groups, axis=1) != xp.min(groups, axis=1)
    return xp.reshape(xp.broadcast_to(varied[:, None], groups.shape), (n,))


def overlong_filter(
    loss_mask: Array,
    *,
    truncated: Array | None = None,
    max_response_length: int | None = None,
) -> Array:
    """DAPO overlong filtering: remove truncated responses from the loss.

    Args:
        loss_mask: ``[B, L]`` boolean/0-1 response mask.
        truncated: ``[B]`` boolean, True for responses cut at the length limit (preferred when known).
        max_response_length: if ``truncated`` is None, a response is truncated when its valid-token count
            (``loss_mask.sum(-1)``) reaches this length.

    Returns:
        ``[B, L]`` boolean mask with truncated rows cleared.

    Raises:
        ValueError: if neither ``truncated`` nor ``max_response_length`` is given, or on bad shapes.
    """
    xp = namespace(loss_mask, truncated)
    check_ndim("loss_mask", loss_mask, 2, "[B, L]")
    mask = to_bool(xp, loss_mask)
    if truncated is None:
        if max_response_length is None:
            raise ValueError("overlong_filter needs truncated ([B] bool) or max_response_length")
        lengths = xp.sum(xp.astype(mask, xp.int64), axis=-1)
        truncated = lengths >= max_response_length
    else:
        check_ndim("truncated", truncated, 1, "[B]")
        if int(truncated.shape[0]) != int(mask.shape[0]):
            raise ValueError(
                f"truncated has shape {list(truncated.shape)} but loss_mask has shape {list(mask.shape)}"
            )
        truncated = to_bool(xp, truncated)
    return mask & ~truncated[:, None]


def overlong_reward_penalty(lengths: Array, *, max_length: int, cache_length: int) -> Array:
    """DAPO soft overlong punishment ``R_length`` added to the task reward.

    ``0`` if ``|y| <= L_max - L_cache``; ``((L_max - L_cache) - |y|) / L_cache`` inside the cache window;
    ``-1`` beyond ``L_max``.

    Args:
        lengths: ``[B]`` response lengths ``|y|``.
        max_length: ``L_max``.
        cache_length: ``L_cache`` (0 < L_cache <= L_max).

    Returns:
        ``[B]`` float penalties in ``[-1, 0]``.
    """
    xp = namespace(lengths)
    if not 0 < cache_length <= max_length:
        raise ValueError(
            f"need 0 < cache_length <= max_length, got cache_length={cache_length}, max_length={max_length}"
        )
    y = as_float(xp, lengths)
    expected = float(max_length - cache_length)
    inside = (expected - y) / float(cache_length)
    penalty = xp.where(y <= expected, 0.0, inside)
    return xp.where(y > max_length, -1.0, penalty)
