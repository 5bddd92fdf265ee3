"""Loading and saving SmolVLA checkpoint directories in LeRobot's layout (``config.json`` + ``model.safetensors``).

LeRobot's ``SmolVLAPolicy.save_pretrained`` (``lerobot/smolvla_base`` and fine-tunes of it) writes
``config.json`` (``type: smolvla``) and ``model.safetensors`` whose keys carry a ``model.`` prefix
(``SmolVLAPolicy.model``). We write the same, with the value head (ours, RL-only) in its own
``value_head.safetensors``. The key check is strict, as for π0 (:func:`rlinf_models.vla.load_lerobot_weights`):
every tensor of the model must be in the file with its shape and every tensor of the file must belong to the
model; the exceptions (a fresh value head, the VLM's output head standing in for its token embedding or the
other way round) are reported in the :class:`~rlinf_models.vla.LoadReport`.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from ..vla._checkpoint import (
    CONFIG_FILE,
    LoadReport,
    load_lerobot_weights,
    save_lerobot_checkpoint,
    stored_value_head_sizes,
)
from ._config import SmolVLAConfig
from ._model import SmolVLAModel

__all__ = ["load_smolvla", "load_smolvla_weights", "save_smolvla"]

# A tied VLM stores its output head and token embedding once: either name may stand for both.
_TIED = {
    "vlm_with_expert.vlm.lm_head.weight": "vlm_with_expert.vlm.model.text_model.embed_tokens.weight",
}


def load_smolvla_weights(model: SmolVLAModel, path: str | Path) -> LoadReport:
    """Load ``path`` (a ``model.safetensors`` file, or a directory holding one) into ``model``, strictly.

    A directory's ``value_head.safetensors``, if any, is loaded too; without it the value head keeps its fresh
    initialisation (LeRobot's checkpoints have none).

    Raises:
        CheckpointMismatchError: naming the missing keys, the unexpected keys and the shape mismatches.
    """
    return load_lerobot_weights(model, path, kind="SmolVLA", tied=_TIED)


def load_smolvla(
    path: str | Path, *, config: SmolVLAConfig | None = None, device: str | torch.device = "cpu"
) -> tuple[SmolVLAModel, LoadReport]:
    """Build the model a checkpoint directory describes and load its weights.

    Args:
        path: Directory with ``model.safetensors`` (and ``config.json`` unless ``config`` is given).
        config: Architecture to build; ``None`` reads ``config.json``.
        device: Where the model ends up.
    """
    directory = Path(path)
    if config is None:
        config_file = directory / CONFIG_FILE
        if not config_file.is_file():
            raise FileNotFoundError(f"no {CONFIG_FILE} in {directory}: pass config=SmolVLAConfig(...)")
        config = SmolVLAConfig.from_json(config_file)
        sizes = stored_value_head_sizes(directory)
        if sizes is not None:
            config = attrs.evolve(config, value_head_sizes=sizes)
    model = SmolVLAModel(config)
    report = load_smolvla_weights(model, directory)
    return model.to(device), report


def save_smolvla(
    model: SmolVLAModel,
    path: str | Path,
    *,
    state_dim: int,
    action_dim: int,
    camera_names: tuple[str, ...],
) -> None:
    """Write a checkpoint directory: LeRobot's layout plus ``value_head.safetensors``.

    ``state_dim``, ``action_dim`` and ``camera_names`` fill ``config.json``'s features (the real, unpadded sizes).
    """
    config = model.config.to_lerobot_dict(
        state_dim=state_dim, action_dim=action_dim, camera_names=camera_names
    )
    save_lerobot_checkpoint(model, path, config=config, value_head_sizes=model.config.value_head_sizes)
