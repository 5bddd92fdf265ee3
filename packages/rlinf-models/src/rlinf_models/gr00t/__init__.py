"""GR00T N1.5 vision-language-action model (Eagle 2.5 + a flow-matching DiT action head) on transformers: ``[openpi]``.

See docs/vla.md. ``GR00TModel`` is the network (``encode_prefix`` → the VL tokens; ``velocity``;
``sample_actions``; ``flow_matching_loss``; ``value``), ``GR00TPolicy`` the RL policy over it
(``actor.model.model_type: gr00t``), ``load_gr00t`` / ``save_gr00t`` read and write the published checkpoint
layout (``config.json``, safetensors shards, ``experiment_cfg/metadata.json``), and the ``_inputs`` helpers
prepare images, normalised state/actions and prompts with image placeholders.
"""

from ._checkpoint import load_gr00t, load_gr00t_weights, read_weights, save_gr00t
from ._config import EAGLE_VARIANTS, EagleSize, GR00TConfig
from ._inputs import GR00TStats, load_metadata, normalize, preprocess_image, tokenize_prompts, unnormalize
from ._model import EagleBackbone, EagleModel, FlowMatchingActionHead, GR00TModel
from ._policy import DIT_LORA_TARGETS, EMBODIMENT_IDS, GR00TPolicy, apply_lora

__all__ = [
    "DIT_LORA_TARGETS",
    "EAGLE_VARIANTS",
    "EMBODIMENT_IDS",
    "EagleBackbone",
    "EagleModel",
    "EagleSize",
    "FlowMatchingActionHead",
    "GR00TConfig",
    "GR00TModel",
    "GR00TPolicy",
    "GR00TStats",
    "apply_lora",
    "load_gr00t",
    "load_gr00t_weights",
    "load_metadata",
    "normalize",
    "preprocess_image",
    "read_weights",
    "save_gr00t",
    "tokenize_prompts",
    "unnormalize",
]
