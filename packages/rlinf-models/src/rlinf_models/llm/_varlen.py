"""Variable-length attention for packed rows without a flash-attention kernel (the CPU, or a GPU without it).

A packed micro-batch (``actor.use_remove_padding``) is one row holding every sequence's attended tokens, with
position ids that restart at 0 where a sequence starts. Under ``sdpa`` transformers keeps the sequences apart
with one dense block-diagonal mask over the whole row, so attention costs ``L²`` for ``L`` packed tokens
where the padded micro-batch paid ``B·T²``: on this project's default batch the packed step was slower than
the padded one. :data:`VARLEN_SDPA` runs ``torch``'s scaled-dot-product attention once per sequence instead
(causal within it), which is what the variable-length kernels of ``flash_attention_2`` do in one launch.

It is registered with transformers' attention and mask interfaces under its own name, so it is chosen per
model (:func:`use_varlen_sdpa`) and works for every decoder that hands ``position_ids`` to its attention
function (Llama, Qwen2/2.5/3, SmolLM, Mistral). The sequence boundaries come from those position ids in each
call, so activation checkpointing's recomputation in the backward pass sees the same ones. A call with a
padding mask (the padded path, generation) goes to transformers' own ``sdpa`` unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["VARLEN_SDPA", "sequence_bounds", "use_varlen_sdpa"]

VARLEN_SDPA = "rlinf_varlen_sdpa"
"""The attention implementation name :func:`use_varlen_sdpa` gives a model."""


def sequence_bounds(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` of the sequences packed in one row of position ids ``[L]``.

    A sequence starts at index 0 and wherever the position does not continue the previous one by 1 (a packed
    row's ids restart at 0 for each sequence).
    """
    if position_ids.ndim != 1:
        raise ValueError(f"position_ids of one row must be [L], got {tuple(position_ids.shape)}")
    n = int(position_ids.shape[0])
    if n == 0:
        return []
    breaks = (position_ids[1:] != position_ids[:-1] + 1).nonzero().squeeze(-1) + 1
    starts = [0, *breaks.tolist()]
    return list(zip(starts, [*starts[1:], n], strict=True))


def _varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention of each packed sequence on its own (transformers' attention-function contract).

    ``query [B, Hq, L, D]``, ``key``/``value [B, Hkv, L, D]`` → ``([B, L, Hq, D], None)``.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    position_ids = kwargs.get("position_ids")
    if attention_mask is not None or position_ids is None or key.shape[2] != query.shape[2]:
        # a padding mask (the padded path), no positions to split by, or a KV cache: plain sdpa
        out: tuple[torch.Tensor, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, **kwargs
        )
        return out
    positions = position_ids.expand(query.shape[0], -1)
    rows = []
    for b in range(query.shape[0]):
        bounds = sequence_bounds(positions[b])
        q, k, v = query[b : b + 1], key[b : b + 1], value[b : b + 1]
        if len(bounds) == 1:
            rows.append(sdpa_attention_forward(module, q, k, v, None, **kwargs)[0])
            continue
        parts = [
            sdpa_attention_forward(module, q[:, :, s:e], k[:, :, s:e], v[:, :, s:e], None, **kwargs)[0]
            for s, e in bounds
        ]
        rows.append(torch.cat(parts, dim=1))
    return torch.cat(rows, dim=0), None


def _varlen_mask(**kwargs: Any) -> torch.Tensor | None:
    """No mask for a row without padding (the attention splits it by position ids); ``sdpa``'s otherwise."""
    from transformers.masking_utils import sdpa_mask

    if kwargs.get("attention_mask") is None:
        return None
    mask: torch.Tensor | None = sdpa_mask(**kwargs)
    return mask


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(VARLEN_SDPA, _varlen_attention)
    AttentionMaskInterface.register(VARLEN_SDPA, _varlen_mask)


def use_varlen_sdpa(model: PreTrainedModel) -> bool:
    """Switch a model loaded with ``sdpa`` to :data:`VARLEN_SDPA`; returns whether it did.

    Models on ``flash_attention_2`` (already variable-length) or ``eager`` (chosen on purpose) are left alone.
    """
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    _register()
    model.set_attn_implementation(VARLEN_SDPA)
    return True
