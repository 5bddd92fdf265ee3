"""OpenVLA's action tokens and un-normalisation (``prismatic/vla/action_tokenizer.py``, ``predict_action``).

Each normalised action dimension in ``[-1, 1]`` is cut by ``n_bins`` uniform edges (``linspace(-1, 1, n_bins)``);
``digitize`` gives a bin ``d`` in ``[1, n_bins]`` and the token is ``vocab_size - d``: the last ``n_bins`` ids of the
tokenizer's vocabulary (Llama: 31744..31999). Decoding maps a token back to the centre of bin
``clip(vocab_size - token - 1, 0, n_bins - 2)`` (there are ``n_bins - 1`` centres, so the top two tokens share one).
Un-normalisation is the quantile map ``0.5·(a + 1)·(q99 − q01) + q01`` on the dimensions where ``mask`` is set
(the gripper is left as it is).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

__all__ = ["ActionTokenizer", "normalize_actions", "unnormalize_actions"]


class ActionTokenizer:
    """Continuous actions ↔ token ids, as OpenVLA's ``ActionTokenizer`` (torch tensors instead of strings)."""

    def __init__(self, vocab_size: int, n_bins: int = 256) -> None:
        """``vocab_size``: the tokenizer's (the LM's rows minus ``pad_to_multiple_of``)."""
        if n_bins < 2 or n_bins >= vocab_size:
            raise ValueError(f"n_bins must be in [2, vocab_size={vocab_size}), got {n_bins}")
        self.vocab_size = vocab_size
        self.n_bins = n_bins
        # numpy's linspace, as OpenVLA's: torch's differs in the last bit of some edges, which moves a token.
        self.bins = torch.from_numpy(np.linspace(-1.0, 1.0, n_bins))
        self.bin_centers = (self.bins[:-1] + self.bins[1:]) / 2.0

    @property
    def first_token(self) -> int:
        """The lowest action token id (``vocab_size - n_bins``)."""
        return self.vocab_size - self.n_bins

    def encode(self, actions: Tensor) -> Tensor:
        """Normalised actions ``[..., D]`` (clipped to ``[-1, 1]``) → token ids ``[..., D]`` (int64)."""
        clipped = actions.to(torch.float64).clamp(-1.0, 1.0)
        # numpy's digitize(x, bins) (increasing bins, right=False) is the number of edges <= x.
        digit = torch.bucketize(clipped, self.bins.to(clipped.device), right=True)
        return self.vocab_size - digit

    def decode(self, tokens: Tensor) -> Tensor:
        """Token ids ``[..., D]`` → normalised actions ``[..., D]`` (bin centres, float64)."""
        index = (self.vocab_size - tokens - 1).clamp(0, self.n_bins - 2)
        return self.bin_centers.to(tokens.device)[index]


def unnormalize_actions(actions: Tensor, stats: Mapping[str, Any]) -> Tensor:
    """Normalised ``[..., D]`` → the robot's units with ``stats`` (``q01``, ``q99``, optional ``mask``)."""
    low = torch.as_tensor(stats["q01"], dtype=actions.dtype, device=actions.device)
    high = torch.as_tensor(stats["q99"], dtype=actions.dtype, device=actions.device)
    mask = torch.as_tensor(stats.get("mask", [True] * low.shape[0]), dtype=torch.bool, device=actions.device)
    if actions.shape[-1] != low.shape[0]:
        raise ValueError(f"actions have {actions.shape[-1]} dimensions, the statistics {low.shape[0]}")
    return torch.where(mask, 0.5 * (actions + 1.0) * (high - low) + low, actions)


def normalize_actions(actions: Tensor, stats: Mapping[str, Any]) -> Tensor:
    """The robot's units ``[..., D]`` → normalised: the inverse of :func:`unnormalize_actions`.

    Clipped to ``[-1, 1]`` as OpenVLA's data pipeline does; dimensions outside ``mask`` pass through.
    """
    low = torch.as_tensor(stats["q01"], dtype=actions.dtype, device=actions.device)
    high = torch.as_tensor(stats["q99"], dtype=actions.dtype, device=actions.device)
    mask = torch.as_tensor(stats.get("mask", [True] * low.shape[0]), dtype=torch.bool, device=actions.device)
    if actions.shape[-1] != low.shape[0]:
        raise ValueError(f"actions have {actions.shape[-1]} dimensions, the statistics {low.shape[0]}")
    span = torch.where(high > low, high - low, torch.ones_like(high))
    scaled = (2.0 * (actions - low) / span - 1.0).clamp(-1.0, 1.0)
    return torch.where(mask, scaled, actions)
