"""The π0 network: PaliGemma over the prefix, a Gemma action expert over the suffix, one shared attention.

π0 (Black et al. 2024, https://arxiv.org/abs/2410.24164) reads a **prefix** — SigLIP tokens of every camera,
then the instruction's tokens — with PaliGemma's Gemma 2B, and a **suffix** — one state token and one token
per action of the chunk — with a smaller Gemma (the action expert). In every layer both towers project their
own tokens to queries, keys and values, and attention runs over the concatenation:

- prefix tokens attend to every valid prefix token (prefix-LM) and never to the suffix;
- the state token attends to the prefix and itself;
- action tokens attend to the prefix, the state token and every action token.

Because the prefix never looks at the suffix, its keys and values are computed once per observation
(:meth:`Pi0Model.encode_prefix`, the KV cache) and every denoising step only runs the expert
(:meth:`Pi0Model.velocity`). Time follows openpi: ``x_t = t * noise + (1 - t) * actions``, the network predicts
``u = noise - actions``, and sampling integrates from ``t = 1`` (noise) to ``t = 0`` (actions).

π0.5 (``Pi0Config(pi05=True)``, https://arxiv.org/abs/2504.16054) writes the state into the prompt as discretised
tokens, so its suffix holds only the action tokens (``action_in_proj(x_t)``); the flow time goes through
``time_mlp_in`` / ``time_mlp_out`` and conditions every norm of the action expert (:class:`AdaRMSNorm`: scale,
shift and a gate on the residual branch).

The module tree (and so every ``state_dict`` key) is the one of openpi's ``PI0Pytorch`` and LeRobot's
``PI0Policy.model``: transformers' ``PaliGemmaForConditionalGeneration`` under
``paligemma_with_expert.paligemma``, a ``GemmaForCausalLM`` without input embeddings under
``paligemma_with_expert.gemma_expert``, and the projections ``state_proj``, ``action_in_proj``,
``action_out_proj``, ``action_time_mlp_in``, ``action_time_mlp_out`` (π0.5: ``time_mlp_in``, ``time_mlp_out``, and
``dense`` tensors in the expert's norms). ``value_head`` is ours.
"""

from __future__ import annotations

import math
from typing import ClassVar, cast

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor, nn

try:
    from transformers import GemmaConfig, GemmaForCausalLM, PaliGemmaConfig, PaliGemmaForConditionalGeneration
    from transformers.models.gemma.modeling_gemma import GemmaDecoderLayer, GemmaModel, apply_rotary_pos_emb
    from transformers.models.siglip import SiglipVisionConfig
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f'rlinf_models.pi0 needs transformers ({e}): pip install "rlinf-models[openpi]"') from e

from ._config import GemmaSize, Pi0Config

__all__ = ["Pi0Model", "PrefixCache", "attention_pattern", "sinusoidal_time_embedding"]

# Additive mask value of the reference implementations (a large negative, finite: a fully masked query row,
# which only padding produces, averages instead of giving NaN).
_MASKED = -2.3819763e38

# Parameters LeRobot and openpi keep in float32 when the towers run in bfloat16.
_KEEP_FLOAT32 = (
    "vision_tower",
    "multi_modal_projector",
    "input_layernorm",
    "post_attention_layernorm",
    "model.norm",
)


@attrs.frozen
class PrefixCache:
    """What the suffix needs from the prefix: per-layer keys and values, the padding mask, the VLM's output.

    Attributes:
        keys: One ``[B, num_kv_heads, P, head_dim]`` tensor per layer (rotary embedding applied).
        values: One ``[B, num_kv_heads, P, head_dim]`` tensor per layer.
        pad_mask: ``[B, P]`` bool, true for real (not padding) prefix tokens.
        hidden: ``[B, P, paligemma.width]``, the VLM's last hidden state (after its final norm).
    """

    keys: tuple[Tensor, ...]
    values: tuple[Tensor, ...]
    pad_mask: Tensor
    hidden: Tensor


def attention_pattern(pad_mask: Tensor, block_starts: Tensor) -> Tensor:
    """Boolean ``[B, L, L]`` attention (query, key) over blocks: a token sees every earlier block and its own.

    Args:
        pad_mask: ``[B, L]`` bool, true for real tokens; padding is neither seen nor sees.
        block_starts: ``[B, L]`` or ``[L]`` int, 1 where a new block starts (openpi's ``ar_mask``): all zeros is
            full attention, all ones causal, ``[0]*P + [1, 1] + [0]*(H-1)`` π0's prefix + state + actions.
    """
    block = torch.cumsum(block_starts.expand_as(pad_mask).long(), dim=1)
    sees = block[:, None, :] <= block[:, :, None]
    return sees & pad_mask[:, None, :] & pad_mask[:, :, None]


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Boolean ``[B, Lq, Lk]`` → additive ``[B, 1, Lq, Lk]`` for scaled_dot_product_attention."""
    return torch.where(mask[:, None], 0.0, _MASKED).to(dtype)


def sinusoidal_time_embedding(t: Tensor, width: int, min_period: float, max_period: float) -> Tensor:
    """``[B]`` times → ``[B, width]``: sines then cosines over periods spaced geometrically (openpi's layout)."""
    compute = torch.float32 if t.device.type == "mps" else torch.float64
    fraction = torch.linspace(0.0, 1.0, width // 2, dtype=compute, device=t.device)
    angular = 2 * math.pi / (min_period * (max_period / min_period) ** fraction)
    phase = t.to(compute)[:, None] * angular[None, :]
    return torch.cat([phase.sin(), phase.cos()], dim=1).to(t.dtype)


def _gemma_config(size: GemmaSize, vocab_size: int) -> GemmaConfig:
    return GemmaConfig(
        vocab_size=vocab_size,
        hidden_size=size.width,
        intermediate_size=size.mlp_dim,
        num_hidden_layers=size.depth,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        head_dim=size.head_dim,
        hidden_act="gelu_pytorch_tanh",
        rms_norm_eps=1e-6,
        # The published checkpoints store lm_head and embed_tokens separately (π0 never uses lm_head).
        tie_word_embeddings=False,
    )


class AdaRMSNorm(nn.Module):
    """π0.5's adaptive RMS norm: scale, shift and a residual gate computed from a condition (the flow time).

    ``dense`` maps the condition to ``[scale, shift, gate]``; the output is ``rms_norm(x) * (1 + scale) + shift``
    and the caller multiplies the sub-layer's output by ``gate`` before the residual addition.
    """

    def __init__(self, dim: int, cond_dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.dense = nn.Linear(cond_dim, 3 * dim)
        nn.init.zeros_(self.dense.weight)

    def forward(self, x: Tensor, cond: Tensor) -> tuple[Tensor, Tensor]:
        normed = x * torch.rsqrt(x.float().square().mean(dim=-1, keepdim=True) + self.eps)
        modulation = self.dense(cond.to(self.dense.weight.dtype))
        if x.ndim == 3:
            modulation = modulation[:, None]
        scale, shift, gate = modulation.chunk(3, dim=-1)
        return (normed * (1 + scale.float()) + shift.float()).to(x.dtype), gate.to(x.dtype)


def _norm(norm: nn.Module, x: Tensor, cond: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Apply a Gemma RMS norm (no gate) or an :class:`AdaRMSNorm` (with ``cond``): ``(normed, gate or None)``."""
    if isinstance(norm, AdaRMSNorm):
        if cond is None:
            raise ValueError("π0.5's adaptive norms need the time condition")
        normed_gated: tuple[Tensor, Tensor] = norm(x, cond)
        return normed_gated
    normed: Tensor = norm(x)
    return normed, None


def _gated(x: Tensor, y: Tensor, gate: Tensor | None) -> Tensor:
    return x + y if gate is None else x + y * gate


class PaliGemmaWithExpert(nn.Module):
    """The two towers (named as in openpi / LeRobot so that the state-dict keys match theirs)."""

    def __init__(self, config: Pi0Config) -> None:
        super().__init__()
        vision = SiglipVisionConfig(
            hidden_size=config.vision.hidden_size,
            intermediate_size=config.vision.intermediate_size,
            num_hidden_layers=config.vision.num_layers,
            num_attention_heads=config.vision.num_heads,
            patch_size=config.vision.patch_size,
            image_size=config.image_size,
            hidden_act="gelu_pytorch_tanh",
            layer_norm_eps=1e-6,
            vision_use_head=False,
        )
        text = _gemma_config(config.paligemma, config.vocab_size)
        paligemma_config = PaliGemmaConfig(
            vision_config=vision.to_dict(),
            text_config=text.to_dict(),
            image_token_index=config.vocab_size,
            projection_dim=config.paligemma.width,
            hidden_size=config.paligemma.width,
            tie_word_embeddings=False,
        )
        self.paligemma = PaliGemmaForConditionalGeneration(paligemma_config)
        self.gemma_expert = GemmaForCausalLM(_gemma_config(config.action_expert, config.vocab_size))
        # The expert reads embeddings made by the projections, never token ids.
        self.gemma_expert.model.embed_tokens = None
        if config.pi05:
            width = config.action_expert.width
            expert = self.gemma_expert.model
            for layer in expert.layers:
                layer.input_layernorm = AdaRMSNorm(width, width)
                layer.post_attention_layernorm = AdaRMSNorm(width, width)
            expert.norm = AdaRMSNorm(width, width)


def _layer_qkv(
    layer: GemmaDecoderLayer, h: Tensor, cos: Tensor, sin: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """Project and rotate one tower's normed tokens: ``[B, L, W]`` → q ``[B, H, L, D]``, k, v ``[B, KV, L, D]``."""
    attn = layer.self_attn
    shape = (*h.shape[:-1], -1, attn.head_dim)
    q = attn.q_proj(h).view(shape).transpose(1, 2)
    k = attn.k_proj(h).view(shape).transpose(1, 2)
    v = attn.v_proj(h).view(shape).transpose(1, 2)
    q, k = apply_rotary_pos_emb(q, k, cos, sin)
    return q, k, v


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, scale: float) -> Tensor:
    """Grouped-query attention: q ``[B, H, Lq, D]``, k/v ``[B, KV, Lk, D]``, additive mask → ``[B, Lq, H*D]``."""
    repeat = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(repeat, dim=1)
    v = v.repeat_interleave(repeat, dim=1)
    out: Tensor = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.to(q.dtype), scale=scale)
    return out.transpose(1, 2).reshape(q.shape[0], q.shape[2], -1)


def _layer_finish(
    layer: GemmaDecoderLayer, x: Tensor, attended: Tensor, gate: Tensor | None, cond: Tensor | None
) -> Tensor:
    """Output projection, (gated) residual, pre-norm MLP, (gated) residual: Gemma's layer after attention."""
    x = _gated(x, layer.self_attn.o_proj(attended.to(layer.self_attn.o_proj.weight.dtype)), gate)
    h, mlp_gate = _norm(layer.post_attention_layernorm, x, cond)
    mlp_out: Tensor = layer.mlp(h)
    return _gated(x, mlp_out, mlp_gate)


class ValueHead(nn.Module):
    """An MLP (ReLU) from the VLM width to one value."""

    def __init__(self, in_dim: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(in_dim, width), nn.ReLU()]
            in_dim = width
        layers.append(nn.Linear(in_dim, 1))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.mlp(x)
        return out.squeeze(-1)


class Pi0Model(nn.Module):
    """π0 / π0.5 network (see the module docstring); ``Pi0Model(Pi0Config(...))`` builds it with random weights."""

    FSDP_FORWARD_METHODS: ClassVar[tuple[str, ...]] = (
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

    def __init__(self, config: Pi0Config) -> None:
        super().__init__()
        self.config = config
        expert = config.action_expert.width
        self.paligemma_with_expert = PaliGemmaWithExpert(config)
        self.action_in_proj = nn.Linear(config.max_action_dim, expert)
        self.action_out_proj = nn.Linear(expert, config.max_action_dim)
        if config.pi05:
            self.time_mlp_in = nn.Linear(expert, expert)
            self.time_mlp_out = nn.Linear(expert, expert)
        else:
            self.state_proj = nn.Linear(config.max_state_dim, expert)
            self.action_time_mlp_in = nn.Linear(2 * expert, expert)
            self.action_time_mlp_out = nn.Linear(expert, expert)
        self.value_head = ValueHead(config.paligemma.width, config.value_head_sizes)
        self.set_tower_dtype(config.dtype)

    def set_tower_dtype(self, dtype: str) -> None:
        """Cast the Gemma towers to ``dtype`` (``float32``/``bfloat16``); vision, projector and norms stay float32."""
        towers = self.paligemma_with_expert
        if dtype == "float32":
            towers.to(torch.float32)
            return
        if dtype != "bfloat16":
            raise ValueError(f"dtype must be 'float32' or 'bfloat16', got {dtype!r}")
        towers.to(torch.bfloat16)
        for name, param in towers.named_parameters():
            if any(part in name for part in _KEEP_FLOAT32):
                param.data = param.data.float()

    # --- prefix ---

    @staticmethod
    def _layers(tower: GemmaModel) -> list[GemmaDecoderLayer]:
        return [cast(GemmaDecoderLayer, layer) for layer in tower.layers]

    @staticmethod
    def _dtype(tower: GemmaModel) -> torch.dtype:
        """The dtype the tower's linear layers compute in."""
        return cast(GemmaDecoderLayer, tower.layers[0]).self_attn.q_proj.weight.dtype

    @property
    def _vlm(self) -> GemmaModel:
        return cast(GemmaModel, self.paligemma_with_expert.paligemma.model.language_model)

    @property
    def _expert(self) -> GemmaModel:
        return cast(GemmaModel, self.paligemma_with_expert.gemma_expert.model)

    def embed_prefix(
        self, images: list[Tensor], image_masks: list[Tensor], tokens: Tensor, token_mask: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Prefix embeddings: every camera's SigLIP tokens, then the instruction's (scaled) token embeddings.

        Args:
            images: One ``[B, 3, S, S]`` float tensor in ``[-1, 1]`` per camera (see ``preprocess_images``).
            image_masks: One ``[B]`` bool tensor per camera: false for a missing camera (its tokens are padding).
            tokens: ``[B, T]`` int token ids.
            token_mask: ``[B, T]`` bool, true for real tokens.

        Returns:
            ``([B, P, paligemma.width]`` embeddings, ``[B, P]`` bool padding mask``)``, ``P = cameras * N + T``.
        """
        if len(images) != len(image_masks):
            raise ValueError(f"{len(images)} images but {len(image_masks)} image masks")
        paligemma = self.paligemma_with_expert.paligemma
        embeddings: list[Tensor] = []
        masks: list[Tensor] = []
        for image, present in zip(images, image_masks, strict=True):
            features = paligemma.model.get_image_features(image.float()).pooler_output
            embeddings.append(features)
            masks.append(present.bool()[:, None].expand(-1, features.shape[1]))
        # transformers' Gemma embedding already multiplies by sqrt(width), as PaliGemma/openpi do.
        embeddings.append(self._vlm.embed_tokens(tokens))
        masks.append(token_mask.bool())
        dtype = self._dtype(self._vlm)
        return torch.cat([e.to(dtype) for e in embeddings], dim=1), torch.cat(masks, dim=1)

    def encode_prefix(
        self, images: list[Tensor], image_masks: list[Tensor], tokens: Tensor, token_mask: Tensor
    ) -> PrefixCache:
        """Run the VLM over the prefix (full attention among real tokens) and keep each layer's keys and values."""
        x, pad = self.embed_prefix(images, image_masks, tokens, token_mask)
        mask = _additive(attention_pattern(pad, torch.zeros_like(pad, dtype=torch.long)), x.dtype)
        positions = torch.cumsum(pad.long(), dim=1) - 1
        cos, sin = self._vlm.rotary_emb(x, positions)
        keys: list[Tensor] = []
        values: list[Tensor] = []
        for layer in self._layers(self._vlm):
            q, k, v = _layer_qkv(layer, layer.input_layernorm(x), cos, sin)
            keys.append(k)
            values.append(v)
            x = _layer_finish(layer, x, _attend(q, k, v, mask, layer.self_attn.scaling), None, None)
        return PrefixCache(tuple(keys), tuple(values), pad, self._vlm.norm(x))

    # --- suffix ---

    def embed_suffix(self, state: Tensor | None, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor | None]:
        """Suffix embeddings ``[B, S, expert.width]`` and the adaptive-norm condition (π0.5; ``None`` for π0).

        π0: ``S = 1 + chunk``, the state token then one token per noisy action,
        ``action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t), time_embedding(t)])))``.
        π0.5: ``S = chunk``, ``action_in_proj(x_t)``; the condition is
        ``silu(time_mlp_out(silu(time_mlp_in(time_embedding(t)))))`` (``[B, expert.width]``).
        """
        actions = self.action_in_proj(x_t.to(self.action_in_proj.weight.dtype))
        time = sinusoidal_time_embedding(
            t.to(actions.dtype), actions.shape[-1], self.config.min_period, self.config.max_period
        )
        if self.config.pi05:
            return actions, F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(time))))
        if state is None:
            raise ValueError("π0 needs the state ([B, max_state_dim], normalised and zero-padded)")
        state_token = self.state_proj(state.to(self.state_proj.weight.dtype))[:, None]
        fused = torch.cat([actions, time[:, None].expand_as(actions)], dim=-1)
        action_tokens = self.action_time_mlp_out(F.silu(self.action_time_mlp_in(fused)))
        return torch.cat([state_token, action_tokens], dim=1), None

    def velocity(self, x_t: Tensor, t: Tensor, prefix: PrefixCache, state: Tensor | None) -> Tensor:
        """The flow's velocity field ``v(x_t, t)`` for one observation (its prefix cache and state).

        Args:
            x_t: ``[B, chunk_size, max_action_dim]`` noisy action chunk (float32, normalised action space).
            t: ``[B]`` flow time in ``[0, 1]``; ``t = 1`` is pure noise, ``t = 0`` the actions (openpi).
            prefix: :meth:`encode_prefix` of the observation (batch ``B``); not modified, reusable across steps.
            state: π0: ``[B, max_state_dim]`` normalised, zero-padded state. π0.5 reads the state from the
                prompt (``tokenize_prompts(..., discrete_state=...)``) and ignores this argument.

        Returns:
            ``[B, chunk_size, max_action_dim]`` float32 velocity ``≈ noise - actions``; an Euler step from
            ``t`` to ``t + dt`` (``dt < 0``) is ``x_t + dt * v``. Differentiable w.r.t. ``x_t`` and the weights.
        """
        return self.project_velocity(self.expert_output(x_t, t, prefix, state))

    def project_velocity(self, expert_output: Tensor) -> Tensor:
        """:meth:`expert_output` → the float32 velocity (``action_out_proj``)."""
        velocity: Tensor = self.action_out_proj(expert_output.to(self.action_out_proj.weight.dtype))
        return velocity.float()

    def expert_output(self, x_t: Tensor, t: Tensor, prefix: PrefixCache, state: Tensor | None) -> Tensor:
        """The action expert's normed output on the action tokens: ``[B, chunk_size, action_expert.width]``.

        :meth:`velocity` projects it; RL policies also read it for heads of their own (πRL's Flow-Noise std).
        Arguments as for :meth:`velocity`.
        """
        chunk = self.config.chunk_size
        if x_t.shape[1:] != (chunk, self.config.max_action_dim):
            raise ValueError(
                f"x_t must be [B, {chunk}, {self.config.max_action_dim}] (chunk_size, max_action_dim), "
                f"got {list(x_t.shape)}"
            )
        dtype = self._dtype(self._expert)
        x, cond = self.embed_suffix(state, x_t, t)
        x = x.to(dtype)
        batch, length = x.shape[:2]
        # π0: the state token opens a block and the actions the next ([1, 1, 0, ...]); π0.5: actions only.
        starts = torch.zeros(length, dtype=torch.long, device=x.device)
        starts[: length - chunk + 1] = 1
        own = attention_pattern(torch.ones(batch, length, dtype=torch.bool, device=x.device), starts)
        sees_prefix = prefix.pad_mask[:, None, :].expand(batch, length, -1)
        mask = _additive(torch.cat([sees_prefix, own], dim=2), x.dtype)
        positions = prefix.pad_mask.long().sum(dim=1, keepdim=True) + torch.arange(length, device=x.device)
        cos, sin = self._vlm.rotary_emb(x, positions)
        for layer, prefix_k, prefix_v in zip(
            self._layers(self._expert), prefix.keys, prefix.values, strict=True
        ):
            h, gate = _norm(layer.input_layernorm, x, cond)
            q, k, v = _layer_qkv(layer, h, cos, sin)
            k = torch.cat([prefix_k.to(k.dtype), k], dim=2)
            v = torch.cat([prefix_v.to(v.dtype), v], dim=2)
            x = _layer_finish(layer, x, _attend(q, k, v, mask, layer.self_attn.scaling), gate, cond)
        out, _ = _norm(self._expert.norm, x, cond)
        return out[:, -chunk:]

    # --- sampling, training, value ---

    def sample_actions(
        self, prefix: PrefixCache, state: Tensor | None, noise: Tensor, *, num_steps: int | None = None
    ) -> Tensor:
        """Integrate the flow with Euler steps from ``t = 1`` (``noise``) to ``t = 0``: ``[B, chunk, max_action_dim]``.

        ``dt = -1 / num_steps`` and step ``k`` evaluates the velocity at ``t = 1 + k * dt`` (openpi's sampler).
        """
        steps = self.config.num_inference_steps if num_steps is None else num_steps
        if steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {steps}")
        dt = -1.0 / steps
        x = noise.float()
        for k in range(steps):
            t = torch.full((x.shape[0],), 1.0 + k * dt, dtype=torch.float32, device=x.device)
            x = x + dt * self.velocity(x, t, prefix, state)
        return x

    def sample_time(self, batch: int) -> Tensor:
        """Training times ``Beta(alpha, beta) * scale + offset`` (``[batch]``, float32, on the model's device).

        Drawn on the CPU from torch's global generator (``torch.manual_seed`` makes it repeatable).
        """
        alpha = torch.tensor(self.config.time_beta_alpha, dtype=torch.float32)
        beta = torch.tensor(self.config.time_beta_beta, dtype=torch.float32)
        t = torch.distributions.Beta(alpha, beta).sample((batch,))
        return (t * self.config.time_scale + self.config.time_offset).to(self.action_in_proj.weight.device)

    def flow_matching_loss(
        self, prefix: PrefixCache, state: Tensor | None, actions: Tensor, noise: Tensor, t: Tensor
    ) -> Tensor:
        """Per-element flow-matching loss ``(v(x_t, t) - (noise - actions))²``: ``[B, chunk, max_action_dim]``.

        ``x_t = t * noise + (1 - t) * actions`` (openpi). Average over the real action dimensions (the padded
        ones are zero targets) and over the batch for the supervised loss.
        """
        t_ = t[:, None, None]
        x_t = t_ * noise + (1 - t_) * actions
        v = self.velocity(x_t, t, prefix, state)
        return (v - (noise - actions)).square()

    @property
    def value_head_dtype(self) -> torch.dtype:
        return next(self.value_head.parameters()).dtype

    def value(self, prefix: PrefixCache) -> Tensor:
        """``[B]`` value from the mean of the VLM's output over the real prefix tokens."""
        mask = prefix.pad_mask[..., None].to(torch.float32)
        pooled = (prefix.hidden.float() * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
        value: Tensor = self.value_head(pooled.to(self.value_head_dtype))
        return value
