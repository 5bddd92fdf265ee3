"""Turning raw observations into GR00T N1.5 inputs, as Isaac-GR00T's transforms and Eagle's processor do.

- **Images** are resized to Eagle's ``image_size`` (bilinear; one tile, no thumbnail) and mapped from
  ``[0, 1]`` to ``[-1, 1]`` (SigLIP's mean and std of 0.5).
- **State and actions** are normalised with the checkpoint's ``experiment_cfg/metadata.json`` statistics of
  the chosen embodiment, per dimension: ``min_max`` (GR00T's LIBERO setting) maps ``[min, max]`` to ``[-1, 1]``
  and a constant dimension to 0; they are then zero-padded to ``max_state_dim`` / ``action_dim``.
- **Prompts**: per camera ``<image i><img>`` then ``image_tokens`` placeholder ids then ``</img>``, then the
  instruction written as Python writes a one-element list (``['put the bowl on the plate']``), as the GR00T
  policy formats it; with a tokenizer that has a chat template, that text is the user turn of the template
  (generation prompt added). The placeholder ids are spliced in directly, so any tokenizer works.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor

try:
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.gr00t needs transformers ({e}): pip install "rlinf-models[openpi]"'
    ) from e

__all__ = [
    "GR00TStats",
    "load_metadata",
    "normalize",
    "preprocess_image",
    "tokenize_prompts",
    "unnormalize",
]

NormMode = Literal["min_max", "mean_std"]


@attrs.frozen
class GR00TStats:
    """One quantity's (state or action) per-dimension statistics, concatenated over its metadata keys."""

    keys: tuple[str, ...]
    """The metadata's keys (``x``, ``y``, ..., ``gripper``), in the order their dimensions are concatenated."""
    minimum: Tensor
    maximum: Tensor
    mean: Tensor
    std: Tensor
    mode: NormMode = "min_max"

    @property
    def dim(self) -> int:
        return int(self.minimum.shape[0])


def _stats(entries: Mapping[str, Mapping[str, Any]], mode: NormMode) -> GR00TStats:
    def cat(field: str) -> Tensor:
        return torch.cat([torch.tensor(e[field], dtype=torch.float32).reshape(-1) for e in entries.values()])

    return GR00TStats(
        keys=tuple(entries),
        minimum=cat("min"),
        maximum=cat("max"),
        mean=cat("mean"),
        std=cat("std"),
        mode=mode,
    )


def load_metadata(
    path: str | Path, embodiment_tag: str | None = None, *, mode: NormMode = "min_max"
) -> tuple[str, GR00TStats, GR00TStats]:
    """``(tag, state statistics, action statistics)`` of ``experiment_cfg/metadata.json``.

    Args:
        path: The file, or a checkpoint directory holding ``experiment_cfg/metadata.json``.
        embodiment_tag: The entry to read (``None``: the only one).
        mode: The normalisation of both quantities.

    Raises:
        ValueError: naming the tags the file has, when ``embodiment_tag`` is not one of them (or is ``None`` and
            there are several).
    """
    file = Path(path)
    if file.is_dir():
        file = file / "experiment_cfg" / "metadata.json"
    data = json.loads(file.read_text())
    tags = sorted(data)
    if embodiment_tag is None:
        if len(tags) != 1:
            raise ValueError(
                f"{file} has the embodiment tags {tags}: set actor.model.embodiment_tag to one of them"
            )
        embodiment_tag = tags[0]
    if embodiment_tag not in data:
        raise ValueError(f"actor.model.embodiment_tag {embodiment_tag!r} is not in {file}: one of {tags}")
    statistics = data[embodiment_tag]["statistics"]
    return embodiment_tag, _stats(statistics["state"], mode), _stats(statistics["action"], mode)


def _leading(stat: Tensor, x: Tensor) -> Tensor:
    return stat[: x.shape[-1]].to(x)


def normalize(x: Tensor, stats: GR00TStats) -> Tensor:
    """Raw ``[..., D]`` → GR00T's normalised space (``D`` may be shorter than the statistics: the leading ones)."""
    lo, hi = _leading(stats.minimum, x), _leading(stats.maximum, x)
    if stats.mode == "mean_std":
        return (x - _leading(stats.mean, x)) / _leading(stats.std, x).clamp_min(1e-8)
    span = hi - lo
    constant = span == 0
    out = 2 * (x - lo) / torch.where(constant, torch.ones_like(span), span) - 1
    return torch.where(constant, torch.zeros_like(out), out)


def unnormalize(x: Tensor, stats: GR00TStats) -> Tensor:
    """Inverse of :func:`normalize` (a constant dimension becomes its value)."""
    if stats.mode == "mean_std":
        return x * _leading(stats.std, x).clamp_min(1e-8) + _leading(stats.mean, x)
    lo, hi = _leading(stats.minimum, x), _leading(stats.maximum, x)
    return (x + 1) / 2 * (hi - lo) + lo


def preprocess_image(image: Tensor, size: int) -> Tensor:
    """One camera's batch → ``[B, 3, size, size]`` float32 in ``[-1, 1]``.

    Args:
        image: ``[B, H, W, 3]`` or ``[B, 3, H, W]``; uint8 in ``[0, 255]`` or float in ``[0, 1]``.
        size: Eagle's image side.
    """
    if image.ndim != 4 or 3 not in (image.shape[1], image.shape[-1]):
        raise ValueError(f"image must be [B, H, W, 3] or [B, 3, H, W], got {list(image.shape)}")
    if image.shape[1] != 3:
        image = image.permute(0, 3, 1, 2)
    x = image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
    if x.shape[-2:] != (size, size):
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False)
    return x * 2.0 - 1.0


def _segments(tokenizer: PreTrainedTokenizerBase, prompt: str, cameras: int) -> list[str]:
    """The prompt's text pieces around the ``cameras`` image slots (``cameras + 1`` pieces)."""
    slots = "".join(f"<image-{i + 1}>" for i in range(cameras))
    text = slots + str([prompt])
    if getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        text = str(rendered)
    pieces: list[str] = []
    rest = text
    for i in range(cameras):
        before, rest = rest.split(f"<image-{i + 1}>", 1)
        pieces.append(before + f"<image {i + 1}><img>")
        rest = "</img>" + rest
    pieces.append(rest)
    return pieces


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    cameras: int,
    image_tokens: int,
    image_token_id: int,
) -> tuple[Tensor, Tensor]:
    """Instructions → ``([N, L]`` int64 ids, ``[N, L]`` bool mask``)``, right-padded to the longest.

    Each prompt holds ``cameras`` runs of ``image_tokens`` ids ``image_token_id`` (see the module docstring).
    """
    rows: list[list[int]] = []
    for prompt in prompts:
        ids: list[int] = []
        pieces = _segments(tokenizer, prompt, cameras)
        for i, piece in enumerate(pieces):
            ids += list(tokenizer(piece, add_special_tokens=False)["input_ids"])
            if i < cameras:
                ids += [image_token_id] * image_tokens
        rows.append(ids)
    length = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tokens = torch.full((len(rows), length), int(pad), dtype=torch.long)
    mask = torch.zeros(len(rows), length, dtype=torch.bool)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = True
    return tokens, mask
