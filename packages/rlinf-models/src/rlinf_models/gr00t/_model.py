"""The GR00T N1.5 network: Eagle 2.5's features of one LM layer condition a flow-matching DiT action head.

GR00T N1.5 (NVIDIA, 2025) reads each camera image with Eagle 2.5's SigLIP vision tower, projects its patch
tokens with ``mlp1`` to the text width and writes them into the embeddings of the image placeholder tokens of
the prompt; the first ``select_layer`` layers of the Qwen3 text model run over the sequence and their normed
output are the **VL tokens**. The action head normalises them (``vlln``) and runs a small self-attention
transformer over them (``vl_self_attention``). Per denoising step, the DiT reads ``[state token, 32 learned
future tokens, one token per action]``: the state token is ``state_encoder(state)``, the action tokens
``action_encoder(noisy actions, step)`` plus a learned position embedding; its even blocks cross-attend to the
VL tokens. ``action_decoder`` of the DiT's output on the action tokens is the velocity. Every encoder/decoder
MLP has one set of weights per embodiment (``embodiment_id``).

Time: GR00T's flow runs from noise at ``τ = 0`` to actions at ``τ = 1`` (``x = (1-τ)·noise + τ·actions``,
velocity ``actions - noise``) and the network sees ``step = ⌊τ · num_timestep_buckets⌋``. The RL code here uses
openpi's convention (noise at ``t = 1``, velocity ``noise - actions``): ``t = 1 - τ`` and the velocity's sign
flips; Euler sampling with ``num_inference_timesteps`` steps is GR00T's ``get_action`` exactly.

The VL tokens are computed once per observation (:meth:`GR00TModel.encode_prefix`); every denoising step runs
the action head only (:meth:`GR00TModel.velocity`). Padding tokens (prompts of different lengths in one batch,
padded on the right) are hidden from the action head's attention, so each sample's result is the one GR00T gives
for it alone.

The module tree (and so every ``state_dict`` key) is the published checkpoint's: ``backbone.eagle_model``
(``vision_model``: transformers' ``SiglipVisionModel``; ``mlp1``; ``language_model``: transformers'
``Qwen3ForCausalLM`` built with ``select_layer`` layers), ``backbone.eagle_linear`` when ``project_to_dim`` is
set, and ``action_head.*``. ``value_head`` is ours.
"""

from __future__ import annotations

import math
from typing import ClassVar, cast

import torch
from torch import Tensor, nn

try:
    from transformers import Qwen3Config, Qwen3ForCausalLM, SiglipVisionConfig, SiglipVisionModel
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.gr00t needs transformers ({e}): pip install "rlinf-models[openpi]"'
    ) from e

from ..pi0._model import PrefixCache, ValueHead
from ._config import GR00TConfig
from ._dit import CategorySpecificMLP, DiT, MultiEmbodimentActionEncoder, SelfAttentionTransformer

__all__ = [
    "EagleBackbone",
    "EagleModel",
    "FlowMatchingActionHead",
    "GR00TModel",
    "SiglipVisionTower",
    "pixel_shuffle",
]


def pixel_shuffle(x: Tensor) -> Tensor:
    """Eagle's pixel shuffle (ratio 0.5): ``[N, W, H, C]`` → ``[N, W/2, H/2, 4C]``."""
    n, w, h, c = x.shape
    x = x.reshape(n, w, h // 2, c * 2).permute(0, 2, 1, 3).reshape(n, h // 2, w // 2, c * 4)
    return x.permute(0, 2, 1, 3)


class SiglipVisionTower(nn.Module):
    """Transformers' ``SiglipVisionModel`` under ``vision_model``, so that the names are the published ones.

    The published names (``vision_model.vision_model.embeddings...``) are transformers 4's module tree, which
    transformers 5 flattened.
    """

    def __init__(self, config: SiglipVisionConfig) -> None:
        super().__init__()
        self.vision_model = SiglipVisionModel(config)

    def forward(self, pixel_values: Tensor) -> Tensor:
        """``[N, 3, S, S]`` → the last layer's normed patch tokens ``[N, patches, vision_width]``."""
        out: Tensor = self.vision_model(pixel_values=pixel_values).last_hidden_state
        return out


class EagleModel(nn.Module):
    """Eagle 2.5 VL: ``vision_model`` (SigLIP), ``mlp1`` (projector), ``language_model`` (Qwen3, truncated)."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        e = config.eagle
        hf = e.to_hf_dict()
        vision = SiglipVisionConfig(**{k: val for k, val in hf["vision_config"].items() if k != "model_type"})
        self.vision_model = SiglipVisionTower(vision)
        if e.mlp_connector_layers == 2:
            self.mlp1 = nn.Sequential(
                nn.LayerNorm(e.projector_in),
                nn.Linear(e.projector_in, e.text_width),
                nn.GELU(),
                nn.Linear(e.text_width, e.text_width),
            )
        else:
            self.mlp1 = nn.Sequential(nn.Linear(e.projector_in, e.text_width))
        text = {k: val for k, val in hf["text_config"].items() if k not in ("model_type", "architectures")}
        text["num_hidden_layers"] = config.select_layer  # GR00T drops the layers above select_layer
        self.language_model = Qwen3ForCausalLM(Qwen3Config(**text))
        self.use_pixel_shuffle = e.use_pixel_shuffle
        self.image_token_index = e.image_token_index

    def image_features(self, pixel_values: Tensor) -> Tensor:
        """``[N, 3, S, S]`` in ``[-1, 1]`` → ``[N, image_tokens, text_width]`` (the last SigLIP layer, projected)."""
        dtype = self.vision_model.vision_model.embeddings.patch_embedding.weight.dtype
        patches = self.vision_model(pixel_values.to(dtype))
        if self.use_pixel_shuffle:
            side = math.isqrt(patches.shape[1])
            patches = pixel_shuffle(patches.reshape(patches.shape[0], side, side, -1))
            patches = patches.reshape(patches.shape[0], -1, patches.shape[-1])
        out: Tensor = self.mlp1(patches)
        return out

    def forward(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """The text model's normed last hidden state ``[B, L, text_width]``, images written into the placeholders.

        Args:
            pixel_values: ``[B * cameras, 3, S, S]`` in ``[-1, 1]``, sample-major (Eagle's order).
            input_ids: ``[B, L]`` with ``image_tokens`` placeholder ids (``image_token_index``) per camera.
            attention_mask: ``[B, L]`` 1 for real tokens.
        """
        embed = self.language_model.get_input_embeddings()
        tokens = cast(Tensor, embed(input_ids))
        features = self.image_features(pixel_values).to(tokens.dtype)
        selected = input_ids == self.image_token_index
        if int(selected.sum()) != features.shape[0] * features.shape[1]:
            raise ValueError(
                f"the prompts hold {int(selected.sum())} image placeholder tokens but the images give "
                f"{features.shape[0]} x {features.shape[1]} features"
            )
        tokens = tokens.masked_scatter(selected[..., None], features.reshape(-1, features.shape[-1]))
        out = self.language_model.model(inputs_embeds=tokens, attention_mask=attention_mask.long())
        hidden: Tensor = out.last_hidden_state
        return hidden


class EagleBackbone(nn.Module):
    """``eagle_model`` and the optional ``eagle_linear`` to ``project_to_dim``."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        self.eagle_model = EagleModel(config)
        self.eagle_linear: nn.Module = (
            nn.Linear(config.eagle.text_width, config.project_to_dim)
            if config.project_to_dim is not None
            else nn.Identity()
        )

    def forward(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        out: Tensor = self.eagle_linear(self.eagle_model(pixel_values, input_ids, attention_mask))
        return out


class FlowMatchingActionHead(nn.Module):
    """The flow-matching action head (see the module docstring); velocities in GR00T's convention."""

    def __init__(self, config: GR00TConfig) -> None:
        super().__init__()
        c = config
        self.config = config
        self.model = DiT(
            heads=c.dit_heads,
            head_dim=c.dit_head_dim,
            layers=c.dit_layers,
            output_dim=c.dit_output_dim,
            cross_attention_dim=c.backbone_embedding_dim,
            interleave_self_attention=c.interleave_self_attention,
        )
        self.state_encoder = CategorySpecificMLP(
            c.max_num_embodiments, c.max_state_dim, c.hidden_size, c.input_embedding_dim
        )
        self.action_encoder = MultiEmbodimentActionEncoder(
            c.action_dim, c.input_embedding_dim, c.max_num_embodiments
        )
        self.action_decoder = CategorySpecificMLP(
            c.max_num_embodiments, c.hidden_size, c.hidden_size, c.action_dim
        )
        self.future_tokens = nn.Embedding(c.num_target_vision_tokens, c.input_embedding_dim)
        nn.init.normal_(self.future_tokens.weight, std=0.02)
        self.vlln: nn.Module = nn.LayerNorm(c.backbone_embedding_dim) if c.use_vlln else nn.Identity()
        self.vl_self_attention: nn.Module = (
            SelfAttentionTransformer(heads=c.vl_heads, head_dim=c.vl_head_dim, layers=c.vl_layers)
            if c.use_vlln
            else nn.Identity()
        )
        self.position_embedding: nn.Embedding | None = None
        if c.add_pos_embed:
            self.position_embedding = nn.Embedding(c.max_seq_len, c.input_embedding_dim)
            nn.init.normal_(self.position_embedding.weight, std=0.02)

    def process_backbone(self, features: Tensor, mask: Tensor) -> Tensor:
        """``vlln`` and ``vl_self_attention`` of the VL tokens ``[B, S, backbone_embedding_dim]``."""
        x = self.vlln(features)
        if isinstance(self.vl_self_attention, SelfAttentionTransformer):
            x = self.vl_self_attention(x, mask)
        return cast(Tensor, x)

    def hidden(
        self, x: Tensor, steps: Tensor, vl: Tensor, vl_mask: Tensor, state: Tensor, ids: Tensor
    ) -> Tensor:
        """The DiT's output on the action tokens ``[B, action_horizon, dit_output_dim]``.

        Args:
            x: ``[B, action_horizon, action_dim]`` noisy actions (GR00T's ``τ``).
            steps: ``[B]`` integer steps ``⌊τ · num_timestep_buckets⌋``.
            vl: The processed VL tokens ``[B, S, backbone_embedding_dim]``.
            vl_mask: ``[B, S]`` bool, true for real tokens.
            state: ``[B, max_state_dim]`` normalised, padded state.
            ids: ``[B]`` embodiment ids.
        """
        dtype = self.future_tokens.weight.dtype
        state_tokens = self.state_encoder(state[:, None].to(dtype), ids)
        actions = self.action_encoder(x.to(dtype), steps, ids)
        if self.position_embedding is not None:
            actions = actions + self.position_embedding.weight[: actions.shape[1]][None]
        future = self.future_tokens.weight[None].expand(x.shape[0], -1, -1)
        tokens = torch.cat([state_tokens, future, actions], dim=1)
        out = self.model(tokens, vl.to(dtype), steps, vl_mask)
        return cast(Tensor, out[:, -x.shape[1] :])

    def decode(self, hidden: Tensor, ids: Tensor) -> Tensor:
        """:meth:`hidden` → GR00T's velocity ``[B, action_horizon, action_dim]`` (``actions - noise``)."""
        out: Tensor = self.action_decoder(hidden, ids)
        return out


class GR00TModel(nn.Module):
    """GR00T N1.5 network (see the module docstring); ``GR00TModel(GR00TConfig(...))`` builds it with random weights.

    ``embodiment_id`` picks the category-specific MLPs' weights (an index ``< max_num_embodiments``).
    """

    FSDP_FORWARD_METHODS: ClassVar[tuple[str, ...]] = (
        "encode_prefix",
        "expert_output",
        "project_velocity",
        "velocity",
        "sample_actions",
        "flow_matching_loss",
        "value",
    )
    """What the policy calls instead of ``forward``: FSDP2 gathers the network around each (``shard_module``)."""

    def __init__(self, config: GR00TConfig, *, embodiment_id: int = 0) -> None:
        super().__init__()
        if not 0 <= embodiment_id < config.max_num_embodiments:
            raise ValueError(
                f"embodiment_id {embodiment_id} must be in [0, max_num_embodiments={config.max_num_embodiments})"
            )
        self.config = config
        self.embodiment_id = embodiment_id
        self.backbone = EagleBackbone(config)
        self.action_head = FlowMatchingActionHead(config)
        self.value_head = ValueHead(config.backbone_embedding_dim, config.value_head_sizes)

    @property
    def action_in_proj(self) -> nn.Linear:
        """A linear layer of the action head (the VLA policy reads the model's device and dtype from it)."""
        return self.action_head.model.proj_out_2

    def _ids(self, batch: int, device: torch.device) -> Tensor:
        return torch.full((batch,), self.embodiment_id, dtype=torch.long, device=device)

    # --- prefix ---

    def encode_prefix(self, pixel_values: Tensor, input_ids: Tensor, attention_mask: Tensor) -> PrefixCache:
        """The processed VL tokens of a batch of observations, computed once for every denoising step.

        Args:
            pixel_values: ``[B * cameras, 3, S, S]`` in ``[-1, 1]``, sample-major.
            input_ids: ``[B, L]`` prompts with the image placeholders (see ``tokenize_prompts``).
            attention_mask: ``[B, L]`` true for real tokens (padding on the right).

        Returns:
            A :class:`~rlinf_models.pi0.PrefixCache` with no keys/values: ``hidden`` the action head's processed
            VL tokens ``[B, L, backbone_embedding_dim]``, ``pad_mask`` the real tokens.
        """
        mask = attention_mask.bool()
        features = self.backbone(pixel_values, input_ids, mask)
        hidden = self.action_head.process_backbone(features, mask)
        return PrefixCache(keys=(), values=(), pad_mask=mask, hidden=hidden)

    # --- the velocity field (openpi's time) ---

    def steps(self, t: Tensor) -> Tensor:
        """Openpi times ``t [B]`` → GR00T's integer steps ``⌊(1 - t) · buckets⌋`` (float64, robust to rounding)."""
        buckets = self.config.num_timestep_buckets
        tau = 1.0 - t.double()
        return torch.floor(tau * buckets + 1e-3).clamp(0, buckets - 1).long()

    def expert_output(self, x_t: Tensor, t: Tensor, prefix: PrefixCache, state: Tensor) -> Tensor:
        """The DiT's output on the action tokens ``[B, action_horizon, dit_output_dim]``.

        ``x_t`` is the noisy chunk ``[B, action_horizon, action_dim]`` at openpi time ``t [B]`` (``x_t`` is the
        same tensor in both conventions), ``state`` the normalised padded state ``[B, max_state_dim]``.
        """
        cfg = self.config
        if x_t.shape[1:] != (cfg.action_horizon, cfg.action_dim):
            raise ValueError(
                f"x_t must be [B, {cfg.action_horizon}, {cfg.action_dim}] (action_horizon, action_dim), "
                f"got {list(x_t.shape)}"
            )
        ids = self._ids(x_t.shape[0], x_t.device)
        return self.action_head.hidden(x_t, self.steps(t), prefix.hidden, prefix.pad_mask, state, ids)

    def project_velocity(self, expert_output: Tensor) -> Tensor:
        """:meth:`expert_output` → the float32 velocity in openpi's convention (``noise - actions``)."""
        ids = self._ids(expert_output.shape[0], expert_output.device)
        return -self.action_head.decode(expert_output, ids).float()

    def velocity(self, x_t: Tensor, t: Tensor, prefix: PrefixCache, state: Tensor) -> Tensor:
        """The flow's velocity ``v(x_t, t) ≈ noise - actions`` (float32); an Euler step is ``x_t + dt · v``, ``dt < 0``."""
        return self.project_velocity(self.expert_output(x_t, t, prefix, state))

    # --- sampling, training, value ---

    def sample_actions(
        self, prefix: PrefixCache, state: Tensor, noise: Tensor, *, num_steps: int | None = None
    ) -> Tensor:
        """GR00T's ``get_action``: Euler steps from ``noise`` (``τ = 0``) to actions; ``[B, horizon, action_dim]``."""
        steps = self.config.num_inference_timesteps if num_steps is None else num_steps
        if steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {steps}")
        x = noise.float()
        for k in range(steps):
            t = torch.full((x.shape[0],), 1.0 - k / steps, dtype=torch.float32, device=x.device)
            x = x - self.velocity(x, t, prefix, state) / steps
        return x

    def sample_time(self, batch: int) -> Tensor:
        """Training times in openpi's convention: ``1 - τ`` with GR00T's ``τ = (s - Beta(α, β)) / s``.

        Drawn on the CPU from torch's global generator, returned on the model's device (``[batch]`` float32).
        """
        cfg = self.config
        beta = torch.distributions.Beta(torch.tensor(cfg.noise_beta_alpha), torch.tensor(cfg.noise_beta_beta))
        tau = (cfg.noise_s - beta.sample((batch,))) / cfg.noise_s
        return (1.0 - tau).to(self.action_in_proj.weight.device)

    def flow_matching_loss(
        self, prefix: PrefixCache, state: Tensor | None, actions: Tensor, noise: Tensor, t: Tensor
    ) -> Tensor:
        """Per-element flow-matching loss ``[B, horizon, action_dim]``: GR00T's ``(v - (actions - noise))²``.

        ``x_t = t · noise + (1 - t) · actions`` (openpi's ``t``, GR00T's ``τ = 1 - t``).
        """
        if state is None:
            raise ValueError("GR00T's action head needs the state")
        t_ = t[:, None, None]
        x_t = t_ * noise + (1 - t_) * actions
        v = self.velocity(x_t, t, prefix, state)
        return (v - (noise - actions)).square()

    def value(self, prefix: PrefixCache) -> Tensor:
        """``[B]`` value from the mean of the processed VL tokens over the real ones."""
        mask = prefix.pad_mask[..., None].to(torch.float32)
        pooled = (prefix.hidden.float() * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
        head_dtype = next(self.value_head.parameters()).dtype
        value: Tensor = self.value_head(pooled.to(head_dtype))
        return value
