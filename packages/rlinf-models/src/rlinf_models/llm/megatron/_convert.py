"""Hugging Face Llama / Qwen2 / Qwen3 checkpoints ↔ megatron-core ``GPTModel`` (pure torch, no Megatron import).

Three layers, each a pure function so the whole path round-trips on CPU:

1. :func:`parse_hf_config` reads ``config.json`` into a :class:`HFArchitecture` (rejecting what ``GPTModel``
   cannot express) and :func:`transformer_config_kwargs` / :func:`gpt_model_kwargs` translate it into the
   keyword arguments of ``megatron.core.transformer.TransformerConfig`` and ``megatron.core.models.gpt.GPTModel``.
2. :func:`hf_to_megatron` / :func:`megatron_to_hf` rename and reshape the *unsharded* weights. Megatron fuses
   ``q/k/v_proj`` into ``linear_qkv`` grouped by key/value head (``[q heads of group g, k_g, v_g]`` for each
   group ``g``) and ``gate_proj``/``up_proj`` into ``linear_fc1`` (``[gate; up]``); the vocabulary is padded
   to a multiple of ``make_vocab_size_divisible_by × TP`` with zero rows.
3. :func:`shard_state_dict` / :func:`merge_tp_shards` split / join one pipeline stage's weights over tensor
   parallel ranks (column-parallel along dim 0, row-parallel along dim 1, ``linear_fc1`` per half), and
   :func:`stage_layers` / :func:`globalize_layers` renumber decoder layers between global and stage-local
   indices.

Names follow megatron-core's local layer spec (``input_layernorm``, ``pre_mlp_layernorm``); with the Transformer
Engine spec (``layernorm_in_linear=True``) the two norms live inside the following linear layer
(``self_attention.linear_qkv.layer_norm_weight``, ``mlp.linear_fc1.layer_norm_weight``).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
import torch
import torch.nn.functional as F

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "HFArchitecture",
    "globalize_layers",
    "gpt_model_kwargs",
    "hf_to_megatron",
    "megatron_to_hf",
    "merge_tp_shards",
    "padded_vocab_size",
    "parse_hf_config",
    "shard_state_dict",
    "stage_layer_range",
    "stage_layers",
    "transformer_config_kwargs",
]

SUPPORTED_MODEL_TYPES: tuple[str, ...] = ("llama", "qwen2", "qwen3")
"""HF ``model_type`` values the converter handles (dense decoder-only, RMSNorm, SwiGLU, RoPE)."""

_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
"""The Llama-3.1 RoPE scaling constants megatron-core hard-codes (``RotaryEmbedding._apply_scaling``)."""

TPKind = Literal["replicated", "column", "row", "vocab", "fc1"]


@attrs.frozen(kw_only=True)
class HFArchitecture:
    """What the converter needs from an HF ``config.json`` (dense Llama-family decoder)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    """``q/k/v_proj`` have biases (Qwen2; Llama with ``attention_bias``)."""
    qk_layernorm: bool
    """Per-head RMSNorm on queries and keys (Qwen3 ``q_norm`` / ``k_norm``)."""
    rope_scaling_factor: float | None = None
    """Llama-3.1 RoPE scaling factor, or ``None`` for plain RoPE."""

    @property
    def heads_per_group(self) -> int:
        """Query heads sharing one key/value head."""
        return self.num_attention_heads // self.num_key_value_heads


def _rope(cfg: Mapping[str, Any]) -> tuple[float, float | None]:
    """``(rope_theta, llama3 scaling factor or None)``.

    Reads transformers 4 (``rope_theta`` / ``rope_scaling``) or transformers 5 (``rope_parameters``) keys.
    """
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or params
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3":
        for key, expected in _LLAMA3_ROPE.items():
            if float(scaling.get(key, expected)) != expected:
                raise ValueError(
                    f"rope scaling {key}={scaling.get(key)} is not supported: megatron-core's GPTModel "
                    f"hard-codes the Llama-3.1 values {_LLAMA3_ROPE}"
                )
        return theta, float(scaling.get("factor", 8.0))
    raise ValueError(
        f"rope_type {rope_type!r} is not supported by the Megatron converter; allowed: 'default', 'llama3'"
    )


def parse_hf_config(config: Mapping[str, Any] | str | os.PathLike[str]) -> HFArchitecture:
    """Read an HF ``config.json`` (a mapping, the file, or the checkpoint directory).

    Raises:
        ValueError: for a ``model_type`` outside :data:`SUPPORTED_MODEL_TYPES`, an activation other than
            ``silu``, sliding-window attention, biased MLPs or an unsupported RoPE scaling.
    """
    if not isinstance(config, Mapping):
        path = Path(config)
        cfg: Mapping[str, Any] = json.loads((path / "config.json" if path.is_dir() else path).read_text())
    else:
        cfg = config
    model_type = cfg.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"model_type {model_type!r} is not supported; allowed: {list(SUPPORTED_MODEL_TYPES)}"
        )
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported (SwiGLU needs 'silu')")
    if cfg.get("use_sliding_window") or (model_type == "llama" and cfg.get("sliding_window")):
        raise ValueError("sliding-window attention is not supported by the Megatron converter")
    if cfg.get("mlp_bias"):
        raise ValueError("mlp_bias=True is not supported by the Megatron converter")
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    if heads % kv_heads:
        raise ValueError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )
    hidden = int(cfg["hidden_size"])
    theta, factor = _rope(cfg)
    return HFArchitecture(
        model_type=str(model_type),
        vocab_size=int(cfg["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(cfg["intermediate_size"]),
        num_layers=int(cfg["num_hidden_layers"]),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=int(cfg.get("head_dim") or hidden // heads),
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=model_type == "qwen2" or bool(cfg.get("attention_bias", False)),
        qk_layernorm=model_type == "qwen3",
        rope_scaling_factor=factor,
    )


def padded_vocab_size(vocab_size: int, *, tensor_parallel_size: int = 1, divisible_by: int = 128) -> int:
    """Megatron's padded vocabulary: the next multiple of ``divisible_by × tensor_parallel_size``."""
    if vocab_size < 1 or tensor_parallel_size < 1 or divisible_by < 1:
        raise ValueError(
            f"vocab_size, tensor_parallel_size and divisible_by must be >= 1, got "
            f"{vocab_size}, {tensor_parallel_size}, {divisible_by}"
        )
    multiple = divisible_by * tensor_parallel_size
    return math.ceil(vocab_size / multiple) * multiple


def transformer_config_kwargs(
    arch: HFArchitecture,
    *,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    sequence_parallel: bool = False,
    dtype: Literal["float32", "bfloat16"] = "bfloat16",
    recompute: bool = False,
    use_cpu_initialization: bool = False,
) -> dict[str, Any]:
    """Keyword arguments of ``megatron.core.transformer.TransformerConfig`` for ``arch``.

    Dropouts are 0 (RL fine-tuning); fusions that need Apex / custom CUDA kernels are off so the local layer
    spec works with plain PyTorch; ``recompute`` selects full activation recomputation of every layer.
    """
    bf16 = dtype == "bfloat16"
    torch_dtype = torch.bfloat16 if bf16 else torch.float32
    kwargs: dict[str, Any] = {
        "num_layers": arch.num_layers,
        "hidden_size": arch.hidden_size,
        "ffn_hidden_size": arch.intermediate_size,
        "num_attention_heads": arch.num_attention_heads,
        "num_query_groups": arch.num_key_value_heads,
        "kv_channels": arch.head_dim,
        "normalization": "RMSNorm",
        "layernorm_epsilon": arch.rms_norm_eps,
        "gated_linear_unit": True,
        "activation_func": F.silu,
        "add_bias_linear": False,
        "add_qkv_bias": arch.qkv_bias,
        "qk_layernorm": arch.qk_layernorm,
        "attention_dropout": 0.0,
        "hidden_dropout": 0.0,
        "tensor_model_parallel_size": tensor_parallel_size,
        "pipeline_model_parallel_size": pipeline_parallel_size,
        "sequence_parallel": sequence_parallel and tensor_parallel_size > 1,
        "bf16": bf16,
        "params_dtype": torch_dtype,
        "pipeline_dtype": torch_dtype,
        "bias_dropout_fusion": False,
        "masked_softmax_fusion": False,
        "apply_rope_fusion": False,
        "gradient_accumulation_fusion": False,
        "persist_layer_norm": False,
        "attention_softmax_in_fp32": True,
        "use_cpu_initialization": use_cpu_initialization,
    }
    if recompute:
        kwargs |= {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    return kwargs


def gpt_model_kwargs(arch: HFArchitecture, *, padded_vocab: int) -> dict[str, Any]:
    """Keyword arguments of ``megatron.core.models.gpt.GPTModel``.

    Everything except ``config``, the layer spec and the pipeline flags ``pre_process`` / ``post_process``.
    """
    if padded_vocab < arch.vocab_size:
        raise ValueError(f"padded_vocab ({padded_vocab}) must be >= vocab_size ({arch.vocab_size})")
    kwargs: dict[str, Any] = {
        "vocab_size": padded_vocab,
        "max_sequence_length": arch.max_position_embeddings,
        "position_embedding_type": "rope",
        "rotary_base": arch.rope_theta,
        "rotary_percent": 1.0,
        "share_embeddings_and_output_weights": arch.tie_word_embeddings,
        "parallel_output": True,
    }
    if arch.rope_scaling_factor is not None:
        kwargs |= {"rope_scaling": True, "rope_scaling_factor": arch.rope_scaling_factor}
    return kwargs


# --------------------------------------------------------------------------------------------- renaming
def _norm_names(te_layernorm: bool) -> tuple[str, str]:
    if te_layernorm:
        return "self_attention.linear_qkv.layer_norm_weight", "mlp.linear_fc1.layer_norm_weight"
    return "input_layernorm.weight", "pre_mlp_layernorm.weight"


def _pad_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if weight.shape[0] == rows:
        return weight
    pad = weight.new_zeros((rows - weight.shape[0], *weight.shape[1:]))
    return torch.cat([weight, pad], dim=0)


def _fuse_qkv(arch: HFArchitecture, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """``[q; k; v]`` (HF, rows by head) → Megatron's grouped layout ``[q_g, k_g, v_g]`` for each kv group."""
    g, d, hpg = arch.num_key_value_heads, arch.head_dim, arch.heads_per_group
    rest = q.shape[1:]
    fused = torch.cat([q.reshape(g, hpg * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
    return fused.reshape(g * (hpg + 2) * d, *rest)


def _split_qkv(arch: HFArchitecture, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d, hpg = arch.num_key_value_heads, arch.head_dim, arch.heads_per_group
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, (hpg + 2) * d, *rest)
    q, k, v = torch.split(grouped, [hpg * d, d, d], dim=1)
    return (
        q.reshape(g * hpg * d, *rest).contiguous(),
        k.reshape(g * d, *rest).contiguous(),
        v.reshape(g * d, *rest).contiguous(),
    )


def _take(sd: dict[str, torch.Tensor], key: str) -> torch.Tensor:
    try:
        return sd.pop(key)
    except KeyError:
        raise KeyError(f"checkpoint has no tensor {key!r}") from None


def hf_to_megatron(
    hf_state_dict: Mapping[str, torch.Tensor],
    arch: HFArchitecture,
    *,
    padded_vocab: int,
    te_layernorm: bool = False,
    output_layer_copy: bool = False,
) -> dict[str, torch.Tensor]:
    """Rename and fuse an HF state dict into an unsharded ``GPTModel`` state dict (global layer indices).

    Args:
        hf_state_dict: ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM`` weights.
        arch: from :func:`parse_hf_config`.
        padded_vocab: Megatron vocabulary size (:func:`padded_vocab_size`); extra rows are zeros.
        te_layernorm: Transformer Engine spec (norms fused into the next linear) instead of the local spec.
        output_layer_copy: with tied embeddings, also emit ``output_layer.weight`` (the copy the last pipeline
            stage holds when ``pipeline_parallel_size > 1``); untied models always emit it.

    Returns:
        ``{megatron name: tensor}`` with ``linear_qkv`` ``[(heads + 2·kv_heads)·head_dim, hidden]`` and
        ``linear_fc1`` ``[2·ffn, hidden]``.

    Raises:
        KeyError: naming a missing HF tensor. ValueError: naming HF tensors that were not consumed.
    """
    sd = dict(hf_state_dict)
    out: dict[str, torch.Tensor] = {}
    in_norm, mlp_norm = _norm_names(te_layernorm)
    embed = _take(sd, "model.embed_tokens.weight")
    out["embedding.word_embeddings.weight"] = _pad_rows(embed, padded_vocab)
    for i in range(arch.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        out[dst + in_norm] = _take(sd, src + "input_layernorm.weight")
        q, k, v = (_take(sd, f"{src}self_attn.{n}_proj.weight") for n in "qkv")
        out[dst + "self_attention.linear_qkv.weight"] = _fuse_qkv(arch, q, k, v)
        if arch.qkv_bias:
            qb, kb, vb = (_take(sd, f"{src}self_attn.{n}_proj.bias") for n in "qkv")
            out[dst + "self_attention.linear_qkv.bias"] = _fuse_qkv(arch, qb, kb, vb)
        if arch.qk_layernorm:
            out[dst + "self_attention.q_layernorm.weight"] = _take(sd, src + "self_attn.q_norm.weight")
            out[dst + "self_attention.k_layernorm.weight"] = _take(sd, src + "self_attn.k_norm.weight")
        out[dst + "self_attention.linear_proj.weight"] = _take(sd, src + "self_attn.o_proj.weight")
        out[dst + mlp_norm] = _take(sd, src + "post_attention_layernorm.weight")
        gate, up = _take(sd, src + "mlp.gate_proj.weight"), _take(sd, src + "mlp.up_proj.weight")
        out[dst + "mlp.linear_fc1.weight"] = torch.cat([gate, up], dim=0)
        out[dst + "mlp.linear_fc2.weight"] = _take(sd, src + "mlp.down_proj.weight")
    out["decoder.final_layernorm.weight"] = _take(sd, "model.norm.weight")
    lm_head = sd.pop("lm_head.weight", None)
    if not arch.tie_word_embeddings:
        if lm_head is None:
            raise KeyError("checkpoint has no tensor 'lm_head.weight' (tie_word_embeddings is false)")
        out["output_layer.weight"] = _pad_rows(lm_head, padded_vocab)
    elif output_layer_copy:
        out["output_layer.weight"] = out["embedding.word_embeddings.weight"].clone()
    sd = {k: t for k, t in sd.items() if not k.endswith("rotary_emb.inv_freq")}
    if sd:
        raise ValueError(f"HF tensors not mapped to Megatron: {sorted(sd)[:8]}{' …' if len(sd) > 8 else ''}")
    return out


def megatron_to_hf(
    megatron_state_dict: Mapping[str, torch.Tensor], arch: HFArchitecture, *, te_layernorm: bool = False
) -> dict[str, torch.Tensor]:
    """Inverse of :func:`hf_to_megatron` on an unsharded, globally numbered state dict.

    Padding rows are cut to ``arch.vocab_size``; ``lm_head.weight`` is emitted only for untied models (an
    HF model with tied embeddings has no separate tensor). ``_extra_state`` entries are ignored.

    Raises:
        KeyError: naming a missing Megatron tensor. ValueError: naming Megatron tensors not consumed.
    """
    sd = {k: t for k, t in megatron_state_dict.items() if not k.endswith("_extra_state")}
    out: dict[str, torch.Tensor] = {}
    in_norm, mlp_norm = _norm_names(te_layernorm)
    out["model.embed_tokens.weight"] = _take(sd, "embedding.word_embeddings.weight")[: arch.vocab_size]
    for i in range(arch.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        out[dst + "input_layernorm.weight"] = _take(sd, src + in_norm)
        q, k, v = _split_qkv(arch, _take(sd, src + "self_attention.linear_qkv.weight"))
        out |= {f"{dst}self_attn.q_proj.weight": q, f"{dst}self_attn.k_proj.weight": k}
        out[f"{dst}self_attn.v_proj.weight"] = v
        if arch.qkv_bias:
            qb, kb, vb = _split_qkv(arch, _take(sd, src + "self_attention.linear_qkv.bias"))
            out |= {f"{dst}self_attn.q_proj.bias": qb, f"{dst}self_attn.k_proj.bias": kb}
            out[f"{dst}self_attn.v_proj.bias"] = vb
        if arch.qk_layernorm:
            out[dst + "self_attn.q_norm.weight"] = _take(sd, src + "self_attention.q_layernorm.weight")
            out[dst + "self_attn.k_norm.weight"] = _take(sd, src + "self_attention.k_layernorm.weight")
        out[dst + "self_attn.o_proj.weight"] = _take(sd, src + "self_attention.linear_proj.weight")
        out[dst + "post_attention_layernorm.weight"] = _take(sd, src + mlp_norm)
        gate, up = torch.chunk(_take(sd, src + "mlp.linear_fc1.weight"), 2, dim=0)
        out[dst + "mlp.gate_proj.weight"], out[dst + "mlp.up_proj.weight"] = (
            gate.contiguous(),
            up.contiguous(),
        )
        out[dst + "mlp.down_proj.weight"] = _take(sd, src + "mlp.linear_fc2.weight")
    out["model.norm.weight"] = _take(sd, "decoder.final_layernorm.weight")
    output_layer = sd.pop("output_layer.weight", None)
    if not arch.tie_word_embeddings:
        if output_layer is None:
            raise KeyError("Megatron state dict has no 'output_layer.weight' (tie_word_embeddings is false)")
        out["lm_head.weight"] = output_layer[: arch.vocab_size]
    if sd:
        raise ValueError(f"Megatron tensors not mapped to HF: {sorted(sd)[:8]}{' …' if len(sd) > 8 else ''}")
    return out


# ------------------------------------------------------------------------------------ tensor parallelism
def tp_kind(name: str) -> TPKind:
    """How ``name`` (a Megatron parameter) is split over tensor-parallel ranks."""
    if name.endswith(("embedding.word_embeddings.weight", "output_layer.weight")):
        return "vocab"
    if name.endswith(("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias")):
        return "column"
    if name.endswith("mlp.linear_fc1.weight"):
        return "fc1"
    if name.endswith(("self_attention.linear_proj.weight", "mlp.linear_fc2.weight")):
        return "row"
    return "replicated"


def _check_tp(arch: HFArchitecture, tp_size: int) -> None:
    if arch.num_key_value_heads % tp_size or arch.intermediate_size % tp_size:
        raise ValueError(
            f"tensor_parallel_size {tp_size} must divide num_key_value_heads ({arch.num_key_value_heads}) and "
            f"intermediate_size ({arch.intermediate_size})"
        )


def shard_state_dict(
    state_dict: Mapping[str, torch.Tensor], arch: HFArchitecture, *, tp_size: int, tp_rank: int
) -> dict[str, torch.Tensor]:
    """The ``tp_rank``-th of ``tp_size`` tensor-parallel shards of an unsharded Megatron state dict.

    ``linear_qkv`` splits along dim 0 into whole key/value groups (Megatron's grouped layout keeps a group's
    q, k and v rows together); ``linear_fc1`` splits its gate and up halves separately and re-stacks them.
    """
    _check_tp(arch, tp_size)
    if not 0 <= tp_rank < tp_size:
        raise ValueError(f"tp_rank must be in [0, {tp_size}), got {tp_rank}")
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        kind = tp_kind(name)
        if kind in ("column", "vocab"):
            out[name] = torch.chunk(t, tp_size, dim=0)[tp_rank].contiguous()
        elif kind == "row":
            out[name] = torch.chunk(t, tp_size, dim=1)[tp_rank].contiguous()
        elif kind == "fc1":
            gate, up = torch.chunk(t, 2, dim=0)
            out[name] = torch.cat(
                [torch.chunk(gate, tp_size, dim=0)[tp_rank], torch.chunk(up, tp_size, dim=0)[tp_rank]], dim=0
            )
        else:
            out[name] = t
    return out


def merge_tp_shards(shards: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Join the tensor-parallel shards (in rank order) of one pipeline stage: inverse of :func:`shard_state_dict`."""
    if not shards:
        raise ValueError("merge_tp_shards needs at least one shard")
    names = list(shards[0])
    for r, s in enumerate(shards[1:], start=1):
        if set(s) != set(names):
            raise ValueError(
                f"tensor-parallel shard {r} has different names than shard 0: {sorted(set(s) ^ set(names))[:4]}"
            )
    out: dict[str, torch.Tensor] = {}
    for name in names:
        parts = [s[name] for s in shards]
        kind = tp_kind(name)
        if len(parts) == 1 or kind == "replicated":
            out[name] = parts[0]
        elif kind in ("column", "vocab"):
            out[name] = torch.cat(parts, dim=0)
        elif kind == "row":
            out[name] = torch.cat(parts, dim=1)
        else:
            halves = [torch.chunk(p, 2, dim=0) for p in parts]
            out[name] = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return out


# ---------------------------------------------------------------------------------- pipeline parallelism
_LAYER = re.compile(r"^((?:.*\.)?decoder\.layers\.)(\d+)(\..*)$")


def stage_layer_range(num_layers: int, *, pp_size: int, pp_rank: int) -> range:
    """Global indices of the decoder layers on pipeline stage ``pp_rank`` (even split)."""
    if num_layers % pp_size:
        raise ValueError(f"pipeline_parallel_size {pp_size} must divide num_layers ({num_layers})")
    if not 0 <= pp_rank < pp_size:
        raise ValueError(f"pp_rank must be in [0, {pp_size}), got {pp_rank}")
    per = num_layers // pp_size
    return range(pp_rank * per, (pp_rank + 1) * per)


def stage_layers(
    state_dict: Mapping[str, torch.Tensor], *, num_layers: int, pp_size: int, pp_rank: int, tied: bool
) -> dict[str, torch.Tensor]:
    """The part of an unsharded, globally numbered state dict that stage ``pp_rank`` holds, renumbered locally.

    The embedding lives on the first stage, the final norm and the output layer on the last; with tied
    embeddings and more than one stage the last stage holds its own ``output_layer.weight`` copy (megatron-core
    keeps the two in sync through the embedding group), built from the embedding when absent.
    """
    layers = stage_layer_range(num_layers, pp_size=pp_size, pp_rank=pp_rank)
    first, last = pp_rank == 0, pp_rank == pp_size - 1
    out: dict[str, torch.Tensor] = {}
    for name, t in state_dict.items():
        m = _LAYER.match(name)
        if m:
            idx = int(m.group(2))
            if idx in layers:
                out[f"{m.group(1)}{idx - layers.start}{m.group(3)}"] = t
        elif name.startswith("embedding."):
            if first:
                out[name] = t
        elif name == "output_layer.weight":
            if last and (not tied or pp_size > 1):
                out[name] = t
        elif last:
            out[name] = t
    if tied and last and pp_size > 1 and "output_layer.weight" not in out:
        out["output_layer.weight"] = state_dict["embedding.word_embeddings.weight"].clone()
    return out


def globalize_layers(
    stages: Sequence[Mapping[str, torch.Tensor]], *, num_layers: int, tied: bool
) -> dict[str, torch.Tensor]:
    """Join the (tensor-parallel merged) state dicts of all pipeline stages, in stage order.

    The inverse of :func:`stage_layers`: one globally numbered state dict (a tied model's last-stage output
    copy is dropped).
    """
    pp_size = len(stages)
    out: dict[str, torch.Tensor] = {}
    for rank, stage in enumerate(stages):
        layers = stage_layer_range(num_layers, pp_size=pp_size, pp_rank=rank)
        for name, t in stage.items():
            m = _LAYER.match(name)
            if m:
                out[f"{m.group(1)}{int(m.group(2)) + layers.start}{m.group(3)}"] = t
            elif name == "output_layer.weight" and tied:
                continue
            else:
                out[name] = t
    return out
