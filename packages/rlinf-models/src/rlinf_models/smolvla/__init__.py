"""SmolVLA vision-language-action model (SmolVLM2 + a Llama action expert) on transformers: ``[openpi]``.

See docs/vla.md. ``SmolVLAModel`` is the network (``encode_prefix`` → ``PrefixCache``; ``velocity``;
``sample_actions``; ``flow_matching_loss``; ``value``), ``SmolVLAPolicy`` the RL policy over it
(``actor.model.model_type: smolvla``), ``load_smolvla`` / ``save_smolvla`` read and write
LeRobot's checkpoint layout, and the ``_inputs`` helpers prepare images, normalised state/actions and
instruction tokens as LeRobot's SmolVLA processor does.
"""

from ._checkpoint import load_smolvla, load_smolvla_weights, save_smolvla
from ._config import VLM_VARIANTS, SmolVLAConfig, SmolVLMSize
from ._inputs import normalize, preprocess_image, tokenize_prompts, unnormalize
from ._model import SmolVLAModel, SmolVLMWithExpert, apply_rope
from ._policy import SmolVLAPolicy, apply_lora

__all__ = [
    "VLM_VARIANTS",
    "SmolVLAConfig",
    "SmolVLAModel",
    "SmolVLAPolicy",
    "SmolVLMSize",
    "SmolVLMWithExpert",
    "apply_lora",
    "apply_rope",
    "load_smolvla",
    "load_smolvla_weights",
    "normalize",
    "preprocess_image",
    "save_smolvla",
    "tokenize_prompts",
    "unnormalize",
]
