"""``SmolVLAConfig``: the SmolVLA architecture and its flow-matching settings; importing it does not import torch.

The defaults are the published ``lerobot/smolvla_base``: SmolVLM2-500M-Video-Instruct truncated to its first 16
text layers, and an action expert of 0.75 its width with one layer beside each VLM layer, cross-attention to the
VLM's keys and values in every other layer. ``config.json`` is read and written in the layout LeRobot's
``SmolVLAPolicy.save_pretrained`` uses (``type: smolvla``), so a LeRobot checkpoint directory loads unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import validators as v

from ..vla._config import lerobot_features, square_side

__all__ = ["VLM_VARIANTS", "SmolVLAConfig", "SmolVLMSize"]

_POSITIVE = v.gt(0)
_POSITIVE_FLOAT = v.gt(0.0)


@attrs.frozen(kw_only=True)
class SmolVLMSize:
    """Widths of the VLM: a Llama text model and SmolVLM's vision tower with its pixel-shuffle connector."""

    text_width: int = attrs.field(validator=_POSITIVE)
    text_mlp_dim: int = attrs.field(validator=_POSITIVE)
    text_layers: int = attrs.field(validator=_POSITIVE)
    """Depth of the full text model (SmolVLA keeps the first ``num_vlm_layers``)."""
    num_heads: int = attrs.field(validator=_POSITIVE)
    num_kv_heads: int = attrs.field(validator=_POSITIVE)
    head_dim: int = attrs.field(validator=_POSITIVE)
    vocab_size: int = attrs.field(validator=_POSITIVE)
    rms_norm_eps: float = attrs.field(validator=_POSITIVE_FLOAT)
    vision_width: int = attrs.field(validator=_POSITIVE)
    vision_mlp_dim: int = attrs.field(validator=_POSITIVE)
    vision_layers: int = attrs.field(validator=_POSITIVE)
    vision_heads: int = attrs.field(validator=_POSITIVE)
    patch_size: int = attrs.field(validator=_POSITIVE)
    vision_image_size: int = attrs.field(validator=_POSITIVE)
    """The vision tower's native side (its position embeddings cover ``(side / patch_size)²`` patches)."""
    scale_factor: int = attrs.field(validator=_POSITIVE)
    """Pixel-shuffle factor of the connector: ``scale_factor²`` patches become one image token."""

    @classmethod
    def from_hf_dict(cls, data: Mapping[str, Any]) -> SmolVLMSize:
        """Read a transformers ``SmolVLMConfig`` dictionary (the VLM's ``config.json``)."""
        text, vision = data["text_config"], data["vision_config"]
        heads = text["num_attention_heads"]
        return cls(
            text_width=text["hidden_size"],
            text_mlp_dim=text["intermediate_size"],
            text_layers=text["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=text.get("num_key_value_heads", heads),
            head_dim=text.get("head_dim") or text["hidden_size"] // heads,
            vocab_size=text["vocab_size"],
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            vision_width=vision["hidden_size"],
            vision_mlp_dim=vision["intermediate_size"],
            vision_layers=vision["num_hidden_layers"],
            vision_heads=vision["num_attention_heads"],
            patch_size=vision["patch_size"],
            vision_image_size=vision["image_size"],
            scale_factor=data.get("scale_factor", 2),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The transformers ``SmolVLMConfig`` keyword arguments of these sizes (Llama text model, no tied head)."""
        return {
            "text_config": {
                "model_type": "llama",
                "hidden_size": self.text_width,
                "intermediate_size": self.text_mlp_dim,
                "num_hidden_layers": self.text_layers,
                "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_kv_heads,
                "head_dim": self.head_dim,
                "vocab_size": self.vocab_size,
                "rms_norm_eps": self.rms_norm_eps,
                "hidden_act": "silu",
                "attention_bias": False,
                "mlp_bias": False,
                "tie_word_embeddings": False,
            },
            "vision_config": {
                "hidden_size": self.vision_width,
                "intermediate_size": self.vision_mlp_dim,
                "num_hidden_layers": self.vision_layers,
                "num_attention_heads": self.vision_heads,
                "patch_size": self.patch_size,
                "image_size": self.vision_image_size,
            },
            "scale_factor": self.scale_factor,
            "tie_word_embeddings": False,
        }


SMOLVLM2_500M = "HuggingFaceTB/SmolVLM2-500M-Video-Instruct"

VLM_VARIANTS: Mapping[str, SmolVLMSize] = {
    SMOLVLM2_500M: SmolVLMSize(
        text_width=960,
        text_mlp_dim=2560,
        text_layers=32,
        num_heads=15,
        num_kv_heads=5,
        head_dim=64,
        vocab_size=49_280,
        rms_norm_eps=1e-5,
        vision_width=768,
        vision_mlp_dim=3072,
        vision_layers=12,
        vision_heads=12,
        patch_size=16,
        vision_image_size=512,
        scale_factor=4,
    ),
}
"""The VLMs the published SmolVLA checkpoints name in ``vlm_model_name`` (SmolVLM2-500M: SmolLM2-360M's Llama
text model and a SigLIP-B/16 vision tower at 512 pixels, 64 image tokens per camera)."""


def expert_mlp_dim(width: int) -> int:
    """LeRobot's action-expert MLP width: ``4 · ⌊2·width/3⌋`` rounded up to a multiple of 256."""
    hidden = 4 * int(2 * width / 3)
    return 256 * ((hidden + 255) // 256)


@attrs.frozen(kw_only=True)
class SmolVLAConfig:
    """SmolVLA: a truncated SmolVLM over images, instruction and state; a narrower Llama action expert over actions.

    Fields named as in LeRobot's ``SmolVLAConfig`` keep its meaning; only the values that change the network or
    its inputs are kept (training presets, RTC and aloha adaptations are not).
    """

    vlm: SmolVLMSize = VLM_VARIANTS[SMOLVLM2_500M]
    """The VLM's sizes (``vlm_model_name``'s config)."""
    vlm_model_name: str = SMOLVLM2_500M
    """LeRobot's ``vlm_model_name``: where the VLM and its tokenizer come from."""
    num_vlm_layers: int = 16
    """The first ``num_vlm_layers`` text layers are kept (``<= 0``: all)."""
    num_expert_layers: int = -1
    """Action-expert layers (``<= 0``: one per kept VLM layer); must divide the VLM's: expert layer ``j`` runs
    beside VLM layer ``j · num_vlm_layers / num_expert_layers`` and the other VLM layers have no expert layer."""
    self_attn_every_n_layers: int = 2
    """VLM layers ``0, n, 2n, ...`` are joint self-attention layers (the expert's tokens attend to the prefix and
    the earlier action tokens); the others cross-attention layers (the expert attends to the VLM's keys and
    values, projected by its own ``k_proj`` / ``v_proj``). ``<= 0``: every layer cross-attends."""
    expert_width_multiplier: float = attrs.field(default=0.75, validator=_POSITIVE_FLOAT)
    """The expert's width relative to the VLM's text width."""
    chunk_size: int = attrs.field(default=50, validator=_POSITIVE)
    max_state_dim: int = attrs.field(default=32, validator=_POSITIVE)
    max_action_dim: int = attrs.field(default=32, validator=_POSITIVE)
    image_size: int = attrs.field(default=512, validator=_POSITIVE)
    """LeRobot's square ``resize_imgs_with_padding``: the side every camera is resized (and padded) to."""
    tokenizer_max_length: int = attrs.field(default=48, validator=_POSITIVE)
    num_steps: int = attrs.field(default=10, validator=_POSITIVE)
    """Euler steps of the sampler."""
    min_period: float = attrs.field(default=4e-3, validator=_POSITIVE_FLOAT)
    max_period: float = attrs.field(default=4.0, validator=_POSITIVE_FLOAT)
    prefix_length: int = -1
    """LeRobot pads the prefix with padding tokens up to this length; padding changes no output, so it is only
    kept for ``config.json``."""
    pad_language_to: str = attrs.field(default="longest", validator=v.in_(("longest", "max_length")))
    """Kept for ``config.json``; prompts here are always padded to ``tokenizer_max_length`` (padding changes no
    output)."""
    value_head_sizes: tuple[int, ...] = attrs.field(default=(512, 256), validator=v.deep_iterable(_POSITIVE))
    """Hidden widths of the PPO value head on the mean of the VLM's prefix output (ours, not in LeRobot's
    checkpoints: initialised fresh when a checkpoint has none)."""

    def __attrs_post_init__(self) -> None:
        if self.vlm.num_heads % self.vlm.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.vlm.num_heads}) must be a multiple of num_kv_heads ({self.vlm.num_kv_heads})"
            )
        if self.vlm_layers > self.vlm.text_layers:
            raise ValueError(
                f"num_vlm_layers ({self.num_vlm_layers}) exceeds the VLM's {self.vlm.text_layers} text layers"
            )
        if self.vlm_layers % self.expert_layers:
            raise ValueError(
                f"num_expert_layers ({self.expert_layers}) must divide the VLM's {self.vlm_layers} layers"
            )
        if self.expert_width % 2:
            raise ValueError(
                f"the expert width must be even (sine and cosine halves), got {self.expert_width}"
            )
        if self.vlm.vision_image_size % (self.vlm.patch_size * self.vlm.scale_factor):
            raise ValueError(
                f"the vision tower's image_size ({self.vlm.vision_image_size}) must be a multiple of "
                f"patch_size * scale_factor ({self.vlm.patch_size} * {self.vlm.scale_factor})"
            )
        for layer in range(self.expert_layers):
            # LeRobot shapes an expert layer's k/v projections by the expert index and runs it by the VLM index.
            if self.is_cross_expert_layer(layer) != self.is_cross_layer(layer * self.layer_stride):
                raise ValueError(
                    f"expert layer {layer} is built for "
                    f"{'cross' if self.is_cross_expert_layer(layer) else 'self'}-attention but runs beside VLM "
                    f"layer {layer * self.layer_stride}, which is not: choose self_attn_every_n_layers "
                    f"({self.self_attn_every_n_layers}) and num_expert_layers ({self.num_expert_layers}) that agree "
                    "(LeRobot cannot run this combination either)"
                )

    # --- derived sizes ---

    @property
    def vlm_layers(self) -> int:
        """Text layers kept."""
        return self.num_vlm_layers if self.num_vlm_layers > 0 else self.vlm.text_layers

    @property
    def expert_layers(self) -> int:
        return self.num_expert_layers if self.num_expert_layers > 0 else self.vlm_layers

    @property
    def layer_stride(self) -> int:
        """VLM layers per expert layer."""
        return self.vlm_layers // self.expert_layers

    @property
    def expert_width(self) -> int:
        return int(self.vlm.text_width * self.expert_width_multiplier)

    @property
    def expert_mlp_dim(self) -> int:
        return expert_mlp_dim(self.expert_width)

    @property
    def image_tokens(self) -> int:
        """Prefix tokens per camera."""
        patches = (self.image_size // self.vlm.patch_size) ** 2
        return patches // self.vlm.scale_factor**2

    def is_cross_layer(self, vlm_layer: int) -> bool:
        """Whether the expert cross-attends at VLM layer ``vlm_layer`` (else joint self-attention)."""
        n = self.self_attn_every_n_layers
        return not (n > 0 and vlm_layer % n == 0)

    def is_cross_expert_layer(self, expert_layer: int) -> bool:
        """Whether expert layer ``expert_layer``'s k/v projections read the VLM's keys/values (LeRobot's rule)."""
        return self.is_cross_layer(expert_layer)

    # --- config.json (LeRobot's SmolVLAConfig layout) ---

    def to_lerobot_dict(
        self, *, state_dim: int, action_dim: int, camera_names: tuple[str, ...]
    ) -> dict[str, Any]:
        """``config.json`` as LeRobot writes it for ``type: smolvla``.

        A VLM that is not the one ``vlm_model_name`` names (tiny test models) goes into an extra
        ``rlinf_architecture`` entry, which LeRobot does not know.
        """
        features = lerobot_features(
            image_size=self.image_size, state_dim=state_dim, action_dim=action_dim, camera_names=camera_names
        )
        out: dict[str, Any] = {
            "type": "smolvla",
            "n_obs_steps": 1,
            **features,
            "chunk_size": self.chunk_size,
            "n_action_steps": self.chunk_size,
            "normalization_mapping": {"VISUAL": "IDENTITY", "STATE": "MEAN_STD", "ACTION": "MEAN_STD"},
            "max_state_dim": self.max_state_dim,
            "max_action_dim": self.max_action_dim,
            "resize_imgs_with_padding": [self.image_size, self.image_size],
            "empty_cameras": 0,
            "adapt_to_pi_aloha": False,
            "use_delta_joint_actions_aloha": False,
            "tokenizer_max_length": self.tokenizer_max_length,
            "num_steps": self.num_steps,
            "use_cache": True,
            "vlm_model_name": self.vlm_model_name,
            "load_vlm_weights": True,
            "add_image_special_tokens": False,
            "attention_mode": "cross_attn",
            "prefix_length": self.prefix_length,
            "pad_language_to": self.pad_language_to,
            "num_expert_layers": self.num_expert_layers,
            "num_vlm_layers": self.num_vlm_layers,
            "self_attn_every_n_layers": self.self_attn_every_n_layers,
            "expert_width_multiplier": self.expert_width_multiplier,
            "min_period": self.min_period,
            "max_period": self.max_period,
        }
        if VLM_VARIANTS.get(self.vlm_model_name) != self.vlm:
            hf = self.vlm.to_hf_dict()
            out["rlinf_architecture"] = {"vlm_config": {**hf, "model_type": "smolvlm"}}
        return out

    @classmethod
    def from_lerobot_dict(
        cls, data: Mapping[str, Any], *, base_dir: str | Path | None = None, **overrides: Any
    ) -> SmolVLAConfig:
        """Read LeRobot's ``config.json`` (``type: smolvla``); ``overrides`` replace fields.

        The VLM's sizes come from, in order: an ``rlinf_architecture`` entry (ours, tiny models); a local
        directory ``vlm_model_name`` (absolute, or relative to ``base_dir``) holding the VLM's ``config.json``;
        the published VLMs of :data:`VLM_VARIANTS`.

        Raises:
            ValueError: naming the field LeRobot's config has that this implementation does not support.
        """
        kind = data.get("type")
        if kind != "smolvla":
            raise ValueError(f"config.json 'type' must be 'smolvla', got {kind!r}")
        unsupported = {
            "attention_mode": ("cross_attn",),
            "add_image_special_tokens": (False,),
            "adapt_to_pi_aloha": (False,),
            "empty_cameras": (0,),
        }
        for key, allowed in unsupported.items():
            if key in data and data[key] not in allowed:
                raise ValueError(
                    f"config.json {key!r} = {data[key]!r} is not supported (only {allowed[0]!r})"
                )
        side = square_side(data.get("resize_imgs_with_padding") or [512, 512], "resize_imgs_with_padding")
        name = data.get("vlm_model_name", SMOLVLM2_500M)
        fields: dict[str, Any] = {
            "vlm": _vlm_size(data, name, base_dir),
            "vlm_model_name": name,
            "image_size": side,
            **{key: data[key] for key in _LEROBOT_FIELDS if data.get(key) is not None},
        }
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_json(cls, path: str | Path, **overrides: Any) -> SmolVLAConfig:
        """Read a LeRobot ``config.json`` file (a relative ``vlm_model_name`` is resolved next to it)."""
        file = Path(path)
        return cls.from_lerobot_dict(json.loads(file.read_text()), base_dir=file.parent, **overrides)


_LEROBOT_FIELDS = (
    "num_vlm_layers",
    "num_expert_layers",
    "self_attn_every_n_layers",
    "expert_width_multiplier",
    "chunk_size",
    "max_state_dim",
    "max_action_dim",
    "tokenizer_max_length",
    "num_steps",
    "min_period",
    "max_period",
    "prefix_length",
    "pad_language_to",
)


def _vlm_size(data: Mapping[str, Any], name: str, base_dir: str | Path | None) -> SmolVLMSize:
    arch = data.get("rlinf_architecture")
    if arch is not None:
        return SmolVLMSize.from_hf_dict(arch["vlm_config"])
    local = Path(name) if base_dir is None else Path(base_dir) / name
    if (local / "config.json").is_file():
        return SmolVLMSize.from_hf_dict(json.loads((local / "config.json").read_text()))
    if name in VLM_VARIANTS:
        return VLM_VARIANTS[name]
    raise ValueError(
        f"config.json 'vlm_model_name' {name!r} is neither a local directory with the VLM's config.json nor one "
        f"of the known VLMs {sorted(VLM_VARIANTS)}"
    )
