"""LoRA on OpenVLA's language model (peft), as RLinf fine-tunes OpenVLA: only the adapters train."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._model import OpenVLAModel

__all__ = ["apply_lora"]


def apply_lora(
    model: OpenVLAModel,
    *,
    rank: int,
    alpha: float | None = None,
    dropout: float = 0.0,
    target_modules: Sequence[str] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    ),
    train_value_head: bool = True,
) -> None:
    """Inject LoRA adapters into ``target_modules`` of the Llama layers, in place, and freeze everything else.

    The vision backbone, projector and LM weights are frozen; the value head (fresh, RL-only) trains when
    ``train_value_head``.

    Raises:
        ImportError: without peft (naming the extra).
        ValueError: when no target module is in the LM's layers.
    """
    try:
        import peft
    except ImportError as e:  # pragma: no cover - exercised only without the extra
        raise ImportError(f'LoRA needs peft ({e}): pip install "rlinf-models[openpi]"') from e
    names = "|".join(target_modules)
    lora_alpha: Any = alpha if alpha is not None else rank  # peft types it int
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=lora_alpha,
        lora_dropout=dropout,
        target_modules=rf"model\.layers\.\d+\..*\.({names})",
        bias="none",
    )
    try:
        peft.inject_adapter_in_model(config, model.language_model, adapter_name="default")
    except ValueError as e:
        raise ValueError(f"LoRA target_modules {list(target_modules)} match no Llama layer ({e})") from None
    for name, param in model.named_parameters():
        param.requires_grad_(".lora_" in name or (train_value_head and name.startswith("value_head.")))
