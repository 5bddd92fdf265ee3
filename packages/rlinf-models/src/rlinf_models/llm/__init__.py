"""rlinf_models.llm: Hugging Face causal-LM policies and their actor (reasoning and agent RL).

Configs are importable without the Hugging Face stack; everything else needs ``rlinf-models[hf]`` and is
loaded on first use.
"""

from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._backends import (
    actor_data_parallel_size,
    actor_worker_class,
    actor_worker_kwargs,
    check_training_backend,
    training_backend_problems,
)
from ._config import SMOLLM2_ALIAS, TRAINING_BACKENDS, LLMActorConfig, LLMModelConfig, model_path_problems

if TYPE_CHECKING:
    from ._actor_worker import LLMActorWorker
    from ._backend import LLMActorBackend
    from ._fsdp_backend import FSDPActorBackend
    from ._hf import cache_dir, load_causal_lm, load_tokenizer, resolve_model_path
    from ._policy import CausalLMPolicy

__all__ = [
    "SMOLLM2_ALIAS",
    "TRAINING_BACKENDS",
    "CausalLMPolicy",
    "FSDPActorBackend",
    "LLMActorBackend",
    "LLMActorConfig",
    "LLMActorWorker",
    "LLMModelConfig",
    "actor_data_parallel_size",
    "actor_worker_class",
    "actor_worker_kwargs",
    "cache_dir",
    "check_training_backend",
    "load_causal_lm",
    "load_tokenizer",
    "model_path_problems",
    "resolve_model_path",
    "training_backend_problems",
]

_LAZY = {
    "cache_dir": "._hf",
    "load_causal_lm": "._hf",
    "load_tokenizer": "._hf",
    "resolve_model_path": "._hf",
    "CausalLMPolicy": "._policy",
    "LLMActorWorker": "._actor_worker",
    "LLMActorBackend": "._backend",
    "FSDPActorBackend": "._fsdp_backend",
}

# transformers (and Ray, for the worker) load on first use: importing the configs stays light.
__getattr__ = lazy_exports(__name__, _LAZY)
