"""OpenVLA (Prismatic DINOv2+SigLIP backbone, projector, Llama-2) with RLinf's log-probabilities: ``[openpi]``.

See docs/vla.md. :class:`OpenVLAModel` holds the published tensor names (``vision_backbone.*``, ``projector.*``,
``language_model.*``), decodes action tokens with their log-probabilities (:meth:`~OpenVLAModel.sample_actions`)
and recomputes them teacher-forced (:meth:`~OpenVLAModel.evaluate_actions`); :func:`load_openvla` /
:func:`save_openvla` read and write the Hugging Face checkpoint layout of ``openvla/openvla-7b``;
:class:`OpenVLAPolicy` is the embodied PPO/GRPO policy over it (``actor.model.model_type: openvla``).
OpenVLA-OFT (:mod:`._oft`) reuses all of it: :class:`OpenVLAOFTModel` decodes a chunk of action tokens in one
bidirectional pass and carries OFT's L1 regression head and proprio projector (:func:`load_openvla_oft`), and
:class:`OpenVLAOFTPolicy` is ``actor.model.model_type: openvla_oft``.
"""

from ._actions import ActionTokenizer, normalize_actions, unnormalize_actions
from ._checkpoint import (
    OpenVLALoadReport,
    build_empty,
    load_openvla,
    load_openvla_weights,
    read_weights,
    save_openvla,
)
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
from ._oft import (
    OFT_PLATFORMS,
    OFT_STOP_TOKEN_ID,
    L1RegressionActionHead,
    MLPResNet,
    OFTPlatform,
    OpenVLAOFTModel,
    ProprioProjector,
    load_openvla_oft,
    oft_side_files,
    save_openvla_oft,
)
from ._oft_policy import OPENVLA_OFT_FORWARD_INPUT_KEYS, OpenVLAOFTPolicy
from ._policy import OPENVLA_FORWARD_INPUT_KEYS, OPENVLA_VALUE_HEAD_SIZES, OpenVLAPolicy, check_openvla_env
from ._vision import PrismaticProjector, PrismaticVisionBackbone, TimmViT

__all__ = [
    "IMAGENET_MEAN_STD",
    "LLAMA_EMPTY_TOKEN_ID",
    "OFT_PLATFORMS",
    "OFT_STOP_TOKEN_ID",
    "OPENVLA_7B_TEXT_CONFIG",
    "OPENVLA_FORWARD_INPUT_KEYS",
    "OPENVLA_OFT_FORWARD_INPUT_KEYS",
    "OPENVLA_VALUE_HEAD_SIZES",
    "SIGLIP_MEAN_STD",
    "TIMM_VIT_SPECS",
    "VISION_BACKBONES",
    "ActionSample",
    "ActionTokenizer",
    "L1RegressionActionHead",
    "MLPResNet",
    "OFTPlatform",
    "OpenVLAConfig",
    "OpenVLALoadReport",
    "OpenVLAModel",
    "OpenVLAOFTModel",
    "OpenVLAOFTPolicy",
    "OpenVLAPolicy",
    "PrismaticProjector",
    "PrismaticVisionBackbone",
    "ProprioProjector",
    "TimmViT",
    "ValueHead",
    "ViTSpec",
    "action_stats",
    "apply_lora",
    "build_empty",
    "check_openvla_env",
    "format_prompt",
    "llama_config",
    "load_openvla",
    "load_openvla_oft",
    "load_openvla_weights",
    "normalize_actions",
    "oft_side_files",
    "pad_prompts",
    "preprocess_images",
    "read_weights",
    "reduce_log_probs",
    "save_openvla",
    "save_openvla_oft",
    "unnormalize_actions",
]
