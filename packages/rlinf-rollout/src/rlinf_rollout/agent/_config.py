"""``tools:`` — which tools an agent gets, and :func:`build_toolbox`."""

from __future__ import annotations

from pathlib import Path

import attrs
from attrs import validators as v

from ._tools import CalculatorTool, LocalSearchTool, Tool, Toolbox

__all__ = ["TOOL_NAMES", "ToolsConfig", "build_toolbox"]

TOOL_NAMES = ("calculator", "search")
"""The built-in tools."""


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


def build_toolbox(cfg: ToolsConfig, *, base_dir: str | Path | None = None) -> Toolbox:
    """The toolbox ``cfg`` describes.

    Args:
        cfg: the tools config.
        base_dir: directory a relative ``corpus_path`` is resolved against (default: the working directory).

    Raises:
        FileNotFoundError: when the corpus file does not exist.
    """
    tools: list[Tool] = []
    for name in cfg.enabled:
        if name == "calculator":
            tools.append(CalculatorTool())
        else:
            assert cfg.corpus_path is not None  # checked by ToolsConfig
            path = Path(cfg.corpus_path)
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            tools.append(LocalSearchTool.from_file(path, top_k=cfg.search_top_k))
    return Toolbox(tools, timeout_s=cfg.timeout_s, max_response_chars=cfg.max_response_chars)
