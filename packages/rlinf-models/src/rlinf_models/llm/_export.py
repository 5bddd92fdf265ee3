"""``rlinf-export``: a saved LLM actor checkpoint → a Hugging Face model directory.

    rlinf-export <checkpoint> <out dir> [--model-path PATH] [--dtype float32|bfloat16|float16]

``<checkpoint>`` is a ``global_step_<N>`` directory, or a run's ``log_path`` (or its ``checkpoints/``), in which
case the newest complete checkpoint is taken. The run's config, stored in the checkpoint's ``meta.json``, names
the base model (``actor.model.model_path``: its ``config.json``, tokenizer and generation config go with the
weights) and the training backend:

* ``fsdp`` (the default backend): the full, unsharded policy state in ``actor/model.pt``;
* ``megatron``: the distributed checkpoint in ``actor/megatron`` (PyTorch DCP files, any TP / PP layout), read
  with ``torch.distributed.checkpoint`` alone (no megatron-core, no GPU), its layers unstacked and converted
  to the HF names with the same converter the Megatron backend exports weights with.

The output is written into a staging directory renamed into place, loads with
``AutoModelForCausalLM.from_pretrained`` and vLLM, and serves as ``actor.model.model_path`` /
``rollout.model_path`` of another run. A value head (PPO critic) goes to ``value_head.pt`` beside it. A LoRA
run's adapters are merged into the weights, and also written alone, in PEFT's format, to ``lora_adapter/``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from rlinf_core.checkpoint import CheckpointError, find_latest_checkpoint, is_complete, replace_directory

from ._config import LLMModelConfig
from ._lora import ADAPTER_DIR, has_lora_weights, merge_lora_state, write_peft_adapter

__all__ = ["export_checkpoint", "main", "resolve_checkpoint"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# Files of the base model directory that describe the model beside its weights (copied when present).
_SIDE_FILES = ("generation_config.json",)


def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint directory ``path`` names: itself, or the newest complete one of a run / ``checkpoints``.

    Raises:
        CheckpointError: when ``path`` is neither a complete checkpoint nor holds one.
    """
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"checkpoint {str(p)!r} does not exist")
    if is_complete(p):
        return p
    for log_path in (p, p.parent) if p.name == "checkpoints" else (p,):
        latest = find_latest_checkpoint(log_path)
        if latest is not None:
            return latest
    raise CheckpointError(
        f"{str(p)!r} is not a complete checkpoint (global_step_<N> with a COMPLETE marker) and holds none "
        "under checkpoints/"
    )


def _run_config(ckpt: Path) -> dict[str, Any]:
    meta = ckpt / "meta.json"
    if not meta.is_file():
        raise CheckpointError(f"{ckpt} has no meta.json (the run's config); pass --model-path and --backend")
    config: dict[str, Any] = json.loads(meta.read_text()).get("config") or {}
    return config


def _actor_settings(
    ckpt: Path, model_path: str | None, backend: str | None
) -> tuple[str, str, Mapping[str, Any]]:
    """``(model_path, backend, actor.model block)`` of the run, the arguments taking precedence."""
    meta = ckpt / "meta.json"
    actor: Mapping[str, Any] = {}
    if model_path is None or backend is None or meta.is_file():
        actor = _run_config(ckpt).get("actor") or {}
    model: Mapping[str, Any] = actor.get("model") or {}
    model_path = model_path or model.get("model_path")
    backend = backend or actor.get("training_backend") or "fsdp"
    if not model_path:
        raise CheckpointError(
            f"{ckpt}: the stored config has no actor.model.model_path (not an LLM run?); pass --model-path"
        )
    if backend not in ("fsdp", "megatron"):
        raise CheckpointError(
            f"actor.training_backend must be 'fsdp' or 'megatron' to export, got {backend!r}"
        )
    return str(model_path), str(backend), model


def _fsdp_weights(actor_dir: Path) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """HF-named weights and the value head from ``actor/model.pt`` (the policy's state: ``model.`` + HF key)."""
    file = actor_dir / "model.pt"
    if not file.is_file():
        raise CheckpointError(f"{actor_dir} has no model.pt (an FSDP actor checkpoint writes it)")
    state = torch.load(file, map_location="cpu", weights_only=True)
    weights = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    head = {k.removeprefix("value_head."): v for k, v in state.items() if k.startswith("value_head.")}
    return weights, head


def _megatron_weights(actor_dir: Path, base: Path) -> dict[str, torch.Tensor]:
    """HF-named weights from the Megatron distributed checkpoint under ``actor/megatron`` (model tensors only)."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    from .megatron._convert import megatron_to_hf, parse_hf_config

    root = actor_dir / "megatron"
    if not (root / ".metadata").is_file():
        raise CheckpointError(f"{root} holds no distributed checkpoint (no .metadata)")
    reader = FileSystemReader(str(root))
    metadata = reader.read_metadata()
    wanted = {
        key: torch.empty(meta.size, dtype=meta.properties.dtype)
        for key, meta in metadata.state_dict_metadata.items()
        if isinstance(meta, TensorStorageMetadata) and not key.startswith("optimizer")
    }
    dcp_load(wanted, storage_reader=reader, no_dist=True)
    arch = parse_hf_config(base)
    return megatron_to_hf(_unstack_layers(wanted), arch, te_layernorm=_uses_te_layernorm(wanted))


def _unstack_layers(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Megatron stores each per-layer weight once, stacked over layers (``decoder.layers.X`` ``[L, ...]``)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.startswith("decoder.layers."):
            rest = key.removeprefix("decoder.layers.")
            for i, layer in enumerate(value.unbind(0)):
                out[f"decoder.layers.{i}.{rest}"] = layer.clone()
        else:
            out[key] = value
    return out


def _uses_te_layernorm(state: Mapping[str, torch.Tensor]) -> bool:
    """Transformer Engine fuses the pre-norms into the linear layers (``linear_qkv.layer_norm_weight``)."""
    return any(k.endswith("linear_qkv.layer_norm_weight") for k in state)


def export_checkpoint(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    model_path: str | None = None,
    backend: str | None = None,
    dtype: str | None = None,
) -> Path:
    """Write the actor of ``checkpoint`` as an HF model directory at ``out_dir``; returns ``out_dir``.

    Args:
        checkpoint: a checkpoint directory, a run's ``log_path`` or its ``checkpoints/`` (newest one).
        out_dir: the HF directory to write (replaced atomically when it exists).
        model_path: the base model (default: the run's ``actor.model.model_path``, aliases resolved).
        backend: ``fsdp`` or ``megatron`` (default: the run's ``actor.training_backend``).
        dtype: cast the weights (default: keep the checkpoint's).

    Raises:
        CheckpointError: on a missing or incomplete checkpoint, a non-LLM run, or weights that do not fit the
            base model's architecture (naming the missing and unexpected keys).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from ._hf import resolve_model_path

    if dtype is not None and dtype not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
    ckpt = resolve_checkpoint(checkpoint)
    base_name, backend, model_block = _actor_settings(ckpt, model_path, backend)
    base = resolve_model_path(base_name)
    actor_dir = ckpt / "actor"
    head: dict[str, torch.Tensor] = {}
    adapters: dict[str, torch.Tensor] = {}
    lora_cfg: LLMModelConfig | None = None
    if backend == "fsdp":
        weights, head = _fsdp_weights(actor_dir)
        if has_lora_weights(weights):  # a LoRA run: merge the adapters, and keep them apart too
            lora_keys = ("lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules")
            lora_cfg = LLMModelConfig(
                model_path=base_name,
                is_lora=True,
                **{k: model_block[k] for k in lora_keys if model_block.get(k) is not None},
            )
            adapters = weights
            weights = merge_lora_state(weights, lora_cfg.lora_scaling)
    else:
        weights = _megatron_weights(actor_dir, base)
    config = AutoConfig.from_pretrained(base)
    model = AutoModelForCausalLM.from_config(config, torch_dtype=next(iter(weights.values())).dtype)
    if getattr(config, "tie_word_embeddings", False):
        weights.pop("lm_head.weight", None)  # one tensor, saved once under the embedding's name
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise CheckpointError(
            f"{ckpt}: the weights do not fit {base} ({type(model).__name__}): missing {missing[:8]}, "
            f"unexpected {unexpected[:8]}"
        )
    if dtype is not None:
        model.to(_DTYPES[dtype])
    tokenizer = AutoTokenizer.from_pretrained(base)

    def fill(staging: Path) -> None:
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        for name in _SIDE_FILES:
            if (base / name).is_file():
                shutil.copy2(base / name, staging / name)
        if head:
            torch.save(head, staging / "value_head.pt")
        if lora_cfg is not None:
            write_peft_adapter(staging / ADAPTER_DIR, adapters, lora_cfg, str(base))
        (staging / "rlinf_export.json").write_text(
            json.dumps(
                {"checkpoint": str(ckpt.resolve()), "base_model": str(base), "backend": backend}, indent=2
            )
        )

    out = Path(out_dir)
    replace_directory(out, fill)
    return out


def main(argv: list[str] | None = None) -> int:
    """The ``rlinf-export`` command."""
    parser = argparse.ArgumentParser(
        prog="rlinf-export",
        description="Turn a saved LLM actor checkpoint (FSDP or Megatron) into a Hugging Face model directory.",
    )
    parser.add_argument(
        "checkpoint", help="global_step_<N> directory, or a run's log_path (newest checkpoint)"
    )
    parser.add_argument("out_dir", help="the HF model directory to write (replaced when it exists)")
    parser.add_argument("--model-path", help="the base model (default: the run's actor.model.model_path)")
    parser.add_argument("--backend", choices=["fsdp", "megatron"], help="default: the run's training backend")
    parser.add_argument("--dtype", choices=sorted(_DTYPES), help="cast the weights (default: as saved)")
    args = parser.parse_args(argv)
    try:
        out = export_checkpoint(
            args.checkpoint, args.out_dir, model_path=args.model_path, backend=args.backend, dtype=args.dtype
        )
    except (CheckpointError, ValueError) as e:
        print(f"rlinf-export: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
