"""``OpenVLAConfig``: the fields of OpenVLA's ``config.json`` (``model_type: openvla``); importing it imports no torch.

OpenVLA's Hugging Face port (``prismatic/extern/hf/configuration_prismatic.py`` in openvla/openvla) names its
towers by id: ``vision_backbone_id`` selects timm ViTs (``timm_model_ids``) and their input sizes
(``image_sizes``), ``llm_backbone_id`` a Llama-family LM whose sizes are ``text_config`` over ``LlamaConfig``'s
defaults (Llama-2 7B). The published ``openvla/openvla-7b`` is ``dinosiglip-vit-so-224px`` (DINOv2 ViT-L/14
with 4 registers + SigLIP So400m/14, both at 224 px) and ``llama2-7b-pure`` with ``vocab_size`` 32064
(32000 padded to a multiple of 64). The ViT sizes live in timm's model constructors, so they are listed here in
:data:`TIMM_VIT_SPECS`; tiny test models record theirs in an extra ``rlinf_architecture`` entry.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import validators as v

__all__ = [
    "OPENVLA_7B_TEXT_CONFIG",
    "TIMM_VIT_SPECS",
    "VISION_BACKBONES",
    "OpenVLAConfig",
    "ViTSpec",
    "action_stats",
]

_POSITIVE = v.gt(0)


@attrs.frozen(kw_only=True)
class ViTSpec:
    """One timm ``VisionTransformer`` as the Prismatic featurizers build it (``num_classes=0``)."""

    embed_dim: int = attrs.field(validator=_POSITIVE)
    depth: int = attrs.field(validator=v.ge(2))
    """Blocks; the featurizer returns the output of the second-to-last one."""
    num_heads: int = attrs.field(validator=_POSITIVE)
    mlp_hidden: int = attrs.field(validator=_POSITIVE)
    """``int(embed_dim * mlp_ratio)`` (SigLIP So400m: 4304)."""
    patch_size: int = attrs.field(default=14, validator=_POSITIVE)
    class_token: bool = True
    reg_tokens: int = attrs.field(default=0, validator=v.ge(0))
    no_embed_class: bool = False
    """Position embeddings cover the patches only (DINOv2 with registers)."""
    layer_scale: bool = False
    """``ls1`` / ``ls2`` in each block (DINOv2), stored as ``scale_factor`` by OpenVLA's LayerScale patch."""
    attn_pool: bool = False
    """timm's ``global_pool='map'`` head (``attn_pool.*``, SigLIP): in the checkpoint, unused by the featurizer."""


TIMM_VIT_SPECS: Mapping[str, ViTSpec] = {
    "vit_large_patch14_reg4_dinov2.lvd142m": ViTSpec(
        embed_dim=1024,
        depth=24,
        num_heads=16,
        mlp_hidden=4096,
        reg_tokens=4,
        no_embed_class=True,
        layer_scale=True,
    ),
    "vit_so400m_patch14_siglip_224": ViTSpec(
        embed_dim=1152, depth=27, num_heads=16, mlp_hidden=4304, class_token=False, attn_pool=True
    ),
    "vit_so400m_patch14_siglip_384": ViTSpec(
        embed_dim=1152, depth=27, num_heads=16, mlp_hidden=4304, class_token=False, attn_pool=True
    ),
}
"""Sizes of the timm models the DINOv2/SigLIP backbones name (timm 0.9.16's ``vision_transformer.py``)."""

VISION_BACKBONES: Mapping[str, tuple[tuple[str, ...], tuple[int, ...]]] = {
    "dinov2-vit-l": (("vit_large_patch14_reg4_dinov2.lvd142m",), (224,)),
    "siglip-vit-so400m": (("vit_so400m_patch14_siglip_224",), (224,)),
    "siglip-vit-so400m-384px": (("vit_so400m_patch14_siglip_384",), (384,)),
    "dinosiglip-vit-so-224px": (
        ("vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"),
        (224, 224),
    ),
    "dinosiglip-vit-so-384px": (
        ("vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_384"),
        (384, 384),
    ),
}
"""``vision_backbone_id`` → (timm ids, image sizes), as configuration_prismatic.py maps them (the CLIP and
IN1k backbones are not supported: no published OpenVLA uses them)."""

_LLM_HF_PATHS: Mapping[str, str] = {
    "llama2-7b-pure": "meta-llama/Llama-2-7b-hf",
    "llama2-13b-pure": "meta-llama/Llama-2-13b-hf",
    "llama2-7b-chat": "meta-llama/Llama-2-7b-chat-hf",
    "llama2-13b-chat": "meta-llama/Llama-2-13b-chat-hf",
    "vicuna-v15-7b": "lmsys/vicuna-7b-v1.5",
    "vicuna-v15-13b": "lmsys/vicuna-13b-v1.5",
}
"""The Llama-family ``llm_backbone_id`` values (Mistral and Phi backbones are not supported)."""

OPENVLA_7B_TEXT_CONFIG: Mapping[str, Any] = {
    "model_type": "llama",
    "pad_token_id": 32000,
    "torch_dtype": "bfloat16",
    "vocab_size": 32064,
}
"""``text_config`` of ``openvla/openvla-7b``: Llama-2 7B is ``LlamaConfig``'s defaults plus these."""


def _check_id(table: Mapping[str, Any], what: str) -> Any:
    def check(_: Any, attribute: attrs.Attribute[Any], value: str) -> None:
        if value not in table:
            raise ValueError(f"{what} must be one of {sorted(table)}, got {value!r}")

    return check


@attrs.frozen(kw_only=True)
class OpenVLAConfig:
    """OpenVLA's ``config.json`` (``OpenVLAConfig`` of the HF port), plus tiny-model sizes where not published."""

    vision_backbone_id: str = attrs.field(
        default="dinosiglip-vit-so-224px", validator=_check_id(VISION_BACKBONES, "vision_backbone_id")
    )
    llm_backbone_id: str = attrs.field(
        default="llama2-7b-pure", validator=_check_id(_LLM_HF_PATHS, "llm_backbone_id")
    )
    arch_specifier: str = "no-align+fused-gelu-mlp"
    image_resize_strategy: str = "resize-naive"
    llm_max_length: int = 2048
    pad_token_id: int = 32000
    pad_to_multiple_of: int = attrs.field(default=64, validator=v.ge(0))
    """The LM's vocabulary was padded by this many rows: the tokenizer's vocabulary is the rest."""
    n_action_bins: int = attrs.field(default=256, validator=v.ge(2))
    norm_stats: Mapping[str, Any] = attrs.field(factory=dict)
    """``{dataset: {"action": {"q01", "q99", "mask", ...}, "proprio": ...}}`` (the un-normalisation keys)."""
    text_config: Mapping[str, Any] = attrs.field(factory=lambda: dict(OPENVLA_7B_TEXT_CONFIG))
    """``LlamaConfig`` keyword arguments over its defaults (Llama-2 7B)."""
    towers: tuple[ViTSpec, ...] | None = None
    """ViT sizes; ``None``: those of the timm ids (the published sizes)."""

    @property
    def timm_model_ids(self) -> tuple[str, ...]:
        return VISION_BACKBONES[self.vision_backbone_id][0]

    @property
    def image_sizes(self) -> tuple[int, ...]:
        return VISION_BACKBONES[self.vision_backbone_id][1]

    @property
    def use_fused_vision_backbone(self) -> bool:
        return len(self.timm_model_ids) == 2

    @property
    def vit_specs(self) -> tuple[ViTSpec, ...]:
        if self.towers is not None:
            if len(self.towers) != len(self.timm_model_ids):
                raise ValueError(
                    f"{self.vision_backbone_id} has {len(self.timm_model_ids)} towers, got {self.towers}"
                )
            return self.towers
        return tuple(TIMM_VIT_SPECS[name] for name in self.timm_model_ids)

    @property
    def vocab_size(self) -> int:
        """The LM's vocabulary (rows of the token embedding)."""
        return int(self.text_config.get("vocab_size", 32000))

    @property
    def tokenizer_vocab_size(self) -> int:
        """The tokenizer's vocabulary: the action tokens are its last ``n_action_bins`` ids."""
        return self.vocab_size - self.pad_to_multiple_of

    def to_dict(self) -> dict[str, Any]:
        """``config.json`` as the HF port writes it (``trust_remote_code`` loads it in transformers)."""
        out: dict[str, Any] = {
            "architectures": ["OpenVLAForActionPrediction"],
            "auto_map": {
                "AutoConfig": "configuration_prismatic.OpenVLAConfig",
                "AutoModelForVision2Seq": "modeling_prismatic.OpenVLAForActionPrediction",
            },
            "model_type": "openvla",
            "vision_backbone_id": self.vision_backbone_id,
            "llm_backbone_id": self.llm_backbone_id,
            "arch_specifier": self.arch_specifier,
            "use_fused_vision_backbone": self.use_fused_vision_backbone,
            "image_resize_strategy": self.image_resize_strategy,
            "image_sizes": list(self.image_sizes),
            "timm_model_ids": list(self.timm_model_ids),
            "timm_override_act_layers": [None] * len(self.timm_model_ids),
            "hf_llm_id": _LLM_HF_PATHS[self.llm_backbone_id],
            "llm_max_length": self.llm_max_length,
            "pad_token_id": self.pad_token_id,
            "pad_to_multiple_of": self.pad_to_multiple_of,
            "n_action_bins": self.n_action_bins,
            "norm_stats": dict(self.norm_stats),
            "output_projector_states": False,
            "text_config": dict(self.text_config),
            "torch_dtype": "bfloat16",
        }
        if self.towers is not None:
            out["rlinf_architecture"] = {"towers": [attrs.asdict(t) for t in self.towers]}
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpenVLAConfig:
        """Read ``config.json``'s fields (``model_type: openvla``); the derived ones must agree with the ids."""
        if data.get("model_type") != "openvla":
            raise ValueError(f"config.json 'model_type' must be 'openvla', got {data.get('model_type')!r}")
        config = cls(
            vision_backbone_id=data["vision_backbone_id"],
            llm_backbone_id=data["llm_backbone_id"],
            arch_specifier=data.get("arch_specifier", "no-align+fused-gelu-mlp"),
            image_resize_strategy=data.get("image_resize_strategy", "resize-naive"),
            llm_max_length=data.get("llm_max_length", 2048),
            pad_token_id=data.get("pad_token_id", 32000),
            pad_to_multiple_of=data.get("pad_to_multiple_of", 64),
            n_action_bins=data.get("n_action_bins", 256),
            norm_stats=data.get("norm_stats") or {},
            text_config=data.get("text_config") or {},
            towers=(
                tuple(ViTSpec(**t) for t in data["rlinf_architecture"]["towers"])
                if "rlinf_architecture" in data
                else None
            ),
        )
        for field, derived in (
            ("image_sizes", list(config.image_sizes)),
            ("timm_model_ids", list(config.timm_model_ids)),
            ("use_fused_vision_backbone", config.use_fused_vision_backbone),
        ):
            if field in data and data[field] != derived:
                raise ValueError(
                    f"config.json {field} {data[field]!r} disagrees with {config.vision_backbone_id}"
                )
        if any(data.get("timm_override_act_layers") or []):
            raise ValueError(f"timm_override_act_layers {data['timm_override_act_layers']} are not supported")
        return config

    @classmethod
    def from_json(cls, path: str | Path) -> OpenVLAConfig:
        """Read a ``config.json``; a ``dataset_statistics.json`` beside it (fine-tunes) adds to ``norm_stats``."""
        file = Path(path)
        data = json.loads(file.read_text())
        stats_file = file.parent / "dataset_statistics.json"
        if stats_file.is_file():
            data["norm_stats"] = {**(data.get("norm_stats") or {}), **json.loads(stats_file.read_text())}
        return cls.from_dict(data)


def action_stats(config: OpenVLAConfig, unnorm_key: str | None = None) -> Mapping[str, Any]:
    """The ``action`` statistics of one dataset of ``norm_stats`` (``None``: the only one).

    Raises:
        ValueError: listing the datasets when the key is missing or ambiguous.
    """
    names = sorted(config.norm_stats)
    if unnorm_key is None:
        if len(names) != 1:
            raise ValueError(f"the checkpoint has statistics of {names}: pass unnorm_key=one of them")
        unnorm_key = names[0]
    if unnorm_key not in config.norm_stats:
        raise ValueError(f"unnorm_key {unnorm_key!r} is not in the checkpoint's norm_stats {names}")
    stats: Mapping[str, Any] = config.norm_stats[unnorm_key]["action"]
    return stats
