"""The state-dict layout of peft LoRA layers, shared by the LLM (``llm._lora``) and VLA (``policies``) paths.

A targeted ``nn.Linear`` at ``P`` becomes a peft ``lora.Linear`` whose weights are ``P.base_layer.weight``
(frozen) and ``P.lora_A.default.weight`` ``[r, in]``, ``P.lora_B.default.weight`` ``[out, r]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["ADAPTER", "LORA_BASE", "has_lora_weights", "merge_lora_state"]

ADAPTER = "default"
"""peft's adapter name (the one adapter an actor trains)."""
LORA_BASE = ".base_layer."
"""What peft puts between a wrapped layer's path and its base weights' names."""


def has_lora_weights(state: Mapping[str, Any]) -> bool:
    """Whether a state dict holds LoRA-wrapped layers."""
    return any(LORA_BASE in key for key in state)


def merge_lora_state(state: Mapping[str, torch.Tensor], scaling: float) -> dict[str, torch.Tensor]:
    """The plain model's state from a LoRA-wrapped one: ``P.weight = P.base_layer.weight + scaling · B A``.

    Keys without adapters pass through; ``lora_A`` / ``lora_B`` (and dropout) entries are dropped. Works on
    any key prefix (an HF state dict, or the policy's with its ``model.`` prefix).

    Raises:
        KeyError: naming a wrapped layer whose ``lora_A`` / ``lora_B`` weight is missing.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if ".lora_A." in key or ".lora_B." in key:
            continue
        if LORA_BASE not in key:
            out[key] = value
            continue
        prefix, _, leaf = key.partition(LORA_BASE)
        if leaf == "weight":
            a_key, b_key = f"{prefix}.lora_A.{ADAPTER}.weight", f"{prefix}.lora_B.{ADAPTER}.weight"
            if a_key not in state or b_key not in state:
                raise KeyError(f"{key} has no adapter weights ({a_key}, {b_key})")
            delta = state[b_key].float() @ state[a_key].float() * scaling
            value = (value.float() + delta).to(value.dtype)
        out[f"{prefix}.{leaf}"] = value
    return out
