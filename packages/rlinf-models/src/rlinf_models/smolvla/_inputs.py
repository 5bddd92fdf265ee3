"""Turning raw observations into SmolVLA inputs, as LeRobot's SmolVLA processor and ``prepare_images`` do.

- **Images** are resized without distortion to ``image_size`` (scale the long side) and padded on the **left and
  top** with black, then mapped from ``[0, 1]`` to ``[-1, 1]`` (π0 pads centred; SmolVLA does not).
- **State and actions** are normalised with LeRobot's mean/std statistics, ``(x - mean) / (std + 1e-8)``
  (LeRobot's ``NormalizerProcessorStep``), then zero-padded to ``max_state_dim`` / ``max_action_dim``.
- **Instructions** get a trailing newline (if they lack one) and go through the VLM's tokenizer with its own
  special tokens, padded on the right and truncated to ``tokenizer_max_length``.

The statistics file and the tokenizer directory are read with :func:`~rlinf_models.pi0.load_lerobot_norm_stats`
and :func:`~rlinf_models.pi0.load_tokenizer`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

try:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.smolvla needs transformers ({e}): pip install "rlinf-models[openpi]"'
    ) from e

from ..pi0._inputs import NormStats

__all__ = ["normalize", "preprocess_image", "tokenize_prompts", "unnormalize"]

_EPS = 1e-8


def preprocess_image(image: Tensor, size: int) -> Tensor:
    """One camera's batch → ``[B, 3, size, size]`` float32 in ``[-1, 1]``, padded on the left and top.

    Args:
        image: ``[B, H, W, 3]`` or ``[B, 3, H, W]``; uint8 in ``[0, 255]`` or float in ``[0, 1]``.
        size: The checkpoint's square ``resize_imgs_with_padding``.
    """
    if image.ndim != 4 or 3 not in (image.shape[1], image.shape[-1]):
        raise ValueError(f"image must be [B, H, W, 3] or [B, 3, H, W], got {list(image.shape)}")
    if image.shape[1] != 3:
        image = image.permute(0, 3, 1, 2)
    x = image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
    height, width = x.shape[-2:]
    if (height, width) != (size, size):
        ratio = max(height / size, width / size)
        new_h, new_w = int(height / ratio), int(width / ratio)
        x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False)
        x = F.pad(x, (max(0, size - new_w), 0, max(0, size - new_h), 0), value=0.0)
    return x * 2.0 - 1.0


def normalize(x: Tensor, stats: NormStats) -> Tensor:
    """Raw ``[..., D]`` → LeRobot's mean/std space (``D`` may be shorter than the statistics: the leading ones)."""
    dim = x.shape[-1]
    return (x - stats.mean[:dim].to(x)) / (stats.std[:dim].to(x) + _EPS)


def unnormalize(x: Tensor, stats: NormStats) -> Tensor:
    """Inverse of :func:`normalize`."""
    dim = x.shape[-1]
    return x * (stats.std[:dim].to(x) + _EPS) + stats.mean[:dim].to(x)


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str], max_length: int
) -> tuple[Tensor, Tensor]:
    """Instructions → ``([B, max_length]`` int64 ids, ``[B, max_length]`` bool mask``)``, right-padded.

    Each instruction ends with a newline (added when missing), as LeRobot's ``NewLineTaskProcessorStep`` does.
    """
    texts = [p if p.endswith("\n") else p + "\n" for p in prompts]
    encoded = tokenizer(
        texts,
        padding="max_length",
        padding_side="right",
        truncation=True,
        max_length=max_length,
        return_tensors="pt",
    )
    return encoded["input_ids"].long(), encoded["attention_mask"].bool()
