"""What the vision-language-action flow models (π0 / π0.5, SmolVLA) share: ``[openpi]``.

:class:`VLAFlowPolicy` is the RL policy over a VLA flow model (sampling the Flow-SDE / Flow-Noise chain,
log-probabilities of stored chains, values, the SFT flow-matching loss); :func:`check_vla_env` the checks of
the env against ``actor.model`` and the checkpoint; :func:`inject_lora` the LoRA adapters on the towers;
:func:`load_lerobot_weights` / :func:`save_lerobot_checkpoint` the strict reading and the writing of LeRobot's
checkpoint layout (plus our value head); :meth:`VLAFlowPolicy.save_pretrained` exports a policy (after SFT) in
that layout with its tokenizer and statistics. :mod:`rlinf_models.pi0` and :mod:`rlinf_models.smolvla` fill in the
model-specific parts.
"""

from ._checkpoint import (
    CheckpointMismatchError,
    LoadReport,
    load_lerobot_weights,
    plain_state_dict,
    save_lerobot_checkpoint,
    stored_value_head_sizes,
)
from ._policy import (
    TASK_INDEX_KEY,
    VLACondition,
    VLAFlowPolicy,
    VLAModel,
    VLAModelConfig,
    check_vla_env,
    inject_lora,
)

__all__ = [
    "TASK_INDEX_KEY",
    "CheckpointMismatchError",
    "LoadReport",
    "VLACondition",
    "VLAFlowPolicy",
    "VLAModel",
    "VLAModelConfig",
    "check_vla_env",
    "inject_lora",
    "load_lerobot_weights",
    "plain_state_dict",
    "save_lerobot_checkpoint",
    "stored_value_head_sizes",
]
