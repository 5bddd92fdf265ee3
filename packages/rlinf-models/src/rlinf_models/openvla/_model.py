"""``OpenVLAModel``: OpenVLA's network under its published tensor names, with RL log-probabilities.

The module tree is that of ``OpenVLAForActionPrediction`` (openvla/openvla ``modeling_prismatic.py``):
``vision_backbone`` (timm-layout featurizers, :mod:`._vision`), ``projector`` and ``language_model``
(transformers' ``LlamaForCausalLM``), so its ``state_dict`` has the keys of the published safetensors. The
prefix is the Prismatic one: the BOS embedding, then the projected patches, then the rest of the prompt.

RL side (RLinf's ``OpenVLAForRLActionPrediction``): an action is ``action_dim`` tokens decoded one at a time,
each drawn from the LM's logits restricted to the ``n_action_bins`` action tokens, divided by ``temperature``
(and cut to the ``top_k`` best when set). :meth:`OpenVLAModel.sample_actions` decodes with a KV cache and returns
the tokens with their per-token log-probabilities and entropies; :meth:`OpenVLAModel.evaluate_actions`
recomputes them in one teacher-forced pass over prompt + tokens (what the actor trains on). The value head,
RLinf's, reads the LM's last hidden state at the last prompt token (the one that predicts the first action
token).
"""

from __future__ import annotations

from typing import Any, ClassVar

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:
    from transformers import LlamaConfig, LlamaForCausalLM
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.openvla needs transformers ({e}): pip install "rlinf-models[openpi]"'
    ) from e

from ._actions import ActionTokenizer
from ._config import OpenVLAConfig
from ._vision import PrismaticProjector, PrismaticVisionBackbone

__all__ = ["ActionSample", "OpenVLAModel", "ValueHead", "llama_config", "reduce_log_probs"]


def llama_config(config: OpenVLAConfig) -> LlamaConfig:
    """``text_config`` over ``LlamaConfig``'s defaults (Llama-2 7B), as the HF port's ``CONFIG_MAPPING['llama']``."""
    kwargs = {k: v for k, v in config.text_config.items() if k not in ("model_type", "torch_dtype")}
    return LlamaConfig(**kwargs)


class ValueHead(nn.Module):
    """RLinf's ``ValueHead``: Linear → GELU per hidden width, then a bias-free Linear to one value."""

    def __init__(self, in_dim: int, hidden_sizes: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for width in hidden_sizes:
            layers += [nn.Linear(in_dim, width), nn.GELU()]
            in_dim = width
        last = nn.Linear(in_dim, 1, bias=False)
        nn.init.normal_(last.weight, std=0.02)
        self.mlp = nn.Sequential(*layers, last)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.mlp(hidden).squeeze(-1)  # type: ignore[no-any-return]


@attrs.frozen
class ActionSample:
    """Decoded action tokens with what RL needs of them.

    Attributes:
        tokens: ``[B, A]`` action token ids.
        log_probs: ``[B, A]`` token-level log-probabilities (RLinf's ``token_level``).
        entropy: ``[B, A]`` entropy of each token's distribution.
        values: ``[B]`` value estimates, or ``None`` without a value head.
    """

    tokens: Tensor
    log_probs: Tensor
    entropy: Tensor
    values: Tensor | None


def reduce_log_probs(token_level: Tensor, level: str, action_dim: int) -> Tensor:
    """RLinf's granularities of ``[B, C·D]`` token log-probabilities (or entropies).

    ``token_level``: unchanged; ``action_level``: summed over each action's ``D`` dims, ``[B, C]``;
    ``chunk_level``: summed over everything, ``[B]``. OpenVLA decodes one action per step (``C = 1``).
    """
    if level == "token_level":
        return token_level
    if level == "action_level":
        return token_level.reshape(token_level.shape[0], -1, action_dim).sum(-1)
    if level == "chunk_level":
        return token_level.sum(-1)
    raise ValueError(f"level must be one of ['token_level', 'action_level', 'chunk_level'], got {level!r}")


class OpenVLAModel(nn.Module):
    """The Prismatic VLM of OpenVLA (published names), an optional value head, and RL log-probabilities."""

    FSDP_FORWARD_METHODS: ClassVar[tuple[str, ...]] = (
        "embed_prompt",
        "splice_patches",
        "prompt_values",
        "sample_actions",
        "evaluate_actions",
    )
    """What the policy calls instead of ``forward``: FSDP2 gathers the network around each (``shard_module``)."""

    side_modules: tuple[str, ...] = ()
    """Submodules stored outside the safetensors shards (none here; OpenVLA-OFT's heads have their own files)."""

    def __init__(self, config: OpenVLAConfig, *, value_head_sizes: tuple[int, ...] | None = None) -> None:
        """``value_head_sizes``: the value head's hidden widths (RLinf's: ``(512, 128)``); ``None``: no head."""
        super().__init__()
        self.config = config
        self.vision_backbone = PrismaticVisionBackbone(config.vit_specs, config.image_sizes)
        text = llama_config(config)
        self.projector = PrismaticProjector(
            fused=config.use_fused_vision_backbone,
            vision_dim=self.vision_backbone.embed_dim,
            llm_dim=text.hidden_size,
        )
        text._attn_implementation = "sdpa"
        self.language_model = LlamaForCausalLM(text)
        self.value_head = (
            ValueHead(text.hidden_size, value_head_sizes) if value_head_sizes is not None else None
        )
        self.action_tokenizer = ActionTokenizer(config.tokenizer_vocab_size, config.n_action_bins)

    # --- the Prismatic forward ---

    def embed_prompt(
        self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """The LM's input: ``[BOS, patches, prompt[1:]]`` embeddings ``[B, L', H]`` and their mask ``[B, L']``.

        Args:
            pixel_values: ``[B, 3·towers, S, S]`` (:func:`preprocess_images`).
            input_ids: ``[B, L]`` prompts whose column 0 is BOS (:func:`pad_prompts`: padding sits after it).
            attention_mask: ``[B, L]``, 1 on real tokens.
        """
        patches = self.projector(self.vision_backbone(pixel_values.to(self.projector.fc1.weight.dtype)))
        return self.splice_patches(input_ids, attention_mask, patches)

    def splice_patches(
        self, input_ids: Tensor, attention_mask: Tensor, patches: Tensor
    ) -> tuple[Tensor, Tensor]:
        """``[BOS, patches, prompt[1:]]`` embeddings and mask from the prompt and projected ``patches [B, P, H]``."""
        embeds = self.language_model.get_input_embeddings()(input_ids)
        embeds = torch.cat([embeds[:, :1], patches.to(embeds.dtype), embeds[:, 1:]], dim=1)
        ones = attention_mask.new_ones(patches.shape[:2])
        return embeds, torch.cat([attention_mask[:, :1], ones, attention_mask[:, 1:]], dim=1)

    def _hidden(self, embeds: Tensor, mask: Tensor, **kwargs: Any) -> tuple[Tensor, Any]:
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.language_model.model(
            inputs_embeds=embeds, attention_mask=mask, position_ids=positions[:, -embeds.shape[1] :], **kwargs
        )
        return out.last_hidden_state, out.past_key_values

    def _token_dist(self, hidden: Tensor, temperature: float, top_k: int) -> Tensor:
        """Log-probabilities ``[..., n_bins]`` over the action tokens (ascending ids) from LM hidden states."""
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        first = self.action_tokenizer.first_token
        logits = self.language_model.lm_head(hidden)[..., first : first + self.config.n_action_bins].float()
        logits = logits / temperature
        if 0 < top_k < logits.shape[-1]:
            kth = logits.topk(top_k, dim=-1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return F.log_softmax(logits, dim=-1)

    @staticmethod
    def _entropy(log_probs: Tensor) -> Tensor:
        p = log_probs.exp()
        return -torch.where(p > 0, p * log_probs, torch.zeros_like(p)).sum(-1)

    def _value(self, last_prompt_hidden: Tensor) -> Tensor | None:
        if self.value_head is None:
            return None
        dtype = next(self.value_head.parameters()).dtype
        values: Tensor = self.value_head(last_prompt_hidden.to(dtype))
        return values.float()

    # --- RL ---

    def prompt_values(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor | None:
        """Values ``[B]`` of the prompts alone (those :meth:`sample_actions` returns), ``None`` without a head."""
        if self.value_head is None:
            return None
        embeds, mask = self.embed_prompt(pixel_values, input_ids, attention_mask)
        hidden, _ = self._hidden(embeds, mask)
        return self._value(hidden[:, -1])

    def sample_actions(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        *,
        action_dim: int = 7,
        temperature: float = 1.0,
        top_k: int = 0,
        greedy: bool = False,
        generator: torch.Generator | None = None,
    ) -> ActionSample:
        """Decode ``action_dim`` action tokens per observation with a KV cache (the rollout).

        ``greedy`` picks the most likely token; otherwise tokens are drawn from the tempered distribution.
        Log-probabilities and entropies are those of the tempered (top-k) distribution either way.
        """
        embeds, mask = self.embed_prompt(pixel_values, input_ids, attention_mask)
        hidden, cache = self._hidden(embeds, mask, use_cache=True)
        last = hidden[:, -1]
        values = self._value(last)
        tokens, log_probs, entropies = [], [], []
        for step in range(action_dim):
            dist = self._token_dist(last, temperature, top_k)
            index = (
                dist.argmax(-1)
                if greedy
                else torch.multinomial(dist.exp(), 1, generator=generator).squeeze(-1)
            )
            tokens.append(index + self.action_tokenizer.first_token)
            log_probs.append(dist.gather(-1, index[:, None]).squeeze(-1))
            entropies.append(self._entropy(dist))
            if step + 1 < action_dim:
                mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
                step_embeds = self.language_model.get_input_embeddings()(tokens[-1][:, None])
                hidden, cache = self._hidden(step_embeds, mask, past_key_values=cache, use_cache=True)
                last = hidden[:, -1]
        return ActionSample(
            torch.stack(tokens, 1), torch.stack(log_probs, 1), torch.stack(entropies, 1), values
        )

    def evaluate_actions(
        self,
        pixel_values: Tensor,
        input_ids: Tensor,
        attention_mask: Tensor,
        action_tokens: Tensor,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
    ) -> ActionSample:
        """Log-probabilities ``[B, A]``, entropies and values of stored ``action_tokens`` ``[B, A]``, teacher-forced.

        Raises:
            ValueError: when a token is not an action token.
        """
        first = self.action_tokenizer.first_token
        index = action_tokens - first
        if bool(((index < 0) | (index >= self.config.n_action_bins)).any()):
            raise ValueError(f"action tokens must lie in [{first}, {first + self.config.n_action_bins})")
        embeds, mask = self.embed_prompt(pixel_values, input_ids, attention_mask)
        action_embeds = self.language_model.get_input_embeddings()(action_tokens)
        embeds = torch.cat([embeds, action_embeds], dim=1)
        mask = torch.cat([mask, mask.new_ones(action_tokens.shape)], dim=1)
        hidden, _ = self._hidden(embeds, mask)
        a = action_tokens.shape[1]
        predicting = hidden[:, -a - 1 : -1]  # the positions whose next token is each action token
        dist = self._token_dist(predicting, temperature, top_k)
        log_probs = dist.gather(-1, index[..., None]).squeeze(-1)
        return ActionSample(action_tokens, log_probs, self._entropy(dist), self._value(predicting[:, 0]))
