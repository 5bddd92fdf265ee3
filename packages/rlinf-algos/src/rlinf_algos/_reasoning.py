"""Reasoning (LLM response) layouts around the advantage functions (RLinf ``algorithms/utils.py``).

A reasoning batch holds one scalar reward per response, ``rewards [B]`` (``B = n_prompts * group_size``,
groups contiguous), and batch-major token tensors ``[B, L]`` (``L`` = response length). The advantage
functions work time-major (``[L, B]``); these helpers transpose in and out and shape the rewards the way
each estimator expects.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import array_api_compat

from ._advantages import check_group_size
from ._array import Array, check_ndim, check_same_shape, namespace

__all__ = [
    "REASONING_ADV_TYPES",
    "ReasoningAdvantageInputs",
    "postprocess_reasoning_advantages_outputs",
    "preprocess_reasoning_advantages_inputs",
]

REASONING_ADV_TYPES = ("gae", "grpo", "grpo_dynamic", "reinpp", "raw")
"""The estimators RLinf's reasoning pre-processing knows how to shape rewards for."""


def _shape(x: Array) -> list[int]:
    return [int(d) for d in x.shape]


def _transpose(xp: Any, x: Array) -> Array:
    return xp.permute_dims(x, (1, 0))


def _contiguous(x: Array) -> Array:
    # torch transposes are strided views; RLinf returns contiguous tensors (they are sent through channels).
    if array_api_compat.is_torch_array(x):
        return x.contiguous()
    return x


@dataclass(frozen=True)
class ReasoningAdvantageInputs:
    """Reasoning batch in the time-major layout the advantage functions take.

    Attributes:
        rewards: estimator-specific: ``[L, B]`` (gae: reward on the LAST position ``L-1``),
            ``[B / group_size, group_size]`` (grpo), ``[num_sequence, B / num_sequence]`` (grpo_dynamic),
            ``[1, B]`` (reinpp), ``[B]`` (raw).
        loss_mask: ``[L, B]``.
        dones: ``[L+1, B]`` bool, true only on the last row.
        values: ``[L+1, B]`` (a zero row appended) or ``None``.
        logprob: ``[L, B]`` or ``None``.
        ref_logprob: ``[L, B]`` or ``None``.
    """

    rewards: Array
    loss_mask: Array
    dones: Array
    values: Array | None
    logprob: Array | None
    ref_logprob: Array | None


def preprocess_reasoning_advantages_inputs(
    rewards: Array,
    loss_mask: Array,
    values: Array | None = None,
    logprob: Array | None = None,
    ref_logprob: Array | None = None,
    *,
    adv_type: str,
    group_size: int | None = None,
    num_sequence: int | None = None,
) -> ReasoningAdvantageInputs:
    """Transpose a reasoning batch to time-major and shape the rewards (RLinf ``preprocess_reasoning_advantages_inputs``).

    Args:
        rewards: ``[B]`` one scalar per response.
        loss_mask: ``[B, L]`` response mask.
        values: ``[B, L]`` critic values, or ``None``.
        logprob: ``[B, L]`` or ``None``.
        ref_logprob: ``[B, L]`` or ``None``.
        adv_type: one of ``REASONING_ADV_TYPES``.
        group_size: responses per prompt (``grpo``).
        num_sequence: turns per batch (``grpo_dynamic``).

    Returns:
        The time-major inputs.

    Raises:
        ValueError: on an unsupported ``adv_type`` (RLinf asserts) or a bad layout.
    """
    xp = namespace(rewards, loss_mask, values, logprob, ref_logprob)
    check_ndim("rewards", rewards, 1, "[B]")
    check_ndim("loss_mask", loss_mask, 2, "[B, L]")
    batch, length = _shape(loss_mask)
    if length < 1:
        raise ValueError(
            f"loss_mask must have at least one position (layout [B, L]), got shape {_shape(loss_mask)}"
        )
    if int(rewards.shape[0]) != batch:
        raise ValueError(
            f"rewards must have one entry per response: rewards shape {_shape(rewards)} vs loss_mask shape "
            f"{_shape(loss_mask)} ([B, L])"
        )
    check_same_shape(loss_mask=loss_mask, values=values, logprob=logprob, ref_logprob=ref_logprob)
    dev = array_api_compat.device(rewards)

    if adv_type == "gae":
        pad = xp.zeros((length - 1, batch), dtype=rewards.dtype, device=dev)
        shaped = xp.concat([pad, rewards[None, :]], axis=0)  # the reward sits on position L-1 (RLinf)
    elif adv_type == "grpo":
        group_size = check_group_size(group_size, batch, "rewards (grpo)")
        shaped = xp.reshape(rewards, (-1, group_size))
    elif adv_type == "grpo_dynamic":
        num_sequence = check_group_size(num_sequence, batch, "rewards (grpo_dynamic)", name="num_sequence")
        shaped = _transpose(xp, xp.reshape(rewards, (-1, num_sequence)))
    elif adv_type == "reinpp":
        shaped = rewards[None, :]
    elif adv_type == "raw":
        shaped = rewards
    else:
        raise ValueError(
            f"adv_type {adv_type!r} has no reasoning reward layout; supported: {', '.join(REASONING_ADV_TYPES)}"
        )

    values_tm = None
    if values is not None:
        zero_row = xp.zeros((1, batch), dtype=values.dtype, device=array_api_compat.device(values))
        values_tm = xp.concat([_transpose(xp, values), zero_row], axis=0)
    rows = xp.arange(length + 1, dtype=xp.int64, device=dev)[:, None] + xp.zeros(
        (1, batch), dtype=xp.int64, device=dev
    )
    return ReasoningAdvantageInputs(
        rewards=shaped,
        loss_mask=_transpose(xp, loss_mask),
        dones=rows == length,
        values=values_tm,
        logprob=None if logprob is None else _transpose(xp, logprob),
        ref_logprob=None if ref_logprob is None else _transpose(xp, ref_logprob),
    )


def postprocess_reasoning_advantages_outputs(
    advantages: Array, returns: Array | None = None
) -> tuple[Array, Array | None]:
    """Transpose ``[L, B]`` results back to ``[B, L]`` (contiguous) (RLinf ``postprocess_reasoning_advantages_outputs``).

    Args:
        advantages: ``[L, B]``.
        returns: ``[L, B]`` or ``None``.

    Returns:
        ``(advantages [B, L], returns [B, L] | None)``.
    """
    xp = namespace(advantages, returns)
    check_ndim("advantages", advantages, 2, "[L, B]")
    adv = _contiguous(_transpose(xp, advantages))
    if returns is None:
        return adv, None
    check_ndim("returns", returns, 2, "[L, B]")
    return adv, _contiguous(_transpose(xp, returns))
