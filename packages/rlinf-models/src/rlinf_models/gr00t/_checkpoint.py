"""Loading and saving GR00T N1.5 checkpoint directories in the published layout.

``nvidia/GR00T-N1.5-3B`` (and fine-tunes of it written by Isaac-GR00T's trainer) is a directory with
``config.json`` (``model_type: gr00t_n1_5``), the weights as ``model.safetensors`` or as shards listed by
``model.safetensors.index.json`` (keys ``backbone.eagle_model.*`` and ``action_head.*``, no prefix), and
``experiment_cfg/metadata.json`` (per embodiment tag: the state/action statistics and modality layout, read by
:func:`~rlinf_models.gr00t.load_metadata`). We write the same, with the value head (ours, RL-only) in its own
``value_head.safetensors``. The key check is strict (:func:`rlinf_models.vla.load_strictly`): every tensor of the
model must be in the files with its shape and every tensor of the files must belong to the model; a fresh value
head and a tied output head (the text model's ``lm_head`` standing for its token embedding, or the other way
round) are the exceptions, reported in the :class:`~rlinf_models.vla.LoadReport`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from ..vla._checkpoint import (
    CONFIG_FILE,
    VALUE_HEAD_FILE,
    WEIGHTS_FILE,
    LoadReport,
    load_strictly,
    plain_state_dict,
    stored_value_head_sizes,
)
from ._config import GR00TConfig
from ._model import GR00TModel

__all__ = ["INDEX_FILE", "METADATA_FILE", "load_gr00t", "load_gr00t_weights", "read_weights", "save_gr00t"]

INDEX_FILE = "model.safetensors.index.json"
METADATA_FILE = "experiment_cfg/metadata.json"
_VALUE_HEAD = "value_head."
_TIED = {
    "backbone.eagle_model.language_model.lm_head.weight": (
        "backbone.eagle_model.language_model.model.embed_tokens.weight"
    ),
}


def read_weights(directory: str | Path) -> dict[str, Tensor]:
    """Every tensor of a checkpoint directory: ``model.safetensors`` or the shards of its index (not the value head)."""
    root = Path(directory)
    index = root / INDEX_FILE
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        tensors: dict[str, Tensor] = {}
        for shard in shards:
            tensors.update(load_file(str(root / shard)))
        return tensors
    single = root / WEIGHTS_FILE
    if not single.is_file():
        raise FileNotFoundError(f"no {WEIGHTS_FILE} or {INDEX_FILE} in {root}")
    return load_file(str(single))


def load_gr00t_weights(model: GR00TModel, path: str | Path) -> LoadReport:
    """Load the checkpoint directory ``path`` into ``model``, strictly (see the module docstring).

    Raises:
        CheckpointMismatchError: naming the missing keys, the unexpected keys and the shape mismatches.
    """
    directory = Path(path)
    tensors = read_weights(directory)
    value_file = directory / VALUE_HEAD_FILE
    if value_file.is_file():
        tensors.update({_VALUE_HEAD + k: t for k, t in load_file(str(value_file)).items()})
    expected = model.state_dict()
    tied_from: dict[str, str] = {}
    for name, twin in [*_TIED.items(), *((b, a) for a, b in _TIED.items())]:
        if name in expected and name not in tensors and twin in tensors:
            tensors[name] = tensors[twin]
            tied_from[name] = twin
    initialised = load_strictly(model, tensors, where=str(directory), kind="GR00T N1.5")
    return LoadReport(initialised=initialised, tied_from=tied_from, prefixed=False)


def load_gr00t(
    path: str | Path,
    *,
    config: GR00TConfig | None = None,
    embodiment_id: int = 0,
    device: str | torch.device = "cpu",
) -> tuple[GR00TModel, LoadReport]:
    """Build the model a checkpoint directory describes and load its weights.

    Args:
        path: The directory (``config.json`` unless ``config`` is given, and the weights).
        config: Architecture to build; ``None`` reads ``config.json``.
        embodiment_id: Which embodiment's encoder/decoder weights the model runs with.
        device: Where the model ends up.
    """
    directory = Path(path)
    if config is None:
        config_file = directory / CONFIG_FILE
        if not config_file.is_file():
            raise FileNotFoundError(f"no {CONFIG_FILE} in {directory}: pass config=GR00TConfig(...)")
        config = GR00TConfig.from_json(config_file)
        sizes = stored_value_head_sizes(directory)
        if sizes is not None:
            config = attrs.evolve(config, value_head_sizes=sizes)
    model = GR00TModel(config, embodiment_id=embodiment_id)
    report = load_gr00t_weights(model, directory)
    return model.to(device), report


def save_gr00t(
    model: GR00TModel,
    path: str | Path,
    *,
    metadata: Mapping[str, Any] | str | Path | None = None,
    max_shard_bytes: int | None = None,
) -> None:
    """Write a checkpoint directory in the published layout plus ``value_head.safetensors``.

    Args:
        model: The network (LoRA adapters merged: :func:`~rlinf_models.vla.plain_state_dict`).
        path: The directory (created if needed).
        metadata: ``experiment_cfg/metadata.json``'s content, or a file to copy there (``None``: none written).
        max_shard_bytes: Split the weights into ``model-0000i-of-0000n.safetensors`` shards of at most this many
            bytes with an index, as the published checkpoint is (``None``: one ``model.safetensors``).
    """
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    seen: set[int] = set()
    tensors: dict[str, Tensor] = {}
    value_head: dict[str, Tensor] = {}
    for name, tensor in plain_state_dict(model).items():
        data = tensor.detach().contiguous()
        if name.startswith(_VALUE_HEAD):
            value_head[name[len(_VALUE_HEAD) :]] = data
            continue
        # safetensors refuses shared storage (a tied head): the second name gets its own copy.
        tensors[name] = data.clone() if data.data_ptr() in seen else data
        seen.add(data.data_ptr())
    if max_shard_bytes is None:
        save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    else:
        _save_shards(tensors, directory, max_shard_bytes)
    sizes = json.dumps(list(model.config.value_head_sizes))
    save_file(
        value_head, str(directory / VALUE_HEAD_FILE), metadata={"format": "pt", "value_head_sizes": sizes}
    )
    (directory / CONFIG_FILE).write_text(json.dumps(model.config.to_gr00t_dict(), indent=2) + "\n")
    if metadata is not None:
        target = directory / METADATA_FILE
        target.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(metadata, str | Path):
            shutil.copyfile(metadata, target)
        else:
            target.write_text(json.dumps(metadata, indent=2) + "\n")


def _save_shards(tensors: Mapping[str, Tensor], directory: Path, max_bytes: int) -> None:
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(directory / file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
