"""Loading and saving SmolVLA checkpoint directories in LeRobot's layout (``config.json`` + ``model.safetensors``).

LeRobot's ``SmolVLAPolicy.save_pretrained`` (``lerobot/smolvla_base`` and fine-tunes of it) writes
``config.json`` (``type: smolvla``) and ``model.safetensors`` whose keys carry a ``model.`` prefix
(``SmolVLAPolicy.model``). We write the same, with the value head (ours, RL-only) in its own
``value_head.safetensors``. The key check is strict, as for π0: every tensor of the model must be in the file
with its shape and every tensor of the file must belong to the model; the exceptions (a fresh value head, the
VLM's output head standing in for its token embedding or the other way round) are reported in the
:class:`~rlinf_models.pi0.LoadReport`.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import torch
from torch import Tensor

try:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.smolvla needs safetensors ({e}): pip install "rlinf-models[openpi]"'
    ) from e

from ..pi0._checkpoint import CheckpointMismatchError, LoadReport
from ._config import SmolVLAConfig
from ._model import SmolVLAModel

__all__ = ["load_smolvla", "load_smolvla_weights", "save_smolvla"]

WEIGHTS_FILE = "model.safetensors"
VALUE_HEAD_FILE = "value_head.safetensors"
CONFIG_FILE = "config.json"
_VALUE_HEAD = "value_head."
_LEROBOT_PREFIX = "model."
# A tied VLM stores its output head and token embedding once: either name may stand for both.
_TIED = {
    "vlm_with_expert.vlm.lm_head.weight": "vlm_with_expert.vlm.model.text_model.embed_tokens.weight",
}
_LISTED = 20


def _listing(names: list[str]) -> str:
    shown = ", ".join(names[:_LISTED])
    return shown + (f", ... ({len(names) - _LISTED} more)" if len(names) > _LISTED else "")


def load_smolvla_weights(model: SmolVLAModel, path: str | Path) -> LoadReport:
    """Load ``path`` (a ``model.safetensors`` file, or a directory holding one) into ``model``, strictly.

    A directory's ``value_head.safetensors``, if any, is loaded too; without it the value head keeps its fresh
    initialisation (LeRobot's checkpoints have none).

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
            f"{file} does not match the SmolVLA model built from its config: "
            f"{len(missing)} missing [{_listing(missing)}]; {len(unexpected)} unexpected [{_listing(unexpected)}]; "
            f"{len(shapes)} shape mismatches [{_listing(shapes)}]"
        )
    model.load_state_dict({k: v for k, v in tensors.items() if k in expected}, strict=False)
    return LoadReport(initialised=initialised, tied_from=tied_from, prefixed=prefixed)


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
        value_file = directory / VALUE_HEAD_FILE
        if value_file.is_file():
            with safe_open(str(value_file), "pt") as f:
                sizes = json.loads((f.metadata() or {}).get("value_head_sizes", "null"))
            if sizes is not None:
                config = attrs.evolve(config, value_head_sizes=tuple(sizes))
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
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    tensors: dict[str, Tensor] = {}
    value_head: dict[str, Tensor] = {}
    for name, tensor in model.state_dict().items():
        data = tensor.detach().contiguous()
        if name.startswith(_VALUE_HEAD):
            value_head[name[len(_VALUE_HEAD) :]] = data
            continue
        # safetensors refuses shared storage (a tied head): the second name gets its own copy.
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
