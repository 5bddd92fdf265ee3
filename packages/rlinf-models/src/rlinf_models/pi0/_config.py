"""``Pi0Config``: the π0 / π0.5 architecture and its flow-matching settings; importing it does not import torch.

The defaults are the published π0 model (PaliGemma 3B: SigLIP So400m/14 + Gemma 2B, and a Gemma 300M action
expert). ``config.json`` is read and written in the layout LeRobot's ``PI0Policy.save_pretrained`` uses, so a
LeRobot checkpoint directory loads unchanged and ours loads in LeRobot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
from attrs import validators as v

from ..vla._config import lerobot_features, square_side

__all__ = ["GEMMA_VARIANTS", "GemmaSize", "Pi0Config", "SiglipSize"]

_POSITIVE = v.gt(0)
_POSITIVE_FLOAT = v.gt(0.0)


@attrs.frozen(kw_only=True)
class GemmaSize:
    """Widths of one Gemma tower (the VLM's language model or the action expert)."""

    width: int = attrs.field(validator=_POSITIVE)
    """Hidden size."""
    depth: int = attrs.field(validator=_POSITIVE)
    """Decoder layers."""
    mlp_dim: int = attrs.field(validator=_POSITIVE)
    """Hidden size of the gated MLP."""
    num_heads: int = attrs.field(validator=_POSITIVE)
    """Query heads."""
    num_kv_heads: int = attrs.field(validator=_POSITIVE)
    """Key/value heads (1: multi-query attention)."""
    head_dim: int = attrs.field(validator=_POSITIVE)
    """Width of one head."""


GEMMA_VARIANTS: Mapping[str, GemmaSize] = {
    "gemma_2b": GemmaSize(width=2048, depth=18, mlp_dim=16_384, num_heads=8, num_kv_heads=1, head_dim=256),
    "gemma_300m": GemmaSize(width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256),
}
"""The Gemma sizes the published π0 / π0.5 checkpoints name in ``paligemma_variant`` / ``action_expert_variant``."""


@attrs.frozen(kw_only=True)
class SiglipSize:
    """Widths of the SigLIP vision tower (defaults: So400m/14, as in PaliGemma)."""

    hidden_size: int = attrs.field(default=1152, validator=_POSITIVE)
    intermediate_size: int = attrs.field(default=4304, validator=_POSITIVE)
    num_layers: int = attrs.field(default=27, validator=_POSITIVE)
    num_heads: int = attrs.field(default=16, validator=_POSITIVE)
    patch_size: int = attrs.field(default=14, validator=_POSITIVE)


@attrs.frozen(kw_only=True)
class Pi0Config:
    """π0: PaliGemma (SigLIP + Gemma) over images and the instruction, a Gemma action expert over state and actions.

    ``pi05=True`` is π0.5: the state goes into the prompt as discretised tokens, the suffix holds only actions, and
    the flow time conditions the action expert through adaptive RMS norms instead of entering the action tokens.
    """

    pi05: bool = False
    """π0.5 instead of π0 (LeRobot's ``type: pi05``; openpi's ``Pi0Config(pi05=True)``)."""
    paligemma: GemmaSize = GEMMA_VARIANTS["gemma_2b"]
    """The VLM's language model."""
    action_expert: GemmaSize = GEMMA_VARIANTS["gemma_300m"]
    """The action expert. It shares the VLM's attention: same ``depth``, ``num_heads``, ``num_kv_heads`` and
    ``head_dim``; only ``width`` and ``mlp_dim`` may differ."""
    vision: SiglipSize = SiglipSize()
    """The SigLIP vision tower."""
    vocab_size: int = attrs.field(default=257_152, validator=_POSITIVE)
    """PaliGemma's vocabulary (the tokenizer's)."""
    image_size: int = attrs.field(default=224, validator=_POSITIVE)
    """Square side every camera image is resized (with padding) to."""
    chunk_size: int = attrs.field(default=50, validator=_POSITIVE)
    """Actions per chunk (openpi's ``action_horizon``)."""
    max_state_dim: int = attrs.field(default=32, validator=_POSITIVE)
    """The state is zero-padded to this width."""
    max_action_dim: int = attrs.field(default=32, validator=_POSITIVE)
    """Actions are zero-padded to this width inside the model (the velocity's last dimension)."""
    num_inference_steps: int = attrs.field(default=10, validator=_POSITIVE)
    """Euler steps of the sampler."""
    min_period: float = attrs.field(default=4e-3, validator=_POSITIVE_FLOAT)
    """Shortest period of the sinusoidal time embedding."""
    max_period: float = attrs.field(default=4.0, validator=_POSITIVE_FLOAT)
    """Longest period of the sinusoidal time embedding."""
    time_beta_alpha: float = attrs.field(default=1.5, validator=_POSITIVE_FLOAT)
    """Training time ``t = Beta(alpha, beta) * scale + offset`` (openpi)."""
    time_beta_beta: float = attrs.field(default=1.0, validator=_POSITIVE_FLOAT)
    time_scale: float = attrs.field(default=0.999, validator=_POSITIVE_FLOAT)
    time_offset: float = attrs.field(default=0.001, validator=v.ge(0.0))
    tokenizer_max_length: int = attrs.field(default=48, validator=_POSITIVE)
    """Prompt tokens (padded on the right, truncated); the published π0.5 models use 200."""
    dtype: Literal["float32", "bfloat16"] = attrs.field(
        default="float32", validator=v.in_(("float32", "bfloat16"))
    )
    """Weights of the two Gemma towers; the vision tower, the projector and the norms stay float32."""
    value_head_sizes: tuple[int, ...] = attrs.field(
        default=(1024, 512, 256), validator=v.deep_iterable(_POSITIVE)
    )
    """Hidden widths of the PPO value head on the mean of the VLM's prefix output (not in the published
    checkpoints: initialised fresh when a checkpoint has none)."""

    def __attrs_post_init__(self) -> None:
        if self.action_expert.width % 2:
            raise ValueError(
                f"action_expert.width must be even (the time embedding's sine and cosine halves): "
                f"{self.action_expert.width}"
            )
        shared = ("depth", "num_heads", "num_kv_heads", "head_dim")
        different = [f for f in shared if getattr(self.paligemma, f) != getattr(self.action_expert, f)]
        if different:
            raise ValueError(
                f"paligemma and action_expert share their attention: {different} must be equal, got "
                f"{[getattr(self.paligemma, f) for f in different]} and "
                f"{[getattr(self.action_expert, f) for f in different]}"
            )
        if self.paligemma.num_heads % self.paligemma.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.paligemma.num_heads}) must be a multiple of num_kv_heads "
                f"({self.paligemma.num_kv_heads})"
            )
        if self.image_size % self.vision.patch_size:
            raise ValueError(
                f"image_size ({self.image_size}) must be a multiple of vision.patch_size ({self.vision.patch_size})"
            )

    @property
    def image_tokens(self) -> int:
        """Prefix tokens per camera."""
        return (self.image_size // self.vision.patch_size) ** 2

    # --- config.json (LeRobot's PI0Config layout) ---

    def to_lerobot_dict(
        self, *, state_dim: int, action_dim: int, camera_names: tuple[str, ...]
    ) -> dict[str, Any]:
        """``config.json`` as LeRobot writes it for ``type: pi0`` / ``pi05``.

        Sizes that are not a published variant (tiny test models) go into an extra ``rlinf_architecture`` entry,
        which LeRobot does not know: only published sizes make a directory LeRobot can load.
        """
        features = lerobot_features(
            image_size=self.image_size, state_dim=state_dim, action_dim=action_dim, camera_names=camera_names
        )
        out: dict[str, Any] = {
            "type": "pi05" if self.pi05 else "pi0",
            "n_obs_steps": 1,
            **features,
            "paligemma_variant": _variant_name(self.paligemma, "gemma_2b"),
            "action_expert_variant": _variant_name(self.action_expert, "gemma_300m"),
            "dtype": self.dtype,
            "chunk_size": self.chunk_size,
            "n_action_steps": self.chunk_size,
            "max_state_dim": self.max_state_dim,
            "max_action_dim": self.max_action_dim,
            "num_inference_steps": self.num_inference_steps,
            "time_sampling_beta_alpha": self.time_beta_alpha,
            "time_sampling_beta_beta": self.time_beta_beta,
            "time_sampling_scale": self.time_scale,
            "time_sampling_offset": self.time_offset,
            "min_period": self.min_period,
            "max_period": self.max_period,
            "image_resolution": [self.image_size, self.image_size],
            "tokenizer_max_length": self.tokenizer_max_length,
        }
        published = (
            self.paligemma == GEMMA_VARIANTS["gemma_2b"]
            and self.action_expert in (GEMMA_VARIANTS["gemma_300m"], GEMMA_VARIANTS["gemma_2b"])
            and self.vision == SiglipSize()
            and self.vocab_size == 257_152
        )
        if not published:
            out["rlinf_architecture"] = {
                "paligemma": attrs.asdict(self.paligemma),
                "action_expert": attrs.asdict(self.action_expert),
                "vision": attrs.asdict(self.vision),
                "vocab_size": self.vocab_size,
            }
        return out

    @classmethod
    def from_lerobot_dict(cls, data: Mapping[str, Any], **overrides: Any) -> Pi0Config:
        """Read LeRobot's ``config.json`` (``type: pi0`` or ``pi05``); ``overrides`` replace fields (e.g. ``dtype``)."""
        kind = data.get("type")
        if kind not in ("pi0", "pi05"):
            raise ValueError(f"config.json 'type' must be one of ['pi0', 'pi05'], got {kind!r}")
        side = square_side(data.get("image_resolution", [224, 224]), "image_resolution")
        arch = data.get("rlinf_architecture")
        if arch is not None:
            sizes: dict[str, Any] = {
                "paligemma": GemmaSize(**arch["paligemma"]),
                "action_expert": GemmaSize(**arch["action_expert"]),
                "vision": SiglipSize(**arch["vision"]),
                "vocab_size": arch["vocab_size"],
            }
        else:
            sizes = {
                "paligemma": _variant(data, "paligemma_variant", "gemma_2b"),
                "action_expert": _variant(data, "action_expert_variant", "gemma_300m"),
            }
        fields: dict[str, Any] = {
            **sizes,
            "pi05": kind == "pi05",
            "tokenizer_max_length": 200 if kind == "pi05" else 48,
            "image_size": side,
            "dtype": data.get("dtype", "float32"),
            **{
                ours: data[theirs]
                for ours, theirs in _LEROBOT_NAMES.items()
                if theirs in data and data[theirs] is not None
            },
        }
        fields.update(overrides)
        return cls(**fields)

    @classmethod
    def from_json(cls, path: str | Path, **overrides: Any) -> Pi0Config:
        """Read a LeRobot ``config.json`` file."""
        return cls.from_lerobot_dict(json.loads(Path(path).read_text()), **overrides)


_LEROBOT_NAMES = {
    "chunk_size": "chunk_size",
    "max_state_dim": "max_state_dim",
    "max_action_dim": "max_action_dim",
    "num_inference_steps": "num_inference_steps",
    "min_period": "min_period",
    "max_period": "max_period",
    "time_beta_alpha": "time_sampling_beta_alpha",
    "time_beta_beta": "time_sampling_beta_beta",
    "time_scale": "time_sampling_scale",
    "time_offset": "time_sampling_offset",
    "tokenizer_max_length": "tokenizer_max_length",
}


def _variant(data: Mapping[str, Any], key: str, default: str) -> GemmaSize:
    name = data.get(key, default)
    if name not in GEMMA_VARIANTS:
        raise ValueError(f"config.json {key!r} must be one of {sorted(GEMMA_VARIANTS)}, got {name!r}")
    return GEMMA_VARIANTS[name]


def _variant_name(size: GemmaSize, fallback: str) -> str:
    for name, known in GEMMA_VARIANTS.items():
        if known == size:
            return name
    return fallback
