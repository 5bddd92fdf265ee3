"""Turning raw observations into π0 inputs: images, normalised state/actions, instruction tokens.

- **Images** are resized without distortion to the checkpoint's square ``image_size`` (scale the long side, pad
  the short one with black, centred) and mapped to ``[-1, 1]`` for SigLIP, as openpi does.
- **State and actions** are normalised with the checkpoint's statistics, then zero-padded to ``max_state_dim`` /
  ``max_action_dim``. π0 uses mean/std, the quantile mode (``q01``/``q99`` → ``[-1, 1]``) is π0.5's.
  Statistics come from openpi's ``norm_stats.json`` (openpi's formulas: ``(x - mean) / (std + 1e-6)``, the
  quantile range + 1e-6) or LeRobot's normalizer file (LeRobot's: std + 1e-8, a zero quantile range
  replaced by 1e-8).
- **Instructions** are cleaned (underscores and newlines become spaces). π0 ends them with a newline (PaliGemma's
  prompt separator); π0.5 writes ``Task: <instruction>, State: <256-bin state>;`` + newline + ``Action: `` with the
  normalised state discretised into 256 bins over ``[-1, 1]``. The tokenizer adds its BOS; prompts are padded on
  the right / truncated to ``tokenizer_max_length``. The tokenizer is loaded from a local directory
  (PaliGemma's ``tokenizer.json`` & co.).
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
    from safetensors.torch import load_file
    from transformers import AutoTokenizer
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f'rlinf_models.pi0 needs transformers ({e}): pip install "rlinf-models[openpi]"') from e

__all__ = [
    "NormStats",
    "discretize_state",
    "format_prompts",
    "load_lerobot_norm_stats",
    "load_openpi_norm_stats",
    "load_tokenizer",
    "pad_last",
    "preprocess_image",
    "tokenize_prompts",
]

_EPS = 1e-6
_LEROBOT_EPS = 1e-8


def preprocess_image(image: Tensor, size: int) -> Tensor:
    """One camera's batch → ``[B, 3, size, size]`` float32 in ``[-1, 1]``.

    Args:
        image: ``[B, H, W, 3]`` or ``[B, 3, H, W]``; uint8 in ``[0, 255]`` or float in ``[0, 1]``.
        size: The checkpoint's square image side.
    """
    if image.ndim != 4 or 3 not in (image.shape[1], image.shape[-1]):
        raise ValueError(f"image must be [B, H, W, 3] or [B, 3, H, W], got {list(image.shape)}")
    if image.shape[1] != 3:
        image = image.permute(0, 3, 1, 2)
    x = image.float() / 255.0 if image.dtype == torch.uint8 else image.float()
    x = x * 2.0 - 1.0
    height, width = x.shape[-2:]
    if (height, width) == (size, size):
        return x
    ratio = max(height / size, width / size)
    new_h, new_w = int(height / ratio), int(width / ratio)
    x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False).clamp(-1.0, 1.0)
    top, left = (size - new_h) // 2, (size - new_w) // 2
    return F.pad(x, (left, size - new_w - left, top, size - new_h - top), value=-1.0)


def pad_last(x: Tensor, width: int) -> Tensor:
    """Zero-pad the last dimension to ``width`` (error if it is wider)."""
    if x.shape[-1] > width:
        raise ValueError(f"last dimension {x.shape[-1]} exceeds the model's {width}")
    return F.pad(x, (0, width - x.shape[-1]))


@attrs.frozen(kw_only=True)
class NormStats:
    """Per-dimension statistics of one quantity (state or actions), as the checkpoint was trained with."""

    mean: Tensor
    std: Tensor
    q01: Tensor | None = None
    q99: Tensor | None = None
    convention: Literal["openpi", "lerobot"] = "openpi"
    """Whose formulas: openpi adds 1e-6 to every denominator; LeRobot's normalizer adds 1e-8 to the std and
    replaces only a zero quantile range by 1e-8."""

    def _std(self, dim: int, like: Tensor) -> Tensor:
        eps = _EPS if self.convention == "openpi" else _LEROBOT_EPS
        return self.std[:dim].to(like) + eps

    def _range(self, dim: int, like: Tensor) -> tuple[Tensor, Tensor]:
        """The low quantile and the quantile range (with the convention's guard against zero)."""
        if self.q01 is None or self.q99 is None:
            raise ValueError("quantile normalisation needs q01 and q99 statistics; these stats have none")
        low, high = self.q01[:dim].to(like), self.q99[:dim].to(like)
        if self.convention == "openpi":
            return low, high - low + _EPS
        span = high - low
        return low, torch.where(span == 0, torch.full_like(span, _LEROBOT_EPS), span)

    def normalize(self, x: Tensor, mode: Literal["mean_std", "quantile"] = "mean_std") -> Tensor:
        """Raw ``[..., D]`` → the model's space (``D`` may be shorter than the statistics: the leading ones)."""
        dim = x.shape[-1]
        if mode == "mean_std":
            return (x - self.mean[:dim].to(x)) / self._std(dim, x)
        low, span = self._range(dim, x)
        return (x - low) / span * 2.0 - 1.0

    def unnormalize(self, x: Tensor, mode: Literal["mean_std", "quantile"] = "mean_std") -> Tensor:
        """Inverse of :meth:`normalize`."""
        dim = x.shape[-1]
        if mode == "mean_std":
            return x * self._std(dim, x) + self.mean[:dim].to(x)
        low, span = self._range(dim, x)
        return (x + 1.0) / 2.0 * span + low


def _stats_from(
    entry: Mapping[str, Any], where: str, convention: Literal["openpi", "lerobot"] = "openpi"
) -> NormStats:
    if "mean" not in entry or "std" not in entry:
        raise ValueError(f"{where} needs 'mean' and 'std', has {sorted(entry)}")

    def vec(key: str) -> Tensor | None:
        return None if entry.get(key) is None else torch.as_tensor(entry[key], dtype=torch.float32)

    mean, std = vec("mean"), vec("std")
    assert mean is not None and std is not None
    return NormStats(mean=mean, std=std, q01=vec("q01"), q99=vec("q99"), convention=convention)


def load_openpi_norm_stats(path: str | Path) -> dict[str, NormStats]:
    """Read openpi's ``norm_stats.json`` (``assets/<asset_id>/norm_stats.json``) → ``{"state": ..., "actions": ...}``."""
    data = json.loads(Path(path).read_text())
    stats = data.get("norm_stats", data)
    return {name: _stats_from(entry, f"{path}: {name!r}") for name, entry in stats.items()}


def load_lerobot_norm_stats(path: str | Path) -> dict[str, NormStats]:
    """Read LeRobot's normalizer file → ``{"observation.state": ..., "action": ...}``.

    The file is ``policy_preprocessor_step_<i>_normalizer_processor.safetensors`` next to the checkpoint, with
    keys ``<feature>.mean`` / ``<feature>.std`` / ....
    """
    tensors = load_file(str(path))
    grouped: dict[str, dict[str, Tensor]] = {}
    for key, value in tensors.items():
        feature, _, stat = key.rpartition(".")
        grouped.setdefault(feature, {})[stat] = value.float()
    return {
        feature: _stats_from(entry, f"{path}: {feature!r}", "lerobot")
        for feature, entry in grouped.items()
        if "mean" in entry and "std" in entry
    }


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerBase:
    """PaliGemma's tokenizer (or a compatible one) from a local directory; nothing is downloaded."""
    directory = Path(path)
    if not directory.is_dir():
        raise FileNotFoundError(f"tokenizer directory {directory} does not exist")
    return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)


def discretize_state(state: Tensor) -> Tensor:
    """Normalised ``[B, D]`` state → ``[B, D]`` int64 bins: 256 equal bins over ``[-1, 1]``.

    Bin ``i`` holds ``[-1 + i/128, -1 + (i+1)/128)``; values below -1 give -1 and values at or above 1 give 255
    (``numpy.digitize`` over the 256 left edges, minus one, as openpi and LeRobot compute it).
    """
    edges = torch.linspace(-1.0, 1.0, 257, dtype=torch.float64, device=state.device)[:-1]
    return torch.bucketize(state.double(), edges, right=True) - 1


def format_prompts(prompts: Sequence[str], discrete_state: Tensor | None = None) -> list[str]:
    """Clean the instructions and lay out the prompt: π0 (``discrete_state=None``) or π0.5 (with the bins)."""
    cleaned = [p.strip().replace("_", " ").replace("\n", " ") for p in prompts]
    if discrete_state is None:
        return [text + "\n" for text in cleaned]
    if discrete_state.shape[0] != len(cleaned):
        raise ValueError(f"{len(cleaned)} prompts but {discrete_state.shape[0]} states")
    return [
        f"Task: {text}, State: {' '.join(str(int(b)) for b in bins)};\nAction: "
        for text, bins in zip(cleaned, discrete_state.tolist(), strict=True)
    ]


def tokenize_prompts(
    tokenizer: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    max_length: int,
    *,
    state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Instructions → ``([B, max_length]`` int64 ids, ``[B, max_length]`` bool mask``)``, right-padded.

    Args:
        tokenizer: PaliGemma's tokenizer (:func:`load_tokenizer`).
        prompts: One instruction per sample.
        max_length: The checkpoint's ``tokenizer_max_length``.
        state: π0.5 only: the normalised (quantile), unpadded ``[B, D]`` state, written into the prompt.
    """
    texts = format_prompts(prompts, None if state is None else discretize_state(state))
    encoded = tokenizer(
        texts,
        padding="max_length",
        padding_side="right",
        truncation=True,
        max_length=max_length,
        add_special_tokens=True,
        return_tensors="pt",
    )
    return encoded["input_ids"].long(), encoded["attention_mask"].bool()
