"""Loading and saving π0 / π0.5 checkpoint directories (``model.safetensors`` + ``config.json``).

Two published layouts are read, both with the same tensor names:

- **LeRobot** (``lerobot/pi0_base``, ``lerobot/pi05_libero``, ...): ``config.json`` (``type: pi0``/``pi05``) and
  ``model.safetensors`` whose keys carry a ``model.`` prefix (``PI0Policy.model``);
- **openpi PyTorch** (``PI0Pytorch`` converted from JAX; what RLinf's ``model_path`` points at): a bare-keyed
  ``model.safetensors``; openpi keeps its settings in Python, so pass a :class:`Pi0Config`.

We write the LeRobot layout, with the value head (ours, RL-only) in its own ``value_head.safetensors`` so that
``model.safetensors`` stays loadable by LeRobot and openpi. The key check is strict
(:func:`rlinf_models.vla.load_lerobot_weights`): every tensor of the model must be in the file with its shape and
every tensor of the file must belong to the model, except a fresh value head and PaliGemma's tied output head,
which are reported in :class:`LoadReport`.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from ..vla._checkpoint import (
    CONFIG_FILE,
    CheckpointMismatchError,
    LoadReport,
    load_lerobot_weights,
    save_lerobot_checkpoint,
    stored_value_head_sizes,
)
from ._config import Pi0Config
from ._model import Pi0Model

__all__ = ["CheckpointMismatchError", "LoadReport", "load_pi0", "load_pi0_weights", "save_pi0"]

# PaliGemma ties its output head to its input embedding: a file may hold either name.
_TIED = {
    "paligemma_with_expert.paligemma.lm_head.weight": (
        "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    ),
}
# Published files name the SigLIP tower ``vision_tower.vision_model.*`` (transformers < 5.6); newer transformers
# builds it without the ``vision_model`` level.
_VISION_PUBLISHED = ".vision_tower.vision_model."
_VISION_FLAT = ".vision_tower."


def _flat_vision(model: Pi0Model) -> bool:
    """Whether this transformers builds the SigLIP tower without the published ``vision_model`` level."""
    return not any(_VISION_PUBLISHED in k for k in model.state_dict())


def load_pi0_weights(model: Pi0Model, path: str | Path) -> LoadReport:
    """Load ``path`` (a ``model.safetensors`` file, or a directory holding one) into ``model``, strictly.

    A directory's ``value_head.safetensors``, if any, is loaded too; without it the value head keeps its
    fresh initialisation (the published checkpoints have none).

    Raises:
        CheckpointMismatchError: naming the missing keys, the unexpected keys and the shape mismatches.
    """
    rename = (lambda k: k.replace(_VISION_PUBLISHED, _VISION_FLAT)) if _flat_vision(model) else None
    return load_lerobot_weights(model, path, kind="π0", tied=_TIED, rename=rename)


def load_pi0(
    path: str | Path, *, config: Pi0Config | None = None, device: str | torch.device = "cpu"
) -> tuple[Pi0Model, LoadReport]:
    """Build the model a checkpoint directory describes and load its weights.

    Args:
        path: Directory with ``model.safetensors`` (and ``config.json`` unless ``config`` is given).
        config: Architecture to build (needed for openpi's directories, which have no ``config.json``);
            ``None`` reads ``config.json``.
        device: Where the model ends up.
    """
    directory = Path(path)
    if config is None:
        config_file = directory / CONFIG_FILE
        if not config_file.is_file():
            raise FileNotFoundError(
                f"no {CONFIG_FILE} in {directory}: pass config=Pi0Config(...) for openpi's checkpoint layout"
            )
        config = Pi0Config.from_json(config_file)
        sizes = stored_value_head_sizes(directory)
        if sizes is not None:
            config = attrs.evolve(config, value_head_sizes=sizes)
    model = Pi0Model(config)
    # load_state_dict copies into the existing parameters, so each keeps the dtype config.dtype gave it.
    report = load_pi0_weights(model, directory)
    return model.to(device), report


def save_pi0(
    model: Pi0Model,
    path: str | Path,
    *,
    state_dim: int,
    action_dim: int,
    camera_names: tuple[str, ...],
) -> None:
    """Write a checkpoint directory: LeRobot's layout plus ``value_head.safetensors``.

    ``model.safetensors`` holds ``model.``-prefixed keys and ``config.json`` LeRobot's ``PI0Config`` fields.

    ``state_dim``, ``action_dim`` and ``camera_names`` fill ``config.json``'s features (the real, unpadded sizes).
    """
    config = model.config.to_lerobot_dict(
        state_dim=state_dim, action_dim=action_dim, camera_names=camera_names
    )
    rename = (lambda k: k.replace(_VISION_FLAT, _VISION_PUBLISHED)) if _flat_vision(model) else None
    save_lerobot_checkpoint(
        model, path, config=config, value_head_sizes=model.config.value_head_sizes, rename=rename
    )
