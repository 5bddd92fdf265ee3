"""rlinf_models.llm.megatron: a Megatron-core training backend for Hugging Face Llama / Qwen2 / Qwen3 models.

GPU only. The configuration, the HF ↔ Megatron weight conversion and the vocabulary-parallel log-prob math
are pure torch and import without Megatron (torch itself loads on first use of them); :class:`MegatronActorBackend`,
:class:`MegatronLLMActorWorker` (the actor group, same methods as ``LLMActorWorker``) and
:func:`initialize_model_parallel` need ``pip install "rlinf-models[megatron,hf]"`` (megatron-core, plus
safetensors/transformers to read the checkpoint) and CUDA, and load on first use. See ``docs/gpu_backends.md``
for what was verified on which hardware.
"""

from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._config import MegatronConfig

if TYPE_CHECKING:
    from ._backend import MegatronActorBackend, initialize_model_parallel
    from ._convert import (
        SUPPORTED_MODEL_TYPES,
        HFArchitecture,
        globalize_layers,
        gpt_model_kwargs,
        hf_to_megatron,
        megatron_to_hf,
        merge_tp_shards,
        padded_vocab_size,
        parse_hf_config,
        shard_state_dict,
        stage_layer_range,
        stage_layers,
        transformer_config_kwargs,
    )
    from ._logprobs import (
        aligned_token_logprobs,
        left_align,
        restore_alignment,
        shift_logprobs,
        vocab_parallel_logprobs,
    )
    from ._worker import MegatronLLMActorWorker

__all__ = [
    "SUPPORTED_MODEL_TYPES",
    "HFArchitecture",
    "MegatronActorBackend",
    "MegatronConfig",
    "MegatronLLMActorWorker",
    "aligned_token_logprobs",
    "globalize_layers",
    "gpt_model_kwargs",
    "hf_to_megatron",
    "initialize_model_parallel",
    "left_align",
    "megatron_to_hf",
    "merge_tp_shards",
    "padded_vocab_size",
    "parse_hf_config",
    "restore_alignment",
    "shard_state_dict",
    "shift_logprobs",
    "stage_layer_range",
    "stage_layers",
    "transformer_config_kwargs",
    "vocab_parallel_logprobs",
]

_LAZY = {
    "SUPPORTED_MODEL_TYPES": "._convert",
    "HFArchitecture": "._convert",
    "globalize_layers": "._convert",
    "gpt_model_kwargs": "._convert",
    "hf_to_megatron": "._convert",
    "megatron_to_hf": "._convert",
    "merge_tp_shards": "._convert",
    "padded_vocab_size": "._convert",
    "parse_hf_config": "._convert",
    "shard_state_dict": "._convert",
    "stage_layer_range": "._convert",
    "stage_layers": "._convert",
    "transformer_config_kwargs": "._convert",
    "aligned_token_logprobs": "._logprobs",
    "left_align": "._logprobs",
    "restore_alignment": "._logprobs",
    "shift_logprobs": "._logprobs",
    "vocab_parallel_logprobs": "._logprobs",
    "MegatronActorBackend": "._backend",
    "initialize_model_parallel": "._backend",
    "MegatronLLMActorWorker": "._worker",
}

# torch, megatron-core (and Ray, for the worker) load on first use, so the config imports without them: an ImportError naming the extra when missing.
__getattr__ = lazy_exports(__name__, _LAZY)
