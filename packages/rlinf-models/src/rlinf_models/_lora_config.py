"""The LoRA adapter shape shared by the LLM (``LLMModelConfig``) and VLA (``PolicyConfig``) model configs."""

from __future__ import annotations

import attrs
from attrs import validators as v

__all__ = ["LoraShape"]


@attrs.frozen(kw_only=True)
class LoraShape:
    """Rank, scale and dropout of LoRA adapters (used when the subclass's ``is_lora`` is set)."""

    lora_rank: int = attrs.field(default=32, validator=v.ge(1))
    """Rank of the adapters (``A: [rank, in]``, ``B: [out, rank]``)."""
    lora_alpha: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))
    """LoRA scaling numerator: updates are scaled by ``lora_alpha / lora_rank`` (null: ``lora_rank``, scale 1)."""
    lora_dropout: float = attrs.field(default=0.0, validator=[v.ge(0.0), v.lt(1.0)])
    """Dropout on the adapters' input during training."""

    @property
    def lora_scaling(self) -> float:
        """``lora_alpha / lora_rank``."""
        return (self.lora_alpha if self.lora_alpha is not None else float(self.lora_rank)) / self.lora_rank
