"""Strict loading and saving of VLA checkpoint directories in LeRobot's layout, whatever the model (π0, SmolVLA).

LeRobot's ``save_pretrained`` writes ``config.json`` and ``model.safetensors`` whose keys carry a ``model.``
prefix (the policy's ``model`` attribute). We write the same, with the value head (ours, RL-only) in its own
``value_head.safetensors`` (its hidden widths in the file's metadata) so that ``model.safetensors`` stays
loadable by LeRobot. The key check is strict: every tensor of the model must be in the file with its shape and
every tensor of the file must belong to the model, except a fresh value head and tied tensors filled from their
twin, both reported in :class:`LoadReport`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from torch import Tensor, nn

from .._lora_state import ADAPTER, has_lora_weights, merge_lora_state

try:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(f'rlinf_models.vla needs safetensors ({e}): pip install "rlinf-models[openpi]"') from e

__all__ = [
    "CONFIG_FILE",
    "VALUE_HEAD_FILE",
    "WEIGHTS_FILE",
    "CheckpointMismatchError",
    "LoadReport",
    "load_lerobot_weights",
    "plain_state_dict",
    "save_lerobot_checkpoint",
    "stored_value_head_sizes",
]

WEIGHTS_FILE = "model.safetensors"
VALUE_HEAD_FILE = "value_head.safetensors"
CONFIG_FILE = "config.json"
_VALUE_HEAD = "value_head."
_LEROBOT_PREFIX = "model."
_LISTED = 20


class CheckpointMismatchError(ValueError):
    """The checkpoint's tensors do not match the model's (names and shapes are in the message)."""


@attrs.frozen
class LoadReport:
    """What a strict load (``load_pi0_weights``, ``load_smolvla_weights``) did besides loading matching tensors.

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


def load_lerobot_weights(
    model: nn.Module,
    path: str | Path,
    *,
    kind: str,
    tied: Mapping[str, str],
    rename: Callable[[str], str] | None = None,
) -> LoadReport:
    """Load ``path`` (a ``model.safetensors`` file, or a directory holding one) into ``model``, strictly.

    A directory's ``value_head.safetensors``, if any, is loaded too; without it the value head keeps its fresh
    initialisation (the published checkpoints have none).

    Args:
        model: The network built from the checkpoint's config.
        path: The file or its directory.
        kind: The model's name in the error message (``"π0"``, ``"SmolVLA"``).
        tied: Tensors stored once for two names (an output head tied to the token embedding): either name may
            stand for the other.
        rename: Maps the file's names (unprefixed) to the model's, where the two differ.

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
    if rename is not None:
        tensors = {rename(k): t for k, t in tensors.items()}
    expected = model.state_dict()
    tied_from: dict[str, str] = {}
    for name, twin in [*tied.items(), *((b, a) for a, b in tied.items())]:
        if name in expected and name not in tensors and twin in tensors:
            tensors[name] = tensors[twin]
            tied_from[name] = twin
    initialised = load_strictly(model, tensors, where=str(file), kind=kind)
    return LoadReport(initialised=initialised, tied_from=tied_from, prefixed=prefixed)


def load_strictly(
    model: nn.Module, tensors: Mapping[str, Tensor], *, where: str, kind: str
) -> tuple[str, ...]:
    """Load ``tensors`` into ``model``: every tensor of the model must be there with its shape, and nothing else.

    Only the value head (``value_head.*``, ours, RL-only) may be missing: it keeps its fresh initialisation.

    Args:
        model: the model built from the checkpoint's config.
        tensors: the file's tensors under the model's names.
        where: the file or directory, for the message.
        kind: the model's name, for the message (``π0``, ``SmolVLA``, ``OpenVLA``).

    Returns:
        The value-head tensors left at their initialisation.

    Raises:
        CheckpointMismatchError: naming the missing and unexpected tensors and the shape mismatches.
    """
    expected = model.state_dict()
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
            f"{where} does not match the {kind} model built from its config: "
            f"{len(missing)} missing [{_listing(missing)}]; {len(unexpected)} unexpected [{_listing(unexpected)}]; "
            f"{len(shapes)} shape mismatches [{_listing(shapes)}]"
        )
    model.load_state_dict({k: v for k, v in tensors.items() if k in expected}, strict=False)
    return initialised


def plain_state_dict(model: nn.Module) -> dict[str, Tensor]:
    """``model``'s state dict as the plain network's: peft LoRA adapters merged (``W + scaling · B A``).

    Without adapters, the state dict itself. With them (``actor.model.is_lora``), each wrapped layer's merged
    weight under the layer's own name, the ``lora_A`` / ``lora_B`` entries dropped: what the published layout
    holds and the adapter's loader reads into a model without adapters. ``model`` is not changed.

    Raises:
        ValueError: when the adapters of ``model`` do not share one scaling (``lora_alpha / lora_rank``).
    """
    state = model.state_dict()
    if not has_lora_weights(state):
        return dict(state)
    found = (getattr(module, "scaling", None) for module in model.modules())
    scalings = {float(s[ADAPTER]) for s in found if isinstance(s, dict) and ADAPTER in s}
    if len(scalings) != 1:
        raise ValueError(f"the LoRA adapters of the model have scalings {sorted(scalings)}: expected one")
    return merge_lora_state(state, scalings.pop())


def stored_value_head_sizes(directory: str | Path) -> tuple[int, ...] | None:
    """The value head's hidden widths a directory's ``value_head.safetensors`` records (``None``: no such file)."""
    value_file = Path(directory) / VALUE_HEAD_FILE
    if not value_file.is_file():
        return None
    with safe_open(str(value_file), "pt") as f:
        sizes = json.loads((f.metadata() or {}).get("value_head_sizes", "null"))
    return None if sizes is None else tuple(sizes)


def save_lerobot_checkpoint(
    model: nn.Module,
    path: str | Path,
    *,
    config: Mapping[str, Any],
    value_head_sizes: Sequence[int],
    rename: Callable[[str], str] | None = None,
) -> None:
    """Write a checkpoint directory: LeRobot's layout plus ``value_head.safetensors``.

    Args:
        model: The network; its value head's tensors go to ``value_head.safetensors``, the others, with a
            ``model.`` prefix, to ``model.safetensors`` (LoRA adapters merged: :func:`plain_state_dict`).
        path: The directory (created if needed).
        config: ``config.json``'s content (LeRobot's config fields of the model).
        value_head_sizes: The value head's hidden widths, kept in its file's metadata.
        rename: Maps the model's names to the published ones, where the two differ.
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
        if rename is not None:
            name = rename(name)
        # safetensors refuses shared storage (a tied head): the second name gets its own copy.
        tensors[_LEROBOT_PREFIX + name] = data.clone() if data.data_ptr() in seen else data
        seen.add(data.data_ptr())
    save_file(tensors, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    sizes = json.dumps(list(value_head_sizes))
    save_file(
        value_head, str(directory / VALUE_HEAD_FILE), metadata={"format": "pt", "value_head_sizes": sizes}
    )
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=4) + "\n")
