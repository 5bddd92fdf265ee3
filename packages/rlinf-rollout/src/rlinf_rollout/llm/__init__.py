"""rlinf_rollout.llm: text-generation engines for causal LMs and the ``LLMRolloutWorker``.

Configs, the result type and the engine protocol import without torch or transformers; the engines and the
worker load on first use (``HFGenerateEngine`` needs ``rlinf-rollout[hf]``, ``VLLMEngine``
``rlinf-rollout[vllm]``, ``SGLangEngine`` SGLang on a GPU).
"""

from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

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

# transformers (engines) and Ray (worker) load on first use: importing the configs stays light.
__getattr__ = lazy_exports(__name__, _LAZY)
