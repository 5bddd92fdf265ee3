"""rlinf_rollout.llm: text-generation engines for causal LMs and the ``LLMRolloutWorker``.

Configs, the result type and the engine protocol import without torch or transformers; the engines and the
worker load on first use (``HFGenerateEngine`` needs ``rlinf-rollout[hf]``, ``VLLMEngine``
``rlinf-rollout[vllm]``, ``SGLangEngine`` SGLang on a GPU).
"""

from typing import TYPE_CHECKING, Any

from ._config import ENGINES, LLMRolloutConfig
from ._factory import build_engine
from ._sglang_options import SGLangOptions
from ._types import FinishReason, GenerationEngine, GenerationOutput, SamplingConfig
from ._vllm_options import VLLMOptions

if TYPE_CHECKING:
    from ._hf import HFGenerateEngine
    from ._sglang import SGLangEngine
    from ._vllm import VLLMEngine
    from ._worker import LLMRolloutWorker

__all__ = [
    "ENGINES",
    "FinishReason",
    "GenerationEngine",
    "GenerationOutput",
    "HFGenerateEngine",
    "LLMRolloutConfig",
    "LLMRolloutWorker",
    "SGLangEngine",
    "SGLangOptions",
    "SamplingConfig",
    "VLLMEngine",
    "VLLMOptions",
    "build_engine",
]

_LAZY = {
    "HFGenerateEngine": "._hf",
    "VLLMEngine": "._vllm",
    "SGLangEngine": "._sglang",
    "LLMRolloutWorker": "._worker",
}


def __getattr__(name: str) -> Any:
    # transformers (engines) and Ray (worker) load on first use: importing the configs stays light.
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rlinf_rollout.llm' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module, __name__), name)
