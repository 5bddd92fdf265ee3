"""OpenVLA (Prismatic DINOv2+SigLIP backbone, projector, Llama-2) with RLinf's log-probabilities: ``[openpi]``.

See docs/vla.md. :class:`OpenVLAModel` holds the published tensor names (``vision_backbone.*``, ``projector.*``,
``language_model.*``), decodes action tokens with their log-probabilities (:meth:`~OpenVLAModel.sample_actions`)
and recomputes them teacher-forced (:meth:`~OpenVLAModel.evaluate_actions`); :func:`load_openvla` /
:func:`save_openvla` read and write the Hugging Face checkpoint layout of ``openvla/openvla-7b``;
:class:`OpenVLAPolicy` is the embodied PPO/GRPO policy over it (``actor.model.model_type: openvla``).
"""

from ._actions import ActionTokenizer, normalize_actions, unnormalize_actions
from ._checkpoint import OpenVLALoadReport, load_openvla, load_openvla_weights, read_weights, save_openvla
from ._config import (
    OPENVLA_7B_TEXT_CONFIG,
    TIMM_VIT_SPECS,
    VISION_BACKBONES,
    OpenVLAConfig,
    ViTSpec,
    action_stats,
)
from ._inputs import (
    IMAGENET_MEAN_STD,
    LLAMA_EMPTY_TOKEN_ID,
    SIGLIP_MEAN_STD,
    format_prompt,
    pad_prompts,
    preprocess_images,
)
from ._lora import apply_lora
from ._model import ActionSample, OpenVLAModel, ValueHead, llama_config, reduce_log_probs
from ._policy import OPENVLA_FORWARD_INPUT_KEYS, OPENVLA_VALUE_HEAD_SIZES, OpenVLAPolicy, check_openvla_env
from ._vision import PrismaticProjector, PrismaticVisionBackbone, TimmViT

__all__ = [
    "IMAGENET_MEAN_STD",
    "LLAMA_EMPTY_TOKEN_ID",
    "OPENVLA_7B_TEXT_CONFIG",
    "OPENVLA_FORWARD_INPUT_KEYS",
    "OPENVLA_VALUE_HEAD_SIZES",
    "SIGLIP_MEAN_STD",
    "TIMM_VIT_SPECS",
    "VISION_BACKBONES",
    "ActionSample",
    "ActionTokenizer",
    "OpenVLAConfig",
    "OpenVLALoadReport",
    "OpenVLAModel",
    "OpenVLAPolicy",
    "PrismaticProjector",
    "PrismaticVisionBackbone",
    "TimmViT",
    "ValueHead",
    "ViTSpec",
    "action_stats",
    "apply_lora",
    "check_openvla_env",
    "format_prompt",
    "llama_config",
    "load_openvla",
    "load_openvla_weights",
    "normalize_actions",
    "pad_prompts",
    "preprocess_images",
    "read_weights",
    "reduce_log_probs",
    "save_openvla",
    "unnormalize_actions",
]
