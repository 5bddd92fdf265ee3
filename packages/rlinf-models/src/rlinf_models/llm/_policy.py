"""``CausalLMPolicy``: token log-probs, entropy and values of a Hugging Face causal LM.

Alignment (the contract every LLM component shares): for a batch ``input_ids [B, T]``, index ``t`` of
``logprobs``/``entropy``/``values`` belongs to the token ``input_ids[:, t]``:

- ``logprobs[:, t] = log softmax(logits[:, t-1] / temperature)[input_ids[:, t]]``,
- ``entropy[:, t]`` is the entropy of that same distribution,
- ``values[:, t] = V(tokens < t)`` (the value head on the hidden state at ``t - 1``),

and column 0 (no context) is 0. Positions come from the attention mask (``cumsum - 1``), as in HF
``generate``, so LEFT-padded prompts give exactly the scores the model produced while sampling.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = [
    "LOGPROB_CHUNK_BYTES",
    "CausalLMPolicy",
    "auto_chunk_rows",
    "position_ids_from_mask",
    "token_logprobs_and_entropy",
]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` position ids counting only attended tokens (left padding gets 0), as HF ``generate`` does."""
    return (attention_mask.long().cumsum(-1) - 1).clamp_min(0)


def _chunk_scores(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    inv_temp: float,
    entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = nn.functional.linear(hidden, weight, bias).float()
    if inv_temp != 1.0:
        logits = logits * inv_temp
    logp = torch.log_softmax(logits, dim=-1)
    token_lp = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1) if entropy else torch.zeros_like(token_lp)
    return token_lp, ent


LOGPROB_CHUNK_BYTES = 512 * 2**20
"""Size of the float32 ``[chunk, vocab]`` logits one log-softmax chunk may hold when no chunk size is set."""


def auto_chunk_rows(vocab_size: int) -> int:
    """Rows per log-softmax chunk whose float32 logits fit :data:`LOGPROB_CHUNK_BYTES` (at least 1).

    About 880 rows for a 152k vocabulary (Qwen2.5); a small vocabulary scores a whole micro-batch at once, with
    no recomputation in the backward pass and no per-chunk kernel launches.
    """
    return max(1, LOGPROB_CHUNK_BYTES // (4 * vocab_size))


def token_logprobs_and_entropy(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    lm_head: nn.Linear,
    *,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    chunk_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-prob of each target token (and the distribution's entropy) from hidden states, chunk by chunk.

    The ``[chunk, vocab]`` float32 logits exist for one chunk at a time; with autograd on and more than one
    chunk, each chunk is recomputed in the backward pass (activation checkpointing) so the full ``[N, vocab]``
    logits are never held.

    Args:
        hidden: ``[N, H]`` hidden states (the positions *before* the targets).
        targets: ``[N]`` token ids.
        lm_head: the output projection (``[vocab, H]`` weight).
        temperature: logits are divided by it (> 0).
        compute_entropy: also return ``[N]`` entropies.
        chunk_size: rows per chunk (``None``: :func:`auto_chunk_rows` of the vocabulary size).

    Returns:
        ``(logprobs [N] float32, entropy [N] float32 or None)``.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 to score tokens, got {temperature}")
    inv_temp = 1.0 / float(temperature)
    weight, bias = lm_head.weight, getattr(lm_head, "bias", None)
    if chunk_size is None:
        chunk_size = auto_chunk_rows(int(weight.shape[0]))
    # One chunk holds at most [chunk, vocab] anyway; with several, recompute each in the backward pass.
    use_ckpt = (
        hidden.shape[0] > chunk_size
        and torch.is_grad_enabled()
        and (hidden.requires_grad or weight.requires_grad)
    )
    lps, ents = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        h = hidden[start : start + chunk_size]
        tgt = targets[start : start + chunk_size]
        if use_ckpt:
            lp, ent = checkpoint(
                _chunk_scores, h, tgt, weight, bias, inv_temp, compute_entropy, use_reentrant=False
            )
        else:
            lp, ent = _chunk_scores(h, tgt, weight, bias, inv_temp, compute_entropy)
        lps.append(lp)
        ents.append(ent)
    if not lps:  # no rows
        empty = hidden.new_zeros((0,), dtype=torch.float32)
        return empty, (empty if compute_entropy else None)
    return torch.cat(lps), (torch.cat(ents) if compute_entropy else None)


def _packed_hidden(
    decoder: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """``[B, T, H]`` hidden states from one decoder pass over the attended tokens of all rows, packed.

    Each row's live tokens keep their order and their position ids (``positions``, which start at 0 in every
    row), so the packed position ids drop at every row boundary; with no 2-D attention mask, transformers reads
    those drops as sequence boundaries. Padding positions get zero hidden states.
    """
    b, t = input_ids.shape
    live = attention_mask.reshape(-1).bool().nonzero().squeeze(-1)
    packed: torch.Tensor = decoder(
        input_ids=input_ids.reshape(-1)[live].unsqueeze(0),
        position_ids=positions.reshape(-1)[live].unsqueeze(0),
        attention_mask=None,
        use_cache=False,
    ).last_hidden_state[0]  # [L, H]
    full = packed.new_zeros((b * t, packed.shape[-1])).index_copy(0, live, packed)
    return full.view(b, t, -1)


class CausalLMPolicy(nn.Module):
    """A Hugging Face causal LM (``AutoModelForCausalLM``) scored token by token, plus an optional value head.

    Args:
        model: The HF causal LM (``model.model`` returns hidden states, ``get_output_embeddings()`` is the
            LM head); its parameters are trained in place.
        add_value_head: Add ``value_head = Linear(hidden_size, 1)`` (float32) for PPO critics.
        logprob_chunk_size: Rows per chunk of the vocabulary log-softmax (``None``: :func:`auto_chunk_rows`).
    """

    def __init__(
        self, model: PreTrainedModel, *, add_value_head: bool = False, logprob_chunk_size: int | None = None
    ) -> None:
        super().__init__()
        self.model: PreTrainedModel = model
        self.logprob_chunk_size = None if logprob_chunk_size is None else int(logprob_chunk_size)
        hidden_size = int(model.config.get_text_config().hidden_size)
        self.value_head: nn.Linear | None = None
        if add_value_head:
            self.value_head = nn.Linear(hidden_size, 1, dtype=torch.float32)
            # A small initial critic: values start near 0 whatever the hidden-state scale.
            nn.init.normal_(self.value_head.weight, std=1.0 / (hidden_size + 1))
            nn.init.zeros_(self.value_head.bias)

    @property
    def config(self) -> Any:
        """The HF model config."""
        return self.model.config

    def hf_state_dict_keys(self) -> list[str]:
        """Keys of the wrapped HF model's state dict."""
        return list(self.model.state_dict().keys())

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        remove_padding: bool = False,
        vision: Mapping[str, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``[B, T, H]`` last hidden states of the decoder (see :meth:`forward` for the arguments)."""
        if vision is not None:
            raise ValueError(
                "images given to a text-only model: actor.model.model_path is not a vision-language model"
            )
        positions = position_ids_from_mask(attention_mask)
        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        if remove_padding:
            return _packed_hidden(base, input_ids, attention_mask, positions)
        hidden: torch.Tensor = base(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=positions, use_cache=False
        ).last_hidden_state
        return hidden

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        *,
        temperature: float = 1.0,
        compute_entropy: bool = False,
        compute_values: bool = True,
        score_mask: torch.Tensor | None = None,
        remove_padding: bool = False,
        vision: Mapping[str, torch.Tensor] | None = None,
    ) -> dict[str, torch.Tensor]:
        """Score every token of a batch (see the module docstring for the alignment).

        Args:
            input_ids: ``[B, T]`` long token ids (left and/or right padding allowed).
            attention_mask: ``[B, T]`` 1 on real tokens, 0 on padding.
            temperature: Logits are divided by it before the softmax (> 0); use the rollout's temperature.
            compute_entropy: Also return ``"entropy"``.
            compute_values: Return ``"values"`` when the policy has a value head.
            score_mask: Optional ``[B, T]``: only these positions get log-probs and entropies (the others are
                0), which skips the vocabulary projection of e.g. prompt tokens. Values are always computed.
            remove_padding: Run the decoder on the attended tokens only, all rows packed into one sequence of
                ``attention_mask.sum()`` tokens whose position ids restart at 0 for each row, which keep the
                rows apart: per-sequence attention for a model switched to
                :data:`~rlinf_models.llm._varlen.VARLEN_SDPA` (what the FSDP actor does), variable-length kernels
                for ``flash_attention_2``, a block-diagonal causal mask for plain ``sdpa`` / ``eager``. The
                outputs equal the padded path's up to float error and the decoder does no work on padding.
            vision: A vision-language policy's packed images (``images [B, K, H, W, 3]`` uint8,
                ``image_sizes [B, K, 2]``; see :class:`~rlinf_models.llm.VLMPolicy`); ``None`` for text.

        Returns:
            ``{"logprobs": [B, T] float32, "entropy": [B, T] (if asked), "values": [B, T] (if value head)}``;
            column 0 is 0 everywhere. Entries at padding positions are meaningless (mask them).
        """
        if input_ids.ndim != 2 or attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"input_ids and attention_mask must both be [B, T]; got {tuple(input_ids.shape)} and "
                f"{tuple(attention_mask.shape)}"
            )
        b, t = input_ids.shape
        out: dict[str, torch.Tensor] = {}
        hidden = self.hidden_states(input_ids, attention_mask, remove_padding=remove_padding, vision=vision)
        prev = hidden[:, :-1].reshape(b * (t - 1), -1)
        targets = input_ids[:, 1:].reshape(-1)
        rows = None
        if score_mask is not None:
            if score_mask.shape != input_ids.shape:
                raise ValueError(
                    f"score_mask must be [B, T] = {list(input_ids.shape)}, got {list(score_mask.shape)}"
                )
            rows = score_mask[:, 1:].reshape(-1).bool().nonzero().squeeze(-1)
            prev, targets = prev[rows], targets[rows]
        lp, ent = token_logprobs_and_entropy(
            prev,
            targets,
            self.model.get_output_embeddings(),
            temperature=temperature,
            compute_entropy=compute_entropy,
            chunk_size=self.logprob_chunk_size,
        )
        if rows is not None:
            lp = lp.new_zeros(b * (t - 1)).index_put((rows,), lp)
            if ent is not None:
                ent = ent.new_zeros(b * (t - 1)).index_put((rows,), ent)
        zero_col = hidden.new_zeros((b, 1), dtype=torch.float32)
        out["logprobs"] = torch.cat([zero_col, lp.view(b, t - 1)], dim=1)
        if ent is not None:
            out["entropy"] = torch.cat([zero_col, ent.view(b, t - 1)], dim=1)
        if compute_values and self.value_head is not None:
            values = self.value_head(hidden[:, :-1].float()).squeeze(-1)  # [B, T-1]
            out["values"] = torch.cat([zero_col, values], dim=1)
        return out
