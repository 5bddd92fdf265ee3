"""The LLM actor's batch contract, checked once for every backend: ``[N, T]`` arrays to CPU tensors."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from rlinf_algos import rollout_importance_weights
from rlinf_core.config import AlgorithmConfig

__all__ = ["as_tensor", "check_batch", "corrected_advantages"]


def corrected_advantages(
    algorithm: AlgorithmConfig, old_logprobs: torch.Tensor, mb: Mapping[str, torch.Tensor], mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, Any]]:
    """A micro-batch's advantages (with ``importance_sampling_fix``: times the truncated IS weights) and metrics.

    The weights are ``rlinf_algos.rollout_importance_weights(old_logprobs, rollout_logprobs)``.
    """
    if not algorithm.importance_sampling_fix:
        return mb["advantages"], {}
    weights, metrics = rollout_importance_weights(
        old_logprobs, mb["rollout_logprobs"], mask, clip=algorithm.importance_sampling_clip
    )
    return mb["advantages"] * weights, dict(metrics)


def as_tensor(name: str, value: Any) -> torch.Tensor:
    """``value`` as a tensor (numpy arrays and nested lists converted), else a ``TypeError`` naming ``batch[name]``."""
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as e:
        raise TypeError(f"batch[{name!r}] must be a tensor or an array, got {type(value).__name__}") from e


def check_batch(
    batch: Mapping[str, Any], required: tuple[str, ...], *, float_keys: tuple[str, ...]
) -> dict[str, torch.Tensor]:
    """Validate and convert the keys a backend reads (all ``[N, T]`` like ``input_ids``) to CPU tensors.

    Args:
        batch: the caller's batch (extra keys are ignored, ``None`` values count as absent).
        required: keys that must be present.
        float_keys: optional float keys read besides ``attention_mask`` and ``loss_mask`` (int64).

    Returns:
        ``input_ids`` (int64), ``attention_mask`` / ``loss_mask`` (int64) and the ``float_keys`` (float32)
        present in ``batch``; a vision-language batch's ``images [N, K, H, W, 3]`` (uint8) and
        ``image_sizes [N, K, 2]`` (int64) as they are.
    """
    if not isinstance(batch, Mapping):
        raise TypeError(f"batch must be a mapping of [N, T] arrays, got {type(batch).__name__}")
    missing = [k for k in required if k not in batch]
    if missing:
        raise ValueError(f"batch is missing {missing}; it has {sorted(batch)}")
    ids = as_tensor("input_ids", batch["input_ids"])
    if ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] < 2:
        raise ValueError(f"batch['input_ids'] must be [N, T] with N >= 1 and T >= 2, got {tuple(ids.shape)}")
    out = {"input_ids": ids.long().cpu()}
    for key in ("attention_mask", "loss_mask", *float_keys):
        if batch.get(key) is None:
            continue
        t = as_tensor(key, batch[key])
        if tuple(t.shape) != tuple(ids.shape):
            raise ValueError(
                f"batch[{key!r}] must be [N, T] = {list(ids.shape)} like input_ids, got {list(t.shape)}"
            )
        out[key] = t.float().cpu() if key in float_keys else t.long().cpu()
    if batch.get("images") is not None:
        images, sizes = (
            as_tensor("images", batch["images"]),
            as_tensor("image_sizes", batch.get("image_sizes")),
        )
        n = ids.shape[0]
        if images.ndim != 5 or images.shape[0] != n or images.shape[-1] != 3 or images.dtype != torch.uint8:
            raise ValueError(
                f"batch['images'] must be [N, K, H, W, 3] uint8 with N = {n}, got {images.dtype} {tuple(images.shape)}"
            )
        if tuple(sizes.shape) != (n, images.shape[1], 2):
            raise ValueError(
                f"batch['image_sizes'] must be [N, K, 2] = {[n, images.shape[1], 2]}, got {list(sizes.shape)}"
            )
        out["images"], out["image_sizes"] = images.cpu(), sizes.long().cpu()
    return out
