"""``load_policy_weights``: pretrained weights into a freshly built policy (``actor.model.model_path``, DAgger's expert)."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .._lora_state import LORA_BASE, has_lora_weights, merge_lora_state
from ._config import PolicyConfig

__all__ = [
    "LoadedWeights",
    "load_policy_weights",
    "load_rollout_weights",
    "rollout_state_dict",
    "trainable_names",
]


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


def _submodule_layout(
    state: dict[str, torch.Tensor], own: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """``state`` under the policy's key layout when the policy holds the file's model as a submodule.

    SAC-Flow's actor (:class:`~rlinf_models.policies.FlowSACPolicy`) wraps the flow policy as ``flow``: a flow
    policy's checkpoint (SFT, or a PPO run) keyed ``velocity_body.0.weight`` loads as ``flow.velocity_body...``.
    Applies only when no key of the file matches as it is; the first submodule name under which some do is used.
    """
    if any(k in own for k in state):
        return state
    for prefix in dict.fromkeys(k.split(".", 1)[0] for k in own if "." in k):
        moved = {f"{prefix}.{k}": v for k, v in state.items()}
        if any(k in own for k in moved):
            return moved
    return state


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
    state = _submodule_layout(_lora_layout(state, own, path, field), own)
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


def trainable_names(policy: nn.Module) -> frozenset[str]:
    """The state-dict names of ``policy``'s parameters that train (``requires_grad``).

    With ``is_lora``: the adapters' ``lora_A`` / ``lora_B`` weights and the modules that train fully (projections,
    value and noise heads); what ``lora_sync: adapters`` sends. The names are the same after FSDP2's
    ``fully_shard``.
    """
    return frozenset(name for name, param in policy.named_parameters() if param.requires_grad)


def rollout_state_dict(
    config: PolicyConfig, state: Mapping[str, torch.Tensor], *, trainable: Collection[str] | None = None
) -> dict[str, torch.Tensor]:
    """The weights the rollout's policy loads (:func:`load_rollout_weights`) from the actor's full ``state``.

    - without ``is_lora``: ``state`` itself;
    - ``lora_sync: merged``: ``P.weight = P.base_layer.weight + lora_scaling · B A``, the adapter entries dropped;
      the rollout builds its policy without adapters (:func:`build_inference_policy`) and runs the plain model;
    - ``lora_sync: adapters``: the ``trainable`` entries only (:func:`trainable_names` of the actor's policy);
      the rollout builds the adapted policy on ``model_path``'s frozen base and runs it as the actor does.

    Args:
        config: ``actor.model``.
        state: the actor policy's full state dict (for ``adapters``, at least the ``trainable`` entries).
        trainable: ``adapters``: the names to send.

    Raises:
        ValueError: ``adapters`` without ``trainable``, or with a name ``state`` lacks.
    """
    if not config.is_lora:
        return dict(state)
    if config.lora_sync == "merged":
        return merge_lora_state(state, config.lora_scaling)
    if trainable is None:
        raise ValueError(
            "actor.model.lora_sync 'adapters' sends the trainable tensors: pass trainable=trainable_names(policy)"
        )
    missing = sorted(set(trainable) - state.keys())
    if missing:
        raise ValueError(
            f"actor.model.lora_sync 'adapters': the state dict lacks trainable tensors {missing[:6]}"
        )
    return {key: value for key, value in state.items() if key in trainable}


def load_rollout_weights(policy: nn.Module, config: PolicyConfig, state: Mapping[str, torch.Tensor]) -> None:
    """Load :func:`rollout_state_dict`'s weights into the rollout's ``policy`` (:func:`build_inference_policy`'s).

    ``lora_sync: adapters`` (with ``is_lora``): ``state`` must hold exactly the policy's trainable tensors
    (:func:`trainable_names`), which replace the current ones; the frozen base weights stay as ``model_path``
    gave them when the policy was built. Otherwise the whole state dict, strictly.

    Raises:
        ValueError: naming ``actor.model.lora_sync`` when the received entries are not the policy's trainable
            ones, or not of their shapes (the actor's and the rollout's policies were built from different configs).
        RuntimeError: from ``load_state_dict`` when a full state dict (``merged``) does not fit.
    """
    if not (config.is_lora and config.lora_sync == "adapters"):
        policy.load_state_dict(state)
        return
    params = {name: param for name, param in policy.named_parameters() if param.requires_grad}
    missing, unexpected = sorted(params.keys() - state.keys()), sorted(state.keys() - params.keys())
    if missing or unexpected:
        raise ValueError(
            "actor.model.lora_sync 'adapters': the received tensors are not this policy's trainable ones "
            f"(missing {missing[:6]}, unexpected {unexpected[:6]}); actor and rollout must use the same "
            "actor.model (lora_rank, lora_target_modules, heads)"
        )
    # What load_state_dict does for these entries (a copy into each parameter, shapes checked), without its walk
    # over every module of the backbone: that walk, not the copies, is most of a small sync's cost.
    with torch.no_grad():
        for name, value in state.items():
            param = params[name]
            if param.shape != value.shape:
                raise ValueError(
                    f"actor.model.lora_sync 'adapters': {name} is {tuple(value.shape)} from the actor, "
                    f"{tuple(param.shape)} here; actor and rollout must use the same actor.model (lora_rank)"
                )
            param.copy_(value)
