"""Loading and saving OpenVLA checkpoint directories in the Hugging Face layout of ``openvla/openvla-7b``.

The published directory holds ``config.json`` (:class:`OpenVLAConfig`'s fields), sharded safetensors
(``model-0000k-of-0000n.safetensors``) listed in ``model.safetensors.index.json`` (or one ``model.safetensors``),
with bare keys (``vision_backbone.*``, ``projector.*``, ``language_model.*``), and for fine-tunes a
``dataset_statistics.json``. Loading is strict: a tensor of the model that no file has, a file tensor the model
lacks, or a shape mismatch raises :class:`~rlinf_models.vla.CheckpointMismatchError` naming them; the value head
(ours, RL-only, in ``value_head.safetensors``) may be absent and then starts fresh.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

import attrs
import torch
from torch import Tensor

from ..vla._checkpoint import VALUE_HEAD_FILE, load_strictly, plain_state_dict, stored_value_head_sizes

try:
    from safetensors.torch import load_file, save_file
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.openvla needs safetensors and transformers ({e}): pip install "rlinf-models[openpi]"'
    ) from e

from ._config import OpenVLAConfig
from ._model import OpenVLAModel, ValueHead

__all__ = [
    "OpenVLALoadReport",
    "build_empty",
    "load_openvla",
    "load_openvla_weights",
    "read_weights",
    "save_openvla",
]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
_VALUE_HEAD = "value_head."
_M = TypeVar("_M", bound=OpenVLAModel)


@attrs.frozen
class OpenVLALoadReport:
    """What :func:`load_openvla_weights` did besides loading matching tensors.

    Attributes:
        files: The safetensors files read.
        initialised: Model tensors left fresh (the value head when the directory has none).
    """

    files: tuple[str, ...]
    initialised: tuple[str, ...]


def read_weights(directory: str | Path) -> tuple[dict[str, Tensor], tuple[str, ...]]:
    """Every tensor of a checkpoint directory (the shards its index lists, or ``model.safetensors``)."""
    root = Path(directory)
    if (root / INDEX_FILE).is_file():
        weight_map: dict[str, str] = json.loads((root / INDEX_FILE).read_text())["weight_map"]
        files = tuple(sorted(set(weight_map.values())))
    elif (root / SINGLE_FILE).is_file():
        files = (SINGLE_FILE,)
    else:
        raise FileNotFoundError(f"no {INDEX_FILE} or {SINGLE_FILE} in {root}")
    tensors: dict[str, Tensor] = {}
    for name in files:
        tensors.update(load_file(str(root / name)))
    return tensors, files


def load_openvla_weights(
    model: OpenVLAModel, directory: str | Path, *, extra: Mapping[str, Tensor] | None = None
) -> OpenVLALoadReport:
    """Load a checkpoint directory into ``model``, strictly (see the module docstring).

    ``extra``: tensors kept outside the safetensors (OpenVLA-OFT's action head and proprio projector files),
    under the model's names; they take part in the strict check like the others.

    Raises:
        CheckpointMismatchError: naming the missing keys, the unexpected keys and the shape mismatches.
    """
    root = Path(directory)
    tensors, files = read_weights(root)
    tensors.update(extra or {})
    if (root / VALUE_HEAD_FILE).is_file() and model.value_head is not None:
        tensors.update({_VALUE_HEAD + k: t for k, t in load_file(str(root / VALUE_HEAD_FILE)).items()})
    initialised = load_strictly(model, tensors, where=str(root), kind="OpenVLA")
    return OpenVLALoadReport(files=files, initialised=initialised)


def load_openvla(
    directory: str | Path,
    *,
    value_head_sizes: tuple[int, ...] | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[OpenVLAModel, OpenVLALoadReport]:
    """Build the model ``config.json`` describes and load the directory's weights.

    Args:
        directory: The checkpoint directory.
        value_head_sizes: A value head's hidden widths; ``None``: those of the directory's value head, if any.
        dtype: The parameters' dtype once loaded (the published weights are bfloat16).
        device: Where the model ends up.
    """
    root = Path(directory)
    config = OpenVLAConfig.from_json(root / "config.json")
    sizes = value_head_sizes if value_head_sizes is not None else stored_value_head_sizes(root)
    model = build_empty(lambda: OpenVLAModel(config, value_head_sizes=sizes), sizes)
    report = load_openvla_weights(model, root)
    return model.to(device=device, dtype=dtype), report


def build_empty(factory: Callable[[], _M], value_head_sizes: tuple[int, ...] | None) -> _M:
    """``factory()``'s model built on the meta device and given uninitialised CPU storage (to be loaded into).

    What a checkpoint does not hold is rebuilt off the meta device: the rotary frequencies (a non-persistent
    buffer) and a value head that may start fresh.
    """
    with torch.device("meta"):
        model = factory()
    model = model.to_empty(device="cpu")
    model.language_model.model.rotary_emb = LlamaRotaryEmbedding(config=model.language_model.config)
    if model.value_head is not None:
        model.value_head = ValueHead(model.language_model.config.hidden_size, value_head_sizes or ())
    return model


def save_openvla(model: OpenVLAModel, directory: str | Path, *, max_shard_bytes: int = 5 * 2**30) -> None:
    """Write ``config.json``, sharded safetensors with their index, and ``value_head.safetensors`` (if any).

    LoRA adapters are merged into the weights they wrap (:func:`~rlinf_models.vla.plain_state_dict`).
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, Tensor]] = [{}]
    size = 0
    value_head: dict[str, Tensor] = {}
    for name, tensor in plain_state_dict(model).items():
        if name.split(".", 1)[0] in model.side_modules:
            continue  # written by their own model's saver (OpenVLA-OFT's head files)
        data = tensor.detach().contiguous().clone()
        if name.startswith(_VALUE_HEAD):
            value_head[name[len(_VALUE_HEAD) :]] = data
            continue
        nbytes = data.numel() * data.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = data
        size += nbytes
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards, start=1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(root / name), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, name))
    total = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (root / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    if model.value_head is not None:
        sizes = [m.out_features for m in model.value_head.mlp if isinstance(m, torch.nn.Linear)][:-1]
        save_file(
            value_head,
            str(root / VALUE_HEAD_FILE),
            metadata={"format": "pt", "value_head_sizes": json.dumps(sizes)},
        )
    (root / "config.json").write_text(json.dumps(model.config.to_dict(), indent=2) + "\n")
