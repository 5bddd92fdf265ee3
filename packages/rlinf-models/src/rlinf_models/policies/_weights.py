"""``load_policy_weights``: pretrained weights into a freshly built policy (``actor.model.model_path``, DAgger's expert)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .._lora_state import LORA_BASE, has_lora_weights, merge_lora_state
from ._config import PolicyConfig

__all__ = ["LoadedWeights", "load_policy_weights", "rollout_state_dict"]


@dataclass(frozen=True)
class LoadedWeights:
    """What :func:`load_policy_weights` did.

    Attributes:
        path: the file read.
        loaded: the state-dict entries taken from the file.
        kept: the policy's entries the file lacks (they keep their fresh initialisation).
        ignored: the file's entries the policy lacks (not used).
    """

    path: Path
    loaded: tuple[str, ...]
    kept: tuple[str, ...]
    ignored: tuple[str, ...]

    def summary(self) -> str:
        """One line for the log: counts, and the modules kept fresh or ignored (by their first name component)."""
        text = f"{len(self.loaded)} tensors from {self.path}"
        if self.kept:
            text += f"; kept their fresh initialisation (not in the file): {_modules(self.kept)}"
        if self.ignored:
            text += f"; ignored (not in this policy): {_modules(self.ignored)}"
        return text


def _modules(keys: tuple[str, ...]) -> str:
    return ", ".join(dict.fromkeys(k.split(".")[0] for k in keys))


def _lora_layout(
    state: dict[str, torch.Tensor], own: dict[str, torch.Tensor], path: Path, field: str
) -> dict[str, torch.Tensor]:
    """``state`` under the policy's key layout when one side has LoRA adapters (``is_lora``) and the other not.

    Plain weights into a LoRA policy: ``P.weight`` becomes the frozen ``P.base_layer.weight`` (the adapters
    start fresh). LoRA weights into a plain policy are refused: merging them needs the run's ``lora_alpha``.
    """
    file_lora, own_lora = has_lora_weights(state), has_lora_weights(own)
    if file_lora and not own_lora:
        raise ValueError(
            f"{field}: the weights at {path} hold LoRA adapters (keys with '.base_layer.'); build the policy "
            "with actor.model.is_lora: true and the lora_rank / lora_alpha of the run that wrote them"
        )
    if not own_lora or file_lora:
        return state
    out = dict(state)
    for key in own:
        if LORA_BASE in key:
            plain = key.replace(LORA_BASE, ".")
            if plain in out and key not in out:
                out[key] = out.pop(plain)
    return out


def load_policy_weights(policy: nn.Module, path: Path, *, field: str, strict: bool) -> LoadedWeights:
    """Load a ``model.pt`` (a full state dict, as the actor workers save it) into an unsharded ``policy``.

    Args:
        policy: the freshly built policy (not yet sharded); loaded in place.
        path: the state-dict file.
        field: the config key that named the file (in the error messages).
        strict: refuse entries missing on either side (an expert must be complete); otherwise the policy's
            entries the file lacks keep their initialisation and the file's extra entries are ignored.

    Raises:
        FileNotFoundError: naming ``field`` when there is no file at ``path``.
        ValueError: naming ``field`` and the mismatched entries when shapes differ, when nothing matches, or
            (``strict``) when entries are missing on either side.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{field}: no policy weights at {path}")
    state: dict[str, torch.Tensor] = torch.load(path, map_location="cpu", weights_only=True)
    own = policy.state_dict()
    state = _lora_layout(state, own, path, field)
    mismatched = [
        f"{k} {tuple(state[k].shape)} in the file, {tuple(v.shape)} here"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    if mismatched:
        raise ValueError(
            f"{field}: the weights at {path} do not fit the configured architecture (give the model config "
            f"of the run that wrote them); parameter shapes differ: {'; '.join(mismatched)}"
        )
    loaded = tuple(k for k in own if k in state)
    kept = tuple(k for k in own if k not in state)
    ignored = tuple(k for k in state if k not in own)
    if not loaded:
        raise ValueError(
            f"{field}: none of the {len(state)} entries of {path} belongs to the configured policy "
            f"(it has {list(state)[:6]}...; the policy has {list(own)[:6]}...)"
        )
    if strict and (kept or ignored):
        raise ValueError(
            f"{field}: the weights at {path} do not fit the configured architecture: missing {list(kept)}, "
            f"unexpected {list(ignored)}"
        )
    policy.load_state_dict({k: state[k] for k in loaded}, strict=False)
    return LoadedWeights(path, loaded, kept, ignored)


def rollout_state_dict(config: PolicyConfig, state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The weights the rollout's policy loads: the actor's ``state``, LoRA adapters merged when ``is_lora``.

    Merged: ``P.weight = P.base_layer.weight + lora_scaling · B A``, the adapter entries dropped. The rollout builds its policy without adapters (:func:`build_inference_policy`), so it runs the plain model.
    """
    if not config.is_lora:
        return dict(state)
    return merge_lora_state(state, config.lora_scaling)
