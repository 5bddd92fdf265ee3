"""``GR00TConfig``: the GR00T N1.5 architecture and its flow-matching settings; importing it does not import torch.

The defaults are the published ``nvidia/GR00T-N1.5-3B``: an Eagle 2.5 VLM (a SigLIP vision tower at 224 pixels,
one linear layer as projector, no pixel shuffle, a Qwen3-1.7B text model of which the first ``select_layer = 12``
layers are kept) and a flow-matching action head (a 16-layer DiT of width 1536 cross-attending to the VLM's
2048-wide tokens, a 4-layer self-attention transformer over those tokens, embodiment-specific MLPs for state,
actions and velocity). ``config.json`` is read and written in the layout of the published checkpoint
(``action_head_cfg``, ``backbone_cfg``, ``action_horizon``, ``action_dim``, ``model_type: gr00t_n1_5``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
from attrs import validators as v

__all__ = ["EAGLE_VARIANTS", "EagleSize", "GR00TConfig"]

_POSITIVE = v.gt(0)
_POSITIVE_FLOAT = v.gt(0.0)


@attrs.frozen(kw_only=True)
class EagleSize:
    """Sizes of the Eagle 2.5 VLM: a SigLIP vision tower, the ``mlp1`` projector and a Qwen3 text model."""

    vision_width: int = attrs.field(validator=_POSITIVE)
    vision_mlp_dim: int = attrs.field(validator=_POSITIVE)
    vision_layers: int = attrs.field(validator=_POSITIVE)
    vision_heads: int = attrs.field(validator=_POSITIVE)
    patch_size: int = attrs.field(validator=_POSITIVE)
    image_size: int = attrs.field(validator=_POSITIVE)
    """The side every camera image is resized to (Eagle's ``force_image_size``)."""
    vision_use_head: bool = True
    """SigLIP's attention-pooling head (``vision_model.head.*``): built (its weights are in the checkpoint) but
    unused, as in Eagle, which reads the patch tokens."""
    vision_layer_norm_eps: float = attrs.field(default=1e-6, validator=_POSITIVE_FLOAT)
    text_width: int = attrs.field(validator=_POSITIVE)
    text_mlp_dim: int = attrs.field(validator=_POSITIVE)
    text_layers: int = attrs.field(validator=_POSITIVE)
    """Depth of the full text model (GR00T keeps the first ``select_layer``)."""
    num_heads: int = attrs.field(validator=_POSITIVE)
    num_kv_heads: int = attrs.field(validator=_POSITIVE)
    head_dim: int = attrs.field(validator=_POSITIVE)
    vocab_size: int = attrs.field(validator=_POSITIVE)
    rms_norm_eps: float = attrs.field(default=1e-6, validator=_POSITIVE_FLOAT)
    rope_theta: float = attrs.field(default=1_000_000.0, validator=_POSITIVE_FLOAT)
    max_position_embeddings: int = attrs.field(default=40_960, validator=_POSITIVE)
    tie_word_embeddings: bool = True
    use_pixel_shuffle: bool = False
    """Eagle's pixel shuffle (``downsample_ratio`` 0.5: four patches become one token) before the projector."""
    mlp_connector_layers: int = attrs.field(default=1, validator=v.in_((1, 2)))
    """``1``: ``mlp1`` is one linear layer; ``2``: LayerNorm, linear, GELU, linear."""
    image_token_index: int = attrs.field(default=151_669, validator=v.ge(0))
    """The token id whose embeddings are replaced by the image features (``<IMG_CONTEXT>``)."""

    @property
    def image_tokens(self) -> int:
        """Tokens per camera image."""
        patches = (self.image_size // self.patch_size) ** 2
        return patches // 4 if self.use_pixel_shuffle else patches

    @property
    def projector_in(self) -> int:
        """Input width of ``mlp1``."""
        return self.vision_width * 4 if self.use_pixel_shuffle else self.vision_width

    @classmethod
    def from_hf_dict(cls, data: Mapping[str, Any]) -> EagleSize:
        """Read an Eagle 2.5 ``config.json`` dictionary (``vision_config``, ``text_config``, connector fields)."""
        vision, text = data["vision_config"], data.get("text_config") or data["llm_config"]
        heads = text["num_attention_heads"]
        return cls(
            vision_width=vision["hidden_size"],
            vision_mlp_dim=vision["intermediate_size"],
            vision_layers=vision["num_hidden_layers"],
            vision_heads=vision["num_attention_heads"],
            patch_size=vision["patch_size"],
            image_size=data.get("force_image_size") or vision["image_size"],
            vision_use_head=vision.get("vision_use_head", True),
            vision_layer_norm_eps=vision.get("layer_norm_eps", 1e-6),
            text_width=text["hidden_size"],
            text_mlp_dim=text["intermediate_size"],
            text_layers=text["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=text.get("num_key_value_heads", heads),
            head_dim=text.get("head_dim") or text["hidden_size"] // heads,
            vocab_size=text["vocab_size"],
            rms_norm_eps=text.get("rms_norm_eps", 1e-6),
            rope_theta=text.get("rope_theta", 1_000_000.0),
            max_position_embeddings=text.get("max_position_embeddings", 40_960),
            tie_word_embeddings=text.get("tie_word_embeddings", True),
            use_pixel_shuffle=data.get("use_pixel_shuffle", False),
            mlp_connector_layers=data.get("mlp_connector_layers", 1),
            image_token_index=data.get("image_token_index", 151_669),
        )

    def to_hf_dict(self) -> dict[str, Any]:
        """The Eagle 2.5 ``config.json`` fields of these sizes (a Qwen3 text model, a SigLIP vision tower)."""
        return {
            "model_type": "eagle_2_5_vl",
            "force_image_size": self.image_size,
            "use_pixel_shuffle": self.use_pixel_shuffle,
            "downsample_ratio": 0.5,
            "mlp_connector_layers": self.mlp_connector_layers,
            "image_token_index": self.image_token_index,
            "select_layer": -1,
            "vision_config": {
                "model_type": "siglip_vision_model",
                "hidden_size": self.vision_width,
                "intermediate_size": self.vision_mlp_dim,
                "num_hidden_layers": self.vision_layers,
                "num_attention_heads": self.vision_heads,
                "patch_size": self.patch_size,
                "image_size": self.image_size,
                "vision_use_head": self.vision_use_head,
                "layer_norm_eps": self.vision_layer_norm_eps,
                "hidden_act": "gelu_pytorch_tanh",
            },
            "text_config": {
                "architectures": ["Qwen3ForCausalLM"],
                "model_type": "qwen3",
                "hidden_size": self.text_width,
                "intermediate_size": self.text_mlp_dim,
                "num_hidden_layers": self.text_layers,
                "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_kv_heads,
                "head_dim": self.head_dim,
                "vocab_size": self.vocab_size,
                "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta,
                "max_position_embeddings": self.max_position_embeddings,
                "tie_word_embeddings": self.tie_word_embeddings,
                "hidden_act": "silu",
                "attention_bias": False,
            },
        }


EAGLE_N15 = "NVEagle/eagle_er-qwen3_1_7B-Siglip2_400M_stage1_5_128gpu_er_v7_1mlp_nops"

EAGLE_VARIANTS: Mapping[str, EagleSize] = {
    EAGLE_N15: EagleSize(
        vision_width=1152,
        vision_mlp_dim=4304,
        vision_layers=27,
        vision_heads=16,
        patch_size=14,
        image_size=224,
        text_width=2048,
        text_mlp_dim=6144,
        text_layers=28,
        num_heads=16,
        num_kv_heads=8,
        head_dim=128,
        vocab_size=151_936,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        use_pixel_shuffle=False,
        mlp_connector_layers=1,
    ),
}
"""The Eagle VLM the published GR00T N1.5 names in ``backbone_cfg.eagle_path`` (Qwen3-1.7B's text model, a
SigLIP-so400m/14 tower at 224 pixels, 256 tokens per image, one linear projector). Its vocabulary size (Qwen3's
151 936 here) and image token id were not read from the published Eagle files (not reachable here): put the VLM's
own ``config.json`` in a directory ``eagle_path`` next to ``config.json`` to override them; a wrong size fails the
strict load naming the tensor."""


@attrs.frozen(kw_only=True)
class GR00TConfig:
    """GR00T N1.5: Eagle's features of one LM layer condition a flow-matching DiT over a state token and actions.

    Field names follow the published ``config.json`` (``backbone_cfg`` / ``action_head_cfg``); only what changes
    the network or its inputs is kept (training switches such as ``tune_llm`` are kept for ``config.json``).
    """

    eagle: EagleSize = EAGLE_VARIANTS[EAGLE_N15]
    eagle_path: str = EAGLE_N15
    select_layer: int = attrs.field(default=12, validator=_POSITIVE)
    """Text layers kept: the features are the normed output of the ``select_layer``-th layer."""
    project_to_dim: int | None = None
    """``backbone_cfg.project_to_dim``: a linear ``eagle_linear`` from the text width (``null``: none)."""
    action_horizon: int = attrs.field(default=16, validator=_POSITIVE)
    action_dim: int = attrs.field(default=32, validator=_POSITIVE)
    """The padded action width the head predicts (``max_action_dim``)."""
    max_state_dim: int = attrs.field(default=64, validator=_POSITIVE)
    hidden_size: int = attrs.field(default=1024, validator=_POSITIVE)
    """Width of the category-specific MLPs' hidden layer and of the DiT's output."""
    input_embedding_dim: int = attrs.field(default=1536, validator=_POSITIVE)
    """Width of the state, future and action tokens (the DiT's width)."""
    backbone_embedding_dim: int = attrs.field(default=2048, validator=_POSITIVE)
    dit_heads: int = attrs.field(default=32, validator=_POSITIVE)
    dit_head_dim: int = attrs.field(default=48, validator=_POSITIVE)
    dit_layers: int = attrs.field(default=16, validator=_POSITIVE)
    dit_output_dim: int = attrs.field(default=1024, validator=_POSITIVE)
    interleave_self_attention: bool = True
    """Odd DiT blocks attend to the action-side tokens only; even ones cross-attend to the VL tokens."""
    vl_heads: int = attrs.field(default=32, validator=_POSITIVE)
    vl_head_dim: int = attrs.field(default=64, validator=_POSITIVE)
    vl_layers: int = attrs.field(default=4, validator=v.ge(0))
    num_target_vision_tokens: int = attrs.field(default=32, validator=_POSITIVE)
    """Learned ``future_tokens`` between the state token and the action tokens."""
    max_seq_len: int = attrs.field(default=1024, validator=_POSITIVE)
    max_num_embodiments: int = attrs.field(default=32, validator=_POSITIVE)
    num_inference_timesteps: int = attrs.field(default=4, validator=_POSITIVE)
    num_timestep_buckets: int = attrs.field(default=1000, validator=_POSITIVE)
    noise_beta_alpha: float = attrs.field(default=1.5, validator=_POSITIVE_FLOAT)
    noise_beta_beta: float = attrs.field(default=1.0, validator=_POSITIVE_FLOAT)
    noise_s: float = attrs.field(default=0.999, validator=_POSITIVE_FLOAT)
    add_pos_embed: bool = True
    use_vlln: bool = True
    dropout: float = attrs.field(default=0.2, validator=v.ge(0.0))
    """Kept for ``config.json``: this implementation applies no dropout (RL needs the same network at rollout
    and training time; RLinf's GR00T runs with ``disable_dropout`` too)."""
    tune_llm: bool = False
    tune_visual: bool = True
    tune_projector: bool = True
    tune_diffusion_model: bool = True
    value_head_sizes: tuple[int, ...] = attrs.field(default=(512, 256), validator=v.deep_iterable(_POSITIVE))
    """Hidden widths of the PPO value head on the mean of the processed VL tokens (ours, not in the published
    checkpoints: initialised fresh when a checkpoint has none)."""

    def __attrs_post_init__(self) -> None:
        e = self.eagle
        if e.num_heads % e.num_kv_heads:
            raise ValueError(
                f"num_heads ({e.num_heads}) must be a multiple of num_kv_heads ({e.num_kv_heads})"
            )
        if self.select_layer > e.text_layers:
            raise ValueError(
                f"backbone_cfg.select_layer ({self.select_layer}) exceeds the text model's {e.text_layers} layers"
            )
        if self.vl_width != self.backbone_embedding_dim:
            raise ValueError(
                f"action_head_cfg.backbone_embedding_dim ({self.backbone_embedding_dim}) must equal the VL "
                f"features' width ({self.vl_width}: backbone_cfg.project_to_dim, else the text width)"
            )
        if (
            self.use_vlln
            and self.vl_layers
            and self.vl_heads * self.vl_head_dim != self.backbone_embedding_dim
        ):
            raise ValueError(
                f"vl_self_attention_cfg: num_attention_heads * attention_head_dim ({self.vl_heads} * "
                f"{self.vl_head_dim}) must equal backbone_embedding_dim ({self.backbone_embedding_dim})"
            )
        if self.dit_width != self.input_embedding_dim:
            raise ValueError(
                f"diffusion_model_cfg: num_attention_heads * attention_head_dim ({self.dit_heads} * "
                f"{self.dit_head_dim}) must equal input_embedding_dim ({self.input_embedding_dim})"
            )
        if self.input_embedding_dim % 2:
            raise ValueError(
                f"input_embedding_dim must be even (sine and cosine halves), got {self.input_embedding_dim}"
            )
        if self.action_horizon > self.max_seq_len:
            raise ValueError(
                f"action_horizon ({self.action_horizon}) exceeds max_seq_len ({self.max_seq_len})"
            )

    # --- derived sizes (the VLA policy's names) ---

    @property
    def chunk_size(self) -> int:
        return self.action_horizon

    @property
    def max_action_dim(self) -> int:
        return self.action_dim

    @property
    def vl_width(self) -> int:
        """Width of the VL tokens the action head reads."""
        return self.project_to_dim if self.project_to_dim is not None else self.eagle.text_width

    @property
    def dit_width(self) -> int:
        return self.dit_heads * self.dit_head_dim

    # --- config.json (the published layout) ---

    def to_gr00t_dict(self) -> dict[str, Any]:
        """``config.json`` as the published checkpoint has it (``model_type: gr00t_n1_5``).

        An Eagle VLM that is not the one ``eagle_path`` names (tiny test models) goes into an extra
        ``rlinf_architecture`` entry.
        """
        out: dict[str, Any] = {
            "action_dim": self.action_dim,
            "action_head_cfg": {
                "action_dim": self.action_dim,
                "action_horizon": self.action_horizon,
                "add_pos_embed": self.add_pos_embed,
                "backbone_embedding_dim": self.backbone_embedding_dim,
                "diffusion_model_cfg": {
                    "attention_head_dim": self.dit_head_dim,
                    "cross_attention_dim": self.backbone_embedding_dim,
                    "dropout": self.dropout,
                    "final_dropout": True,
                    "interleave_self_attention": self.interleave_self_attention,
                    "norm_type": "ada_norm",
                    "num_attention_heads": self.dit_heads,
                    "num_layers": self.dit_layers,
                    "output_dim": self.dit_output_dim,
                    "positional_embeddings": None,
                },
                "hidden_size": self.hidden_size,
                "input_embedding_dim": self.input_embedding_dim,
                "max_action_dim": self.action_dim,
                "max_num_embodiments": self.max_num_embodiments,
                "max_seq_len": self.max_seq_len,
                "max_state_dim": self.max_state_dim,
                "model_dtype": "float32",
                "noise_beta_alpha": self.noise_beta_alpha,
                "noise_beta_beta": self.noise_beta_beta,
                "noise_s": self.noise_s,
                "num_inference_timesteps": self.num_inference_timesteps,
                "num_target_vision_tokens": self.num_target_vision_tokens,
                "num_timestep_buckets": self.num_timestep_buckets,
                "tune_diffusion_model": self.tune_diffusion_model,
                "tune_projector": self.tune_projector,
                "use_vlln": self.use_vlln,
                "vl_self_attention_cfg": {
                    "attention_head_dim": self.vl_head_dim,
                    "dropout": self.dropout,
                    "final_dropout": True,
                    "num_attention_heads": self.vl_heads,
                    "num_layers": self.vl_layers,
                    "positional_embeddings": None,
                },
            },
            "action_horizon": self.action_horizon,
            "architectures": ["GR00T_N1_5"],
            "attn_implementation": None,
            "backbone_cfg": {
                "eagle_path": self.eagle_path,
                "load_bf16": False,
                "project_to_dim": self.project_to_dim,
                "reproject_vision": False,
                "select_layer": self.select_layer,
                "tune_llm": self.tune_llm,
                "tune_visual": self.tune_visual,
                "use_flash_attention": False,
            },
            "hidden_size": self.eagle.text_width,
            "model_dtype": "float32",
            "model_type": "gr00t_n1_5",
        }
        if EAGLE_VARIANTS.get(self.eagle_path) != self.eagle:
            out["rlinf_architecture"] = {"eagle_config": self.eagle.to_hf_dict()}
        return out

    @classmethod
    def from_gr00t_dict(
        cls, data: Mapping[str, Any], *, base_dir: str | Path | None = None, **overrides: Any
    ) -> GR00TConfig:
        """Read the published ``config.json`` (``model_type: gr00t_n1_5``); ``overrides`` replace fields.

        The Eagle sizes come from, in order: an ``rlinf_architecture`` entry (ours, tiny models); a local
        directory ``backbone_cfg.eagle_path`` (absolute, or relative to ``base_dir``) holding Eagle's
        ``config.json``; the published VLM of :data:`EAGLE_VARIANTS`.

        Raises:
            ValueError: naming the field this implementation does not support.
        """
        kind = data.get("model_type")
        if kind != "gr00t_n1_5":
            raise ValueError(f"config.json 'model_type' must be 'gr00t_n1_5', got {kind!r}")
        head, backbone = data["action_head_cfg"], data["backbone_cfg"]
        dit, vl = head["diffusion_model_cfg"], head.get("vl_self_attention_cfg") or {}
        unsupported = {
            "backbone_cfg.reproject_vision": (backbone.get("reproject_vision", False), False),
            "diffusion_model_cfg.positional_embeddings": (dit.get("positional_embeddings"), None),
            "diffusion_model_cfg.norm_type": (dit.get("norm_type", "ada_norm"), "ada_norm"),
            "vl_self_attention_cfg.positional_embeddings": (vl.get("positional_embeddings"), None),
        }
        for key, (value, allowed) in unsupported.items():
            if value != allowed:
                raise ValueError(f"config.json {key} = {value!r} is not supported (only {allowed!r})")
        if dit.get("cross_attention_dim", head["backbone_embedding_dim"]) != head["backbone_embedding_dim"]:
            raise ValueError(
                "config.json diffusion_model_cfg.cross_attention_dim must equal action_head_cfg.backbone_embedding_dim"
            )
        eagle_path = backbone.get("eagle_path", EAGLE_N15)
        fields: dict[str, Any] = {
            "eagle": _eagle_size(data, eagle_path, base_dir),
            "eagle_path": eagle_path,
            "select_layer": backbone.get("select_layer", 12),
            "project_to_dim": backbone.get("project_to_dim"),
            "tune_llm": backbone.get("tune_llm", False),
            "tune_visual": backbone.get("tune_visual", True),
            "action_horizon": head.get("action_horizon", data.get("action_horizon", 16)),
            "action_dim": head.get("action_dim", data.get("action_dim", 32)),
            "dit_heads": dit.get("num_attention_heads", 32),
            "dit_head_dim": dit.get("attention_head_dim", 48),
            "dit_layers": dit.get("num_layers", 16),
            "dit_output_dim": dit.get("output_dim", 1024),
            "interleave_self_attention": dit.get("interleave_self_attention", True),
            "dropout": dit.get("dropout", 0.2),
            "vl_heads": vl.get("num_attention_heads", 32),
            "vl_head_dim": vl.get("attention_head_dim", 64),
            "vl_layers": vl.get("num_layers", 4),
            **{key: head[key] for key in _HEAD_FIELDS if head.get(key) is not None},
        }
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_json(cls, path: str | Path, **overrides: Any) -> GR00TConfig:
        """Read a ``config.json`` file (a relative ``eagle_path`` is resolved next to it)."""
        file = Path(path)
        return cls.from_gr00t_dict(json.loads(file.read_text()), base_dir=file.parent, **overrides)


_HEAD_FIELDS = (
    "max_state_dim",
    "hidden_size",
    "input_embedding_dim",
    "backbone_embedding_dim",
    "num_target_vision_tokens",
    "max_seq_len",
    "max_num_embodiments",
    "num_inference_timesteps",
    "num_timestep_buckets",
    "noise_beta_alpha",
    "noise_beta_beta",
    "noise_s",
    "add_pos_embed",
    "use_vlln",
    "tune_projector",
    "tune_diffusion_model",
)


def _eagle_size(data: Mapping[str, Any], name: str, base_dir: str | Path | None) -> EagleSize:
    arch = data.get("rlinf_architecture")
    if arch is not None:
        return EagleSize.from_hf_dict(arch["eagle_config"])
    local = Path(name) if base_dir is None else Path(base_dir) / name
    if (local / "config.json").is_file():
        return EagleSize.from_hf_dict(json.loads((local / "config.json").read_text()))
    if name in EAGLE_VARIANTS:
        return EAGLE_VARIANTS[name]
    raise ValueError(
        f"config.json 'backbone_cfg.eagle_path' {name!r} is neither a local directory with Eagle's config.json nor "
        f"one of the known VLMs {sorted(EAGLE_VARIANTS)}"
    )
