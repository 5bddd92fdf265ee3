r"""OpenVLA's inputs: the prompt, batched prompt tokens and the fused backbone's images.

The prompt is OpenVLA's ``"In: What action should the robot take to {instruction}?\nOut:"``; ``predict_action``
appends Llama's empty token (id 29871, what the tokenizer yields for the space after ``Out:``) when the prompt
does not end with it, as at training time. A batch is laid out as RLinf's ``PrismaticProcessor`` does: BOS in
column 0, left padding after it, so that every prompt ends in the last column and the image patches go after
BOS. Images follow ``PrismaticImageProcessor`` with ``image_resize_strategy: resize-naive`` (the published
models'): resized (bicubic, antialiased) to each tower's size, scaled to ``[0, 1]``, normalised with that
tower's mean and std, and stacked along the channels.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "IMAGENET_MEAN_STD",
    "LLAMA_EMPTY_TOKEN_ID",
    "SIGLIP_MEAN_STD",
    "format_prompt",
    "pad_prompts",
    "preprocess_images",
]

LLAMA_EMPTY_TOKEN_ID = 29871
"""Llama's ``"▁"`` token, which OpenVLA's prompts end with."""
IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
"""DINOv2's normalisation (``preprocessor_config.json`` ``means[0]`` / ``stds[0]`` of openvla-7b)."""
SIGLIP_MEAN_STD = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
"""SigLIP's normalisation (``means[1]`` / ``stds[1]``)."""


def format_prompt(instruction: str) -> str:
    """OpenVLA's prompt for one instruction (lower-cased, as RLinf's rollout does)."""
    return f"In: What action should the robot take to {instruction.lower()}?\nOut:"


def pad_prompts(
    prompts: Sequence[Sequence[int]], *, pad_token_id: int, empty_token_id: int | None = LLAMA_EMPTY_TOKEN_ID
) -> tuple[Tensor, Tensor]:
    """Token ids of tokenised prompts (each starting with BOS) → ``input_ids, attention_mask`` ``[B, L]``.

    ``empty_token_id`` is appended to a prompt that does not end with it (``None``: nothing is appended).
    """
    rows = []
    for ids in prompts:
        row = list(ids)
        if len(row) < 2:
            raise ValueError(f"a prompt needs BOS and at least one token, got {row}")
        if empty_token_id is not None and row[-1] != empty_token_id:
            row.append(empty_token_id)
        rows.append(row)
    length = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, 0], mask[i, 0] = row[0], 1
        input_ids[i, length - len(row) + 1 :] = torch.tensor(row[1:])
        mask[i, length - len(row) + 1 :] = 1
    return input_ids, mask


def preprocess_images(
    images: Tensor,
    image_sizes: Sequence[int],
    mean_std: Sequence[tuple[tuple[float, float, float], tuple[float, float, float]]] = (
        IMAGENET_MEAN_STD,
        SIGLIP_MEAN_STD,
    ),
) -> Tensor:
    """``[B, H, W, 3]`` uint8 (or ``[B, 3, H, W]``) → ``pixel_values`` ``[B, 3·towers, S, S]`` float32."""
    if images.shape[-1] == 3 and images.shape[1] != 3:
        images = images.permute(0, 3, 1, 2)
    x = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
    towers = []
    for size, (mean, std) in zip(image_sizes, mean_std, strict=False):
        resized = F.interpolate(x, size=(size, size), mode="bicubic", antialias=True, align_corners=False)
        m = torch.tensor(mean, device=x.device).view(1, 3, 1, 1)
        s = torch.tensor(std, device=x.device).view(1, 3, 1, 1)
        towers.append((resized - m) / s)
    return torch.cat(towers, dim=1)
