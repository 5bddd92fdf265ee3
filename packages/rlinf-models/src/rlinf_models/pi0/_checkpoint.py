"""Loading and saving π0 / π0.5 checkpoint directories (``model.safetensors`` + ``config.json``).

Two published layouts are read, both with the same tensor names:

- **LeRobot** (``lerobot/pi0_base``, ``lerobot/pi05_libero``, ...): ``config.json`` (``type: pi0``/``pi05``) and
  ``model.safetensors`` whose keys carry a ``model.`` prefix (``PI0Policy.model``);
- **openpi PyTorch** (``PI0Pytorch`` converted from JAX; what RLinf's ``model_path`` points at): a bare-keyed
  ``model.safetensors``; openpi keeps its settings in Python, so pass a :class:`Pi0Config`.

We write the LeRobot layout, with the value head (ours, RL-only) in its own ``value_head.safetensors`` so that
``model.safetensors`` stays loadable by LeRobot and openpi. The key check is strict: every tensor of the model must be in the file with its
shape and every tensor of the file must belong to the model, except for the two exceptions below, which are
reported in :class:`LoadReport`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import attrs
import torch
from torch import Tensor

try:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f'rlinf_models.pi0 needs safetensors ({e}): pip install "rlinf-models[openpi]"') from e

from ._config import Pi0Config
from ._model import Pi0Model

__all__ = ["CheckpointMismatchError", "LoadReport", "load_pi0", "load_pi0_weights", "save_pi0"]

WEIGHTS_FILE = "model.safetensors"
VALUE_HEAD_FILE = "value_head.safetensors"
CONFIG_FILE = "config.json"
_VALUE_HEAD = "value_head."
_LEROBOT_PREFIX = "model."
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

_LISTED = 20


class CheckpointMismatchError(ValueError):
    """The checkpoint's tensors do not match the model's (names and shapes are in the message)."""


@attrs.frozen
class LoadReport:
    """What :func:`load_pi0_weights` did besides loading matching tensors.

    Attributes:
        initialised: Model tensors the file does not have and that may be fresh (the value head).
        tied_from: Tied tensors filled from their twin, ``{missing name: name read}``.
        prefixed: Whether the file used LeRobot's ``model.`` prefix.
    """

    initialised: tuple[str, ...]
    tied_from: Mapping[str, str]
    prefixed: bool


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f", ... ({len(names) - _LISTED} more)" if len(names) > _LISTED else "")


def load_pi0_weights(model: Pi0Model, path: str | Path) -> LoadReport:
    """Load ``path`` (a ``model.safetensors`` file, or a directory holding one) into ``model``, strictly.

    A directory's ``value_head.safetensors``, if any, is loaded too; without it the value head keeps its
    fresh initialisation (the published checkpoints have none).

    Raises:
        CheckpointMismatchError: naming the missing keys, the unexpected keys and the shape mismatches.
    """
    file = Path(path)
    value_file = file / VALUE_HEAD_FILE
    if file.is_dir():
        file = file / WEIGHTS_FILE
    if not file.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} at {file}")
    tensors = load_file(str(file))
    prefixed = bool(tensors) and all(k.startswith(_LEROBOT_PREFIX) for k in tensors)
    if prefixed:
        tensors = {k[len(_LEROBOT_PREFIX) :]: t for k, t in tensors.items()}
    if value_file.is_file():
        tensors.update({_VALUE_HEAD + k: t for k, t in load_file(str(value_file)).items()})
    expected = model.state_dict()
    if not any(_VISION_PUBLISHED in k for k in expected):
        tensors = {k.replace(_VISION_PUBLISHED, _VISION_FLAT): t for k, t in tensors.items()}
    tied_from: dict[str, str] = {}
    for name, twin in [*_TIED.items(), *((b, a) for a, b in _TIED.items())]:
        if name in expected and name not in tensors and twin in tensors:
            tensors[name] = tensors[twin]
            tied_from[name] = twin
    missing = [k for k in expected if k not in tensors]
    initialised = tuple(k for k in missing if k.startswith(_VALUE_HEAD))
    missing = [k for k in missing if k not in initialised]
    unexpected = sorted(k for k in tensors if k not in expected)
    shapes = [
        f"{k}: file {list(tensors[k].shape)} vs model {list(t.shape)}"
        for k, t in expected.items()
        if k in tensors and tensors[k].shape != t.shape
    ]
    if missing or unexpected or shapes:
        raise CheckpointMismatchError(
            f"{file} does not match the π0 model built from its config: "
            f"{len(missing)} missing [{_listing(missing)}]; {len(unexpected)} unexpected [{_listing(unexpected)}]; "
            f"{len(shapes)} shape mismatches [{_listing(shapes)}]"
        )
    model.load_state_dict({k: v for k, v in tensors.items() if k in expected}, strict=False)
    return LoadReport(initialised=initialised, tied_from=tied_from, prefixed=prefixed)


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
        value_file = directory / VALUE_HEAD_FILE
        if value_file.is_file():
            with safe_open(str(value_file), "pt") as f:
                sizes = json.loads((f.metadata() or {}).get("value_head_sizes", "null"))
            if sizes is not None:
                config = attrs.evolve(config, value_head_sizes=tuple(sizes))
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
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    tensors: dict[str, Tensor] = {}
    value_head: dict[str, Tensor] = {}
    state = model.state_dict()
    flat = not any(_VISION_PUBLISHED in k for k in state)
    for name, tensor in state.items():
        if name.startswith(_VALUE_HEAD):
            value_head[name[len(_VALUE_HEAD) :]] = tensor.detach().contiguous()
            continue
        if flat:
            name = name.replace(_VISION_FLAT, _VISION_PUBLISHED)
        # safetensors refuses shared storage (the tied PaliGemma head): the second name gets its own copy.
        data = tensor.detach().contiguous()
        tensors[_LEROBOT_PREFIX + name] = data.clone() if data.data_ptr() in seen else data
        seen.add(data.data_ptr())
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    sizes = json.dumps(list(model.config.value_head_sizes))
    save_file(
        value_head, str(directory / VALUE_HEAD_FILE), metadata={"format": "pt", "value_head_sizes": sizes}
    )
    config = model.config.to_lerobot_dict(
        state_dim=state_dim, action_dim=action_dim, camera_names=camera_names
    )
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=4) + "\n")
