"""π0 / π0.5 vision-language-action models (PaliGemma + Gemma action expert) on transformers: ``[openpi]``.

See docs/vla.md. ``Pi0Model`` is the network (``encode_prefix`` → ``PrefixCache``; ``velocity``; ``sample_actions``;
``flow_matching_loss``; ``value``), ``Pi0Policy`` the RL policy over it (``actor.model.model_type: pi0``), ``load_pi0`` / ``save_pi0`` read and write LeRobot's checkpoint layout (and
read openpi's), and the ``_inputs`` helpers prepare images, normalised state/actions and instruction tokens.
"""

from ._checkpoint import CheckpointMismatchError, LoadReport, load_pi0, load_pi0_weights, save_pi0
from ._config import GEMMA_VARIANTS, GemmaSize, Pi0Config, SiglipSize
from ._inputs import (
    NormStats,
    discretize_state,
    format_prompts,
    load_lerobot_norm_stats,
    load_openpi_norm_stats,
    load_tokenizer,
    pad_last,
    preprocess_image,
    tokenize_prompts,
)
from ._model import Pi0Model, PrefixCache, attention_pattern, sinusoidal_time_embedding
from ._policy import PI0_FORWARD_INPUT_KEYS, Pi0Policy, load_norm_stats

__all__ = [
    "GEMMA_VARIANTS",
    "PI0_FORWARD_INPUT_KEYS",
    "CheckpointMismatchError",
    "GemmaSize",
    "LoadReport",
    "NormStats",
    "Pi0Config",
    "Pi0Model",
    "Pi0Policy",
    "PrefixCache",
    "SiglipSize",
    "attention_pattern",
    "discretize_state",
    "format_prompts",
    "load_lerobot_norm_stats",
    "load_norm_stats",
    "load_openpi_norm_stats",
    "load_pi0",
    "load_pi0_weights",
    "load_tokenizer",
    "pad_last",
    "preprocess_image",
    "save_pi0",
    "sinusoidal_time_embedding",
    "tokenize_prompts",
]
