"""The SmolVLA network: a truncated SmolVLM over the prefix, a narrower Llama action expert over the actions.

SmolVLA (Shukor et al. 2025, https://arxiv.org/abs/2506.01844) reads a **prefix** — each camera's SmolVLM image
tokens (SigLIP patches, pixel-shuffled and projected), the instruction's tokens, and one state token
(``state_proj`` of the padded state) — with the first ``num_vlm_layers`` layers of SmolVLM2's Llama text model.
Images and instruction attend to each other; the state token attends to them and itself. The **suffix** is one
token per action of the chunk, ``action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t),
sincos(t)])))``, run by the action expert (a Llama of ``expert_width_multiplier`` the width, same heads):

- in a **self-attention** layer (every ``self_attn_every_n_layers``-th VLM layer) the expert's queries, keys and
  values come from its own tokens, and an action token attends to every real prefix token and to the action
  tokens up to itself (causal);
- in a **cross-attention** layer the expert's queries come from its tokens and its keys and values are its own
  ``k_proj`` / ``v_proj`` of the VLM layer's keys and values (after their rotary embedding); the action tokens
  attend to the real prefix tokens only.

Rotary embeddings use base 10 000 (LeRobot's, not the text model's ``rope_theta``) at position ``cumsum(real) - 1``;
the expert's queries continue after the real prefix tokens in self-attention layers and start at 0 in
cross-attention layers. Image and token embeddings are multiplied by ``sqrt(text_width)``.

Because the prefix never looks at the suffix, its keys and values are computed once per observation
(:meth:`SmolVLAModel.encode_prefix`) and every denoising step runs the expert only (:meth:`SmolVLAModel.velocity`).
Time follows openpi: ``x_t = t * noise + (1 - t) * actions`` and the network predicts ``u = noise - actions``.

The module tree (and so every ``state_dict`` key) is LeRobot's ``SmolVLAPolicy.model``: transformers'
``SmolVLMForConditionalGeneration`` under ``vlm_with_expert.vlm`` (its text model built with ``num_vlm_layers``
layers, which is LeRobot's truncation), a ``LlamaModel`` without input embeddings under
``vlm_with_expert.lm_expert``, and ``state_proj``, ``action_in_proj``, ``action_out_proj``,
``action_time_mlp_in``, ``action_time_mlp_out``. ``value_head`` is ours.
"""

from __future__ import annotations

import math
from typing import ClassVar, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:
    from transformers import LlamaConfig, LlamaModel, SmolVLMConfig, SmolVLMForConditionalGeneration
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.smolvla needs transformers ({e}): pip install "rlinf-models[openpi]"'
    ) from e

from ..pi0._model import PrefixCache, ValueHead, attention_pattern, sinusoidal_time_embedding
from ._config import SmolVLAConfig

__all__ = ["SmolVLAModel", "SmolVLMWithExpert", "apply_rope"]

# Additive mask value (a large negative, finite: a fully masked query row, which only padding produces, averages
# instead of giving NaN).
_MASKED = -2.3819763e38
_ROPE_BASE = 10_000.0


def apply_rope(x: Tensor, positions: Tensor) -> Tensor:
    """Rotary embedding of ``x [B, L, H, D]`` at integer ``positions [B, L]`` (base 10 000, halves rotated).

    Computed in float32 and returned in ``x``'s dtype, as LeRobot's SmolVLA does.
    """
    half = x.shape[-1] // 2
    exponents = torch.arange(half, dtype=torch.float32, device=x.device) * (2.0 / x.shape[-1])
    angles = positions.float()[..., None] / (_ROPE_BASE**exponents)
    cos, sin = angles.cos()[:, :, None], angles.sin()[:, :, None]
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean ``[B, Lq, Lk]`` → additive ``[B, 1, Lq, Lk]`` for scaled_dot_product_attention."""
    return torch.where(mask[:, None], 0.0, _MASKED).to(dtype)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Grouped-query attention: q ``[B, Lq, H, D]``, k/v ``[B, Lk, KV, D]``, additive mask → ``[B, Lq, H*D]``."""
    repeat = q.shape[2] // k.shape[2]
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))
    k_ = k_.repeat_interleave(repeat, dim=1)
    v_ = v_.repeat_interleave(repeat, dim=1)
    out: Tensor = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=mask.to(q_.dtype))
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[1], -1)


def _heads(x: Tensor, head_dim: int) -> Tensor:
    """``[B, L, H*D]`` → ``[B, L, H, D]``."""
    return x.view(*x.shape[:-1], -1, head_dim)


def _finish(layer: LlamaDecoderLayer, x: Tensor, attended: Tensor) -> Tensor:
    """Output projection and residual, then the pre-norm MLP and residual: a Llama layer after attention."""
    x = x + layer.self_attn.o_proj(attended.to(layer.self_attn.o_proj.weight.dtype))
    mlp_out: Tensor = layer.mlp(layer.post_attention_layernorm(x))
    return x + mlp_out


class SmolVLMWithExpert(nn.Module):
    """The two towers, named as in LeRobot so that the state-dict keys match its checkpoints."""

    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__()
        hf = config.vlm.to_hf_dict()
        hf["text_config"]["num_hidden_layers"] = config.vlm_layers  # LeRobot's truncation
        self.vlm = SmolVLMForConditionalGeneration(SmolVLMConfig(**hf))
        expert = LlamaConfig(
            **{
                **hf["text_config"],
                "hidden_size": config.expert_width,
                "intermediate_size": config.expert_mlp_dim,
                "num_hidden_layers": config.expert_layers,
            }
        )
        self.lm_expert = LlamaModel(expert)
        # The expert reads embeddings made by the projections, never token ids.
        # (transformers types the attribute as an Embedding; LeRobot's module tree has none here.)
        self.lm_expert.embed_tokens = None  # type: ignore[assignment]
        kv_width = config.vlm.num_kv_heads * config.vlm.head_dim
        for index, layer in enumerate(self.lm_expert.layers):
            if config.is_cross_expert_layer(index):  # its keys and values are projected from the VLM's
                attn = cast(LlamaDecoderLayer, layer).self_attn
                attn.k_proj = nn.Linear(kv_width, kv_width, bias=False)
                attn.v_proj = nn.Linear(kv_width, kv_width, bias=False)


class SmolVLAModel(nn.Module):
    """SmolVLA network (see the module docstring); ``SmolVLAModel(SmolVLAConfig(...))`` builds it with random weights."""

    FSDP_FORWARD_METHODS: ClassVar[tuple[str, ...]] = (
        "embed_image",
        "embed_prefix",
        "encode_prefix",
        "embed_suffix",
        "velocity",
        "project_velocity",
        "expert_output",
        "sample_actions",
        "flow_matching_loss",
        "value",
    )
    """What the policy calls instead of ``forward``: FSDP2 gathers the network around each (``shard_module``)."""

    def __init__(self, config: SmolVLAConfig) -> None:
        super().__init__()
        self.config = config
        expert = config.expert_width
        self.vlm_with_expert = SmolVLMWithExpert(config)
        self.state_proj = nn.Linear(config.max_state_dim, config.vlm.text_width)
        self.action_in_proj = nn.Linear(config.max_action_dim, expert)
        self.action_out_proj = nn.Linear(expert, config.max_action_dim)
        self.action_time_mlp_in = nn.Linear(2 * expert, expert)
        self.action_time_mlp_out = nn.Linear(expert, expert)
        self.value_head = ValueHead(config.vlm.text_width, config.value_head_sizes)

    # --- towers ---

    @property
    def _text(self) -> LlamaModel:
        return cast(LlamaModel, self.vlm_with_expert.vlm.model.text_model)

    @property
    def _expert(self) -> LlamaModel:
        return self.vlm_with_expert.lm_expert

    @staticmethod
    def _layers(tower: LlamaModel) -> list[LlamaDecoderLayer]:
        return [cast(LlamaDecoderLayer, layer) for layer in tower.layers]

    def _expert_layer(self, vlm_layer: int) -> LlamaDecoderLayer | None:
        """The expert layer beside VLM layer ``vlm_layer`` (none between strided expert layers)."""
        stride = self.config.layer_stride
        if vlm_layer % stride:
            return None
        return self._layers(self._expert)[vlm_layer // stride]

    # --- prefix ---

    def embed_image(self, image: Tensor) -> Tensor:
        """``[B, 3, S, S]`` in ``[-1, 1]`` → ``[B, image_tokens, text_width]`` (vision tower + connector, unscaled)."""
        vlm = self.vlm_with_expert.vlm.model
        vision_dtype = vlm.vision_model.embeddings.patch_embedding.weight.dtype
        patches = vlm.vision_model(pixel_values=image.to(vision_dtype)).last_hidden_state
        features: Tensor = vlm.connector(patches)
        return features

    def embed_prefix(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        state: Tensor,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Prefix embeddings: every camera's image tokens, the instruction's tokens, the state token.

        Args:
            images: One ``[B, 3, S, S]`` float tensor in ``[-1, 1]`` per camera (see ``preprocess_image``).
            image_masks: One ``[B]`` bool tensor per camera: false for a missing camera (its tokens are padding).
            tokens: ``[B, T]`` int token ids.
            token_mask: ``[B, T]`` bool, true for real tokens.
            state: ``[B, max_state_dim]`` normalised, zero-padded state.

        Returns:
            ``[B, P, text_width]`` embeddings, ``[B, P]`` bool padding mask, ``[P]`` int block starts (1 at the
            state token), ``P = cameras * image_tokens + T + 1``.
        """
        if len(images) != len(image_masks):
            raise ValueError(f"{len(images)} images but {len(image_masks)} image masks")
        scale = math.sqrt(self.config.vlm.text_width)
        embeddings: list[Tensor] = []
        masks: list[Tensor] = []
        for image, present in zip(images, image_masks, strict=True):
            features = self.embed_image(image)
            embeddings.append(features * torch.tensor(scale, dtype=features.dtype))
            masks.append(present.bool()[:, None].expand(-1, features.shape[1]))
        words = self._text.embed_tokens(tokens)
        embeddings.append(words * scale)
        masks.append(token_mask.bool())
        embeddings.append(self.state_proj(state.to(self.state_proj.weight.dtype))[:, None])
        masks.append(torch.ones_like(token_mask[:, :1], dtype=torch.bool))
        pad = torch.cat(masks, dim=1)
        starts = torch.zeros(pad.shape[1], dtype=torch.long, device=pad.device)
        starts[-1] = 1  # images and instruction do not see the state
        dtype = self._text.norm.weight.dtype
        return torch.cat([e.to(dtype) for e in embeddings], dim=1), pad, starts

    def encode_prefix(
        self,
        images: list[Tensor],
        image_masks: list[Tensor],
        tokens: Tensor,
        token_mask: Tensor,
        state: Tensor,
    ) -> PrefixCache:
        """Run the kept VLM layers over the prefix and keep each layer's keys and values (after RoPE).

        Arguments as for :meth:`embed_prefix`. The cache's keys and values are ``[B, P, num_kv_heads, head_dim]``.
        """
        x, pad, starts = self.embed_prefix(images, image_masks, tokens, token_mask, state)
        mask = _additive(attention_pattern(pad, starts), x.dtype)
        positions = torch.cumsum(pad.long(), dim=1) - 1
        head_dim = self.config.vlm.head_dim
        keys: list[Tensor] = []
        values: list[Tensor] = []
        for layer in self._layers(self._text):
            h = layer.input_layernorm(x)
            attn = layer.self_attn
            q = apply_rope(_heads(attn.q_proj(h), head_dim), positions)
            k = apply_rope(_heads(attn.k_proj(h), head_dim), positions)
            v = _heads(attn.v_proj(h), head_dim)
            keys.append(k)
            values.append(v)
            x = _finish(layer, x, _attend(q, k, v, mask))
        return PrefixCache(tuple(keys), tuple(values), pad, self._text.norm(x))

    # --- suffix ---

    def embed_suffix(self, x_t: Tensor, t: Tensor) -> Tensor:
        """Action tokens ``[B, chunk, expert_width]``: the noisy actions fused with the time embedding by an MLP."""
        actions = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))
        time = sinusoidal_time_embedding(
            t.to(actions.dtype), actions.shape[-1], self.config.min_period, self.config.max_period
        )
        fused = torch.cat([actions, time[:, None].expand_as(actions)], dim=-1)
        out: Tensor = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(fused)))
        return out

    def velocity(self, x_t: Tensor, t: Tensor, prefix: PrefixCache, state: Tensor | None = None) -> Tensor:
        """The flow's velocity field ``v(x_t, t)`` for one observation (its prefix cache).

        Args:
            x_t: ``[B, chunk_size, max_action_dim]`` noisy action chunk (float32, normalised action space).
            t: ``[B]`` flow time in ``[0, 1]``; ``t = 1`` is pure noise, ``t = 0`` the actions (openpi).
            prefix: :meth:`encode_prefix` of the observation (batch ``B``); not modified, reusable across steps.
            state: ignored: SmolVLA's state is a prefix token, already in ``prefix`` (kept so that the signature
                is π0's).

        Returns:
            ``[B, chunk_size, max_action_dim]`` float32 velocity ``≈ noise - actions``; an Euler step from
            ``t`` to ``t + dt`` (``dt < 0``) is ``x_t + dt * v``. Differentiable w.r.t. ``x_t`` and the weights.
        """
        return self.project_velocity(self.expert_output(x_t, t, prefix))

    def project_velocity(self, expert_output: Tensor) -> Tensor:
        """:meth:`expert_output` → the float32 velocity (``action_out_proj``)."""
        velocity: Tensor = self.action_out_proj(expert_output.to(self.action_out_proj.weight.dtype))
        return velocity.float()

    def expert_output(self, x_t: Tensor, t: Tensor, prefix: PrefixCache) -> Tensor:
        """The action expert's normed output on the action tokens: ``[B, chunk_size, expert_width]``.

        :meth:`velocity` projects it; RL policies also read it for heads of their own (πRL's Flow-Noise std).
        """
        cfg = self.config
        if x_t.shape[1:] != (cfg.chunk_size, cfg.max_action_dim):
            raise ValueError(
                f"x_t must be [B, {cfg.chunk_size}, {cfg.max_action_dim}] (chunk_size, max_action_dim), "
                f"got {list(x_t.shape)}"
            )
        x = self.embed_suffix(x_t, t)
        x = x.to(self._expert.norm.weight.dtype)
        batch, length = x.shape[:2]
        arange = torch.arange(length, device=x.device)
        causal = (arange[None, :] <= arange[:, None]).expand(batch, length, length)
        sees_prefix = prefix.pad_mask[:, None, :].expand(batch, length, -1)
        self_mask = _additive(torch.cat([sees_prefix, causal], dim=2), x.dtype)
        cross_mask = _additive(sees_prefix, x.dtype)
        self_positions = prefix.pad_mask.long().sum(dim=1, keepdim=True) + arange
        cross_positions = arange.expand(batch, length)
        head_dim = cfg.vlm.head_dim
        for index, (prefix_k, prefix_v) in enumerate(zip(prefix.keys, prefix.values, strict=True)):
            layer = self._expert_layer(index)
            if layer is None:
                continue
            h = layer.input_layernorm(x)
            attn = layer.self_attn
            if cfg.is_cross_layer(index):
                q = apply_rope(_heads(attn.q_proj(h), head_dim), cross_positions)
                dtype = attn.k_proj.weight.dtype
                k = _heads(attn.k_proj(prefix_k.flatten(2).to(dtype)), head_dim)
                v = _heads(attn.v_proj(prefix_v.flatten(2).to(dtype)), head_dim)
                attended = _attend(q, k, v, cross_mask)
            else:
                q = apply_rope(_heads(attn.q_proj(h), head_dim), self_positions)
                k = apply_rope(_heads(attn.k_proj(h), head_dim), self_positions)
                v = _heads(attn.v_proj(h), head_dim)
                k = torch.cat([prefix_k.to(k.dtype), k], dim=1)
                v = torch.cat([prefix_v.to(v.dtype), v], dim=1)
                attended = _attend(q, k, v, self_mask)
            x = _finish(layer, x, attended)
        out: Tensor = self._expert.norm(x)
        return out

    # --- sampling, training, value ---

    def sample_actions(
        self, prefix: PrefixCache, state: Tensor | None, noise: Tensor, *, num_steps: int | None = None
    ) -> Tensor:
        """Integrate the flow with Euler steps from ``t = 1`` (``noise``) to ``t = 0``: ``[B, chunk, max_action_dim]``.

        ``dt = -1 / num_steps`` and step ``k`` evaluates the velocity at ``t = 1 + k * dt`` (LeRobot's sampler).
        ``state`` is ignored (it is in ``prefix``).
        """
        steps = self.config.num_steps if num_steps is None else num_steps
        if steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {steps}")
        dt = -1.0 / steps
        x = noise.float()
        for k in range(steps):
            t = torch.full((x.shape[0],), 1.0 + k * dt, dtype=torch.float32, device=x.device)
            x = x + dt * self.velocity(x, t, prefix)
        return x

    def sample_time(self, batch: int) -> Tensor:
        """Training times ``Beta(1.5, 1) * 0.999 + 0.001`` (``[batch]``, float32, on the model's device).

        Drawn on the CPU from torch's global generator (``torch.manual_seed`` makes it repeatable).
        """
        t = torch.distributions.Beta(torch.tensor(1.5), torch.tensor(1.0)).sample((batch,))
        return (t * 0.999 + 0.001).to(self.action_in_proj.weight.device)

    def flow_matching_loss(
        self, prefix: PrefixCache, state: Tensor | None, actions: Tensor, noise: Tensor, t: Tensor
    ) -> Tensor:
        """Per-element flow-matching loss ``(v(x_t, t) - (noise - actions))²``: ``[B, chunk, max_action_dim]``.

        ``x_t = t * noise + (1 - t) * actions``; ``state`` is ignored (it is in ``prefix``).
        """
        t_ = t[:, None, None]
        x_t = t_ * noise + (1 - t_) * actions
        v = self.velocity(x_t, t, prefix)
        return (v - (noise - actions)).square()

    def value(self, prefix: PrefixCache) -> Tensor:
        """``[B]`` value from the mean of the VLM's output over the real prefix tokens."""
        mask = prefix.pad_mask[..., None].to(torch.float32)
        pooled = (prefix.hidden.float() * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
        head_dtype = next(self.value_head.parameters()).dtype
        value: Tensor = self.value_head(pooled.to(head_dtype))
        return value
