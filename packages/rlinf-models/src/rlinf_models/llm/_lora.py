"""LoRA adapters on the LLM policy (``actor.model.is_lora``), with peft's layers.

The adapters are injected into the Hugging Face model in place (``peft.inject_adapter_in_model``), so the model
keeps its class and module paths: a targeted ``nn.Linear`` at ``P`` becomes a peft ``lora.Linear`` whose
weights are ``P.base_layer.weight`` (frozen) and ``P.lora_A.default.weight`` ``[r, in]``,
``P.lora_B.default.weight`` ``[out, r]`` (trained; ``B`` starts at zero, so the model starts as the base).
Everything that leaves the actor as a plain model (weight sync to the rollout, ``save_hf``, ``rlinf-export``)
goes through :func:`merge_lora_state`: ``W = W_base + scaling · B A`` under the plain HF key ``P.weight``.
The adapters alone are written in PEFT's own format (:func:`write_peft_adapter`), which
``peft.PeftModel.from_pretrained`` and ``actor.model.lora_path`` read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from torch import nn

from .._lora_state import ADAPTER, has_lora_weights, merge_lora_state
from ._config import LLMModelConfig

__all__ = [
    "ADAPTER_DIR",
    "apply_lora",
    "has_lora_weights",
    "load_peft_adapter",
    "lora_weights",
    "merge_lora_state",
    "write_peft_adapter",
]

ADAPTER_DIR = "lora_adapter"
"""Subdirectory of an exported HF model holding the adapters alone (not at the top level: transformers would
take a directory with ``adapter_config.json`` for an adapter and load its base model instead)."""
_M = TypeVar("_M", bound=nn.Module)
_PEFT_PREFIX = "base_model.model."


def _peft() -> Any:
    try:
        import peft
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(f'actor.model.is_lora needs peft ({e}): pip install "rlinf-models[hf]"') from e
    return peft


def _lora_config(cfg: LLMModelConfig) -> Any:
    return _peft().LoraConfig(
        r=cfg.lora_rank,
        lora_alpha=cfg.lora_alpha if cfg.lora_alpha is not None else cfg.lora_rank,
        lora_dropout=cfg.lora_dropout,
        target_modules=list(cfg.lora_target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )


def apply_lora(model: _M, cfg: LLMModelConfig) -> _M:
    """Inject LoRA adapters into ``model`` (in place), freeze everything else, load ``cfg.lora_path`` if set.

    Raises:
        ValueError: naming ``actor.model.lora_target_modules`` when none of them is in the model.
    """
    try:
        model = cast(_M, _peft().inject_adapter_in_model(_lora_config(cfg), model, adapter_name=ADAPTER))
    except ValueError as e:
        raise ValueError(
            f"actor.model.lora_target_modules {list(cfg.lora_target_modules)} match no layer of the model "
            f"({e})"
        ) from None
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name)
    if cfg.lora_path is not None:
        load_peft_adapter(model, cfg.lora_path, rank=cfg.lora_rank)
    return model


def lora_weights(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters of a LoRA-wrapped state dict, under PEFT's file keys (``base_model.model.P.lora_A.weight``).

    ``state`` must have HF keys (no ``model.`` policy prefix).
    """
    tag = f".{ADAPTER}."
    return {
        _PEFT_PREFIX + key.replace(tag, "."): value.detach().cpu().contiguous()
        for key, value in state.items()
        if ".lora_A." in key or ".lora_B." in key
    }


def write_peft_adapter(
    directory: Path, state: Mapping[str, torch.Tensor], cfg: LLMModelConfig, base: str
) -> None:
    """Write the adapters of ``state`` (HF keys) as a PEFT adapter directory (config + safetensors)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    config = _lora_config(cfg)
    config.base_model_name_or_path = base
    config.save_pretrained(str(directory))
    save_file(lora_weights(state), str(directory / "adapter_model.safetensors"))


def load_peft_adapter(model: nn.Module, path: str | Path, *, rank: int) -> None:
    """Copy the adapters of a PEFT adapter directory into a model :func:`apply_lora` prepared.

    Raises:
        ValueError: naming ``actor.model.lora_path`` when the adapter's rank differs from ``lora_rank`` or its
            layers do not match the model's adapters (missing or unexpected names).
    """
    from safetensors.torch import load_file

    root = Path(path).expanduser()
    saved = json.loads((root / "adapter_config.json").read_text())
    if int(saved.get("r", rank)) != rank:
        raise ValueError(
            f"actor.model.lora_path {str(root)!r} holds rank-{saved.get('r')} adapters; actor.model.lora_rank "
            f"is {rank}"
        )
    weights = load_file(str(root / "adapter_model.safetensors"))
    ours = {k for k in model.state_dict() if ".lora_A." in k or ".lora_B." in k}
    mapped: dict[str, torch.Tensor] = {}
    for key, value in weights.items():
        name = key.removeprefix(_PEFT_PREFIX)
        for part in (".lora_A.", ".lora_B."):
            if part in name:
                name = name.replace(part, f"{part}{ADAPTER}.")
        mapped[name] = value
    missing, unexpected = sorted(ours - mapped.keys()), sorted(mapped.keys() - ours)
    if missing or unexpected:
        raise ValueError(
            f"actor.model.lora_path {str(root)!r} does not fit the model's adapters "
            f"(lora_target_modules): missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    model.load_state_dict(mapped, strict=False)
