"""``tools:`` — which tools an agent gets and where ``search`` runs, and :func:`build_toolbox`.

``search`` runs in each rollout worker (``local``) or in the ``retriever`` worker group (``service``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs
from attrs import validators as v

from ._retrieval import RetrievalSearchTool, SearchBackend
from ._tools import CalculatorTool, LocalSearchTool, Tool, Toolbox, ToolError

__all__ = [
    "RETRIEVER_TYPES",
    "SEARCH_BACKENDS",
    "TOOL_NAMES",
    "RetrieverConfig",
    "ToolsConfig",
    "build_toolbox",
]

TOOL_NAMES = ("calculator", "search")
"""The built-in tools."""
SEARCH_BACKENDS = ("local", "service")
"""Where ``search`` runs: in each rollout worker, or in the ``retriever`` worker group."""
RETRIEVER_TYPES = ("bm25",)
"""Retrievers the ``retriever`` group can hold (no dense retrieval yet)."""


def _one_of(field: str, allowed: tuple[str, ...]) -> Callable[[object, attrs.Attribute[str], str], None]:
    def check(_inst: object, _attr: attrs.Attribute[str], value: str) -> None:
        if value not in allowed:
            raise ValueError(f"{field}: unknown value {value!r}; allowed: {', '.join(allowed)}")

    return check


@attrs.frozen(kw_only=True)
class RetrieverConfig:
    """The ``retriever`` worker group (config ``tools.retriever``), used with ``tools.search_backend: service``."""

    type: Literal["bm25"] = attrs.field(
        default="bm25", validator=_one_of("tools.retriever.type", RETRIEVER_TYPES)
    )
    """The index: ``bm25`` (Okapi BM25 over ``tools.corpus_path``, :class:`~rlinf_rollout.agent.BM25Index`)."""
    k1: float = attrs.field(default=0.9, validator=v.ge(0.0))
    """BM25 term-frequency saturation (Pyserini's default, as in Search-R1's BM25 retriever)."""
    b: float = attrs.field(default=0.4, validator=[v.ge(0.0), v.le(1.0)])
    """BM25 length normalisation (Pyserini's default)."""
    stopwords: bool = True
    """Drop English stopwords from passages and queries."""
    information_tags: bool = False
    """Wrap each search response in Search-R1's ``<information>...</information>`` (inside the chat template's
    tool message, which ``agent.wrap_tool_response`` already wraps in ``<tool_response>``)."""


def _known(_inst: object, _attr: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]) -> None:
    unknown = [t for t in value if t not in TOOL_NAMES]
    if unknown:
        raise ValueError(f"tools.enabled: unknown tool(s) {unknown}; allowed: {', '.join(TOOL_NAMES)}")
    if len(set(value)) != len(value):
        raise ValueError(f"tools.enabled: a tool is listed twice: {list(value)}")


@attrs.frozen(kw_only=True)
class ToolsConfig:
    """The agent's tools (config ``tools``)."""

    enabled: tuple[str, ...] = attrs.field(default=TOOL_NAMES, validator=_known)
    """Tools offered to the model: ``calculator`` (exact arithmetic), ``search`` (BM25 over ``corpus_path``)."""
    search_backend: Literal["local", "service"] = attrs.field(
        default="local", validator=_one_of("tools.search_backend", SEARCH_BACKENDS)
    )
    """``local``: each rollout worker indexes the corpus itself (:class:`~rlinf_rollout.agent.LocalSearchTool`);
    ``service``: the ``retriever`` worker group does (``cluster.component_placement`` must place ``retriever``),
    and each turn's searches of all episodes go to it as one batch."""
    retriever: RetrieverConfig = attrs.field(factory=RetrieverConfig)
    """The ``retriever`` group (``service`` mode only)."""
    corpus_path: str | None = None
    """JSONL corpus of the ``search`` tool, one ``{"id", "title", "text"}`` per line (required with search)."""
    search_top_k: int = attrs.field(default=2, validator=v.ge(1))
    """Passages returned per search."""
    timeout_s: float = attrs.field(default=5.0, validator=v.gt(0.0))
    """Longest a tool call may run before its response is an error."""
    max_response_chars: int = attrs.field(default=600, validator=v.ge(16))
    """Tool responses are cut to this many characters."""

    def __attrs_post_init__(self) -> None:
        if "search" in self.enabled and not self.corpus_path:
            raise ValueError("tools.corpus_path is required when tools.enabled lists 'search'")
        if self.search_backend == "service" and "search" not in self.enabled:
            raise ValueError(
                "tools.search_backend is 'service' but tools.enabled does not list 'search' (the retriever group "
                "would serve no tool); enable search or set tools.search_backend: local"
            )


class _Unconnected:
    """The backend of a ``service`` search tool built without a retriever (to describe the tools only)."""

    def search(self, queries: Sequence[str], top_k: int) -> list[list[dict[str, Any]]]:
        raise ToolError("this search tool is not connected to a retriever group")


def build_toolbox(
    cfg: ToolsConfig, *, base_dir: str | Path | None = None, retriever: SearchBackend | None = None
) -> Toolbox:
    """The toolbox ``cfg`` describes.

    Args:
        cfg: the tools config.
        base_dir: directory a relative ``corpus_path`` is resolved against (default: the working directory).
        retriever: the backend of ``search`` in ``service`` mode (the retriever group's client). Without it a
            ``service`` search tool can be described (system prompt) but its calls are errors.

    Raises:
        FileNotFoundError: when the corpus file does not exist (``local`` mode).
    """
    tools: list[Tool] = []
    for name in cfg.enabled:
        if name == "calculator":
            tools.append(CalculatorTool())
        elif cfg.search_backend == "service":
            tools.append(
                RetrievalSearchTool(
                    retriever if retriever is not None else _Unconnected(),
                    top_k=cfg.search_top_k,
                    information_tags=cfg.retriever.information_tags,
                )
            )
        else:
            assert cfg.corpus_path is not None  # checked by ToolsConfig
            path = Path(cfg.corpus_path)
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            tools.append(LocalSearchTool.from_file(path, top_k=cfg.search_top_k))
    return Toolbox(tools, timeout_s=cfg.timeout_s, max_response_chars=cfg.max_response_chars)
