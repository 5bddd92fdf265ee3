"""Multi-turn tool-using agents: tools, tool-call parsing, chat formatting and the agent loop.

The loop (:class:`AgentLoop`) drives any generation engine turn by turn for a batch of episodes; model tokens
are trained (``loss_mask`` 1, rollout log-probs kept), tool outputs are not (``loss_mask`` 0).
:class:`AgentRolloutWorker` runs it inside a rollout worker group (imported on first use: it needs torch,
transformers and Ray). In ``tools.search_backend: service`` mode ``search`` is served by the ``retriever``
worker group (:class:`RetrieverWorker`, a :class:`BM25Index`), reached through :class:`RetrieverClient`.
"""

from typing import TYPE_CHECKING

from rlinf_core import lazy_exports

from ._chat import DEFAULT_AGENT_INSTRUCTIONS, ChatFormatter, ChatTokenizer, build_system_prompt
from ._config import (
    RETRIEVER_TYPES,
    SEARCH_BACKENDS,
    TOOL_NAMES,
    RetrieverConfig,
    ToolsConfig,
    build_toolbox,
)
from ._loop import FINISH_REASONS, AgentEpisode, AgentLoop, AgentLoopConfig, AgentTurn, SupportsGenerate
from ._parse import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ParsedTurn,
    extract_answer,
    format_tool_call,
    parse_turn,
)
from ._retrieval import BM25Index, RetrievalSearchTool, SearchBackend, format_passages, tokenize
from ._tools import (
    BatchTool,
    CalculatorTool,
    LocalSearchTool,
    Passage,
    Tool,
    Toolbox,
    ToolCall,
    ToolError,
    load_passages,
    safe_eval_arithmetic,
)

if TYPE_CHECKING:
    from ._retriever import RetrieverClient, RetrieverWorker
    from ._worker import AgentRolloutWorker

# The workers need Ray (and the rollout worker torch and transformers): loaded on first use only.
__getattr__ = lazy_exports(
    __name__,
    {"AgentRolloutWorker": "._worker", "RetrieverClient": "._retriever", "RetrieverWorker": "._retriever"},
)


__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "DEFAULT_AGENT_INSTRUCTIONS",
    "FINISH_REASONS",
    "RETRIEVER_TYPES",
    "SEARCH_BACKENDS",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "TOOL_NAMES",
    "AgentEpisode",
    "AgentLoop",
    "AgentLoopConfig",
    "AgentRolloutWorker",
    "AgentTurn",
    "BM25Index",
    "BatchTool",
    "CalculatorTool",
    "ChatFormatter",
    "ChatTokenizer",
    "LocalSearchTool",
    "ParsedTurn",
    "Passage",
    "RetrievalSearchTool",
    "RetrieverClient",
    "RetrieverConfig",
    "RetrieverWorker",
    "SearchBackend",
    "SupportsGenerate",
    "Tool",
    "ToolCall",
    "ToolError",
    "Toolbox",
    "ToolsConfig",
    "build_system_prompt",
    "build_toolbox",
    "extract_answer",
    "format_passages",
    "format_tool_call",
    "load_passages",
    "parse_turn",
    "safe_eval_arithmetic",
    "tokenize",
]
