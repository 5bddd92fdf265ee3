"""Tools an agent can call: the protocol, a safe calculator, a BM25 search over local passages, and a toolbox.

A tool never raises into the agent loop: :meth:`Toolbox.execute` turns an unknown name, bad arguments, an
exception or a timeout into an ``"Error: ..."`` string that the model sees as the tool's response.
"""

from __future__ import annotations

import ast
import concurrent.futures
import json
import math
import operator
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "BatchTool",
    "CalculatorTool",
    "LocalSearchTool",
    "Passage",
    "Tool",
    "ToolCall",
    "ToolError",
    "Toolbox",
    "load_passages",
    "safe_eval_arithmetic",
]


class ToolError(Exception):
    """A tool's way to say the call failed; the message becomes the tool response (``"Error: <message>"``)."""


@runtime_checkable
class Tool(Protocol):
    """What the agent loop needs of a tool.

    Attributes:
        name: the name the model writes in ``{"name": ..., "arguments": {...}}``.
        description: one line for the system prompt.
        parameters: JSON schema of ``arguments`` (an ``"object"`` with ``"properties"`` and ``"required"``).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]

    def call(self, arguments: Mapping[str, Any]) -> str:
        """Run the tool; raise :class:`ToolError` (or anything) on failure, the toolbox reports it."""
        ...


@runtime_checkable
class BatchTool(Tool, Protocol):
    """A tool that runs many calls with one request (e.g. one retrieval batch for every episode of a turn).

    :meth:`Toolbox.execute_many` calls :meth:`call_batch` in the caller's thread, without the toolbox's
    timeout: the tool bounds its own time (the retriever client waits at most ``tools.timeout_s``).
    """

    def call_batch(self, arguments: Sequence[Mapping[str, Any]]) -> list[str | ToolError]:
        """One result per call: its text, or the :class:`ToolError` of that call; raise when all failed."""
        ...


class ToolCall:
    """One parsed tool call.

    Attributes:
        name: tool name.
        arguments: the JSON object of arguments.
    """

    __slots__ = ("arguments", "name")

    def __init__(self, name: str, arguments: Mapping[str, Any]) -> None:
        self.name = name
        self.arguments = dict(arguments)

    def to_dict(self) -> dict[str, Any]:
        """``{"name": ..., "arguments": {...}}``."""
        return {"name": self.name, "arguments": self.arguments}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ToolCall) and (self.name, self.arguments) == (other.name, other.arguments)

    def __hash__(self) -> int:
        return hash((self.name, json.dumps(self.arguments, sort_keys=True, default=str)))

    def __repr__(self) -> str:
        return f"ToolCall(name={self.name!r}, arguments={self.arguments!r})"


# ------------------------------------------------------------------------------------------------ calculator
_BIN_OPS: dict[type[ast.operator], Callable[[int | float, int | float], int | float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS: dict[type[ast.unaryop], Callable[[int | float], int | float]] = {
    ast.UAdd: operator.pos,
    ast.USub: operator.neg,
}
_MAX_EXPRESSION_CHARS = 200
_MAX_POWER_EXPONENT = 64
_MAX_MAGNITUDE = 10**30


def _check_magnitude(value: int | float) -> int | float:
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError("the result is not a finite number")
    if abs(value) > _MAX_MAGNITUDE:
        raise ToolError("the result is too large")
    return value


def _eval_node(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    # bool is an int subclass: `True + 1` is not arithmetic we accept.
    if (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int | float)
        and not isinstance(node.value, bool)
    ):
        return _check_magnitude(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
        return _UNARY_OPS[type(node.op)](_eval_node(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN_OPS:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > _MAX_POWER_EXPONENT:
            raise ToolError(f"exponents above {_MAX_POWER_EXPONENT} are not supported")
        if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
            raise ToolError("division by zero")
        return _check_magnitude(_BIN_OPS[type(node.op)](left, right))
    raise ToolError(
        f"unsupported expression element {type(node).__name__!r}: only numbers, + - * / // % ** and parentheses"
    )


def safe_eval_arithmetic(expression: str) -> int | float:
    """Evaluate an arithmetic expression without ``eval``: numbers, ``+ - * / // % **``, parentheses.

    The expression is parsed with :mod:`ast` and only numeric literals and those operators are walked;
    names, calls, attributes and everything else are rejected. ``^`` is read as a power and ``×``/``÷`` as
    ``*``/``/``.

    Raises:
        ToolError: on a syntax error, an unsupported element, division by zero or a too-large result.
    """
    if not isinstance(expression, str):
        raise ToolError(f"'expression' must be a string, got {type(expression).__name__}")
    text = expression.strip().replace("^", "**").replace("×", "*").replace("÷", "/").replace(",", "")
    if not text:
        raise ToolError("'expression' is empty")
    if len(text) > _MAX_EXPRESSION_CHARS:
        raise ToolError(f"'expression' is longer than {_MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ToolError(f"cannot parse {expression!r} as arithmetic") from None
    return _eval_node(tree)


def _format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.6g}" if abs(value) < 1e-4 or abs(value) >= 1e15 else f"{round(value, 6)}"
    return str(value)


class CalculatorTool:
    """Exact arithmetic: ``{"expression": "17 * (3 + 4)"}`` → ``"119"`` (integers stay exact).

    Evaluation never calls ``eval``: see :func:`safe_eval_arithmetic`.
    """

    name = "calculator"
    description = (
        "Evaluate an arithmetic expression with + - * / // % ** and parentheses; returns the number."
    )
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "e.g. 17 * (3 + 4)"}},
        "required": ["expression"],
    }

    def call(self, arguments: Mapping[str, Any]) -> str:
        """Evaluate ``arguments["expression"]``.

        Raises:
            ToolError: when the expression is missing or not plain arithmetic.
        """
        if "expression" not in arguments:
            raise ToolError("missing argument 'expression'")
        return _format_number(safe_eval_arithmetic(arguments["expression"]))


# ---------------------------------------------------------------------------------------------------- search
class Passage:
    """One passage of the local corpus.

    Attributes:
        id: unique id.
        title: short title (indexed with the text).
        text: the passage.
    """

    __slots__ = ("id", "text", "title")

    def __init__(self, id: str, title: str, text: str) -> None:
        self.id = id
        self.title = title
        self.text = text

    def __repr__(self) -> str:
        return f"Passage(id={self.id!r}, title={self.title!r})"


def load_passages(path: str | Path) -> list[Passage]:
    """Read a JSONL corpus, one ``{"id": str, "title": str, "text": str}`` object per line.

    Raises:
        FileNotFoundError: when ``path`` does not exist.
        ValueError: naming the file and line of a malformed row or a duplicate id.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file {str(path)!r} does not exist")
    passages: list[Passage] = []
    seen: set[str] = set()
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({e.msg})") from None
            if not isinstance(row, dict) or "text" not in row:
                raise ValueError(f"{path}:{lineno}: a passage needs a 'text' field (and 'id', 'title')")
            pid = str(row.get("id", lineno))
            if pid in seen:
                raise ValueError(f"{path}:{lineno}: duplicate passage id {pid!r}")
            seen.add(pid)
            passages.append(Passage(pid, str(row.get("title", "")), str(row["text"])))
    if not passages:
        raise ValueError(f"corpus file {str(path)!r} holds no passages")
    return passages


_TOKEN_RE = re.compile(r"[a-z0-9]+")
_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "by",
        "did",
        "do",
        "does",
        "for",
        "from",
        "has",
        "have",
        "how",
        "in",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "that",
        "the",
        "to",
        "was",
        "were",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "whose",
        "why",
        "with",
    ]
)


def _terms(text: str) -> list[str]:
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in _STOPWORDS]


class LocalSearchTool:
    """BM25 (Okapi, ``k1``/``b``) search over a small in-memory corpus; returns the ``top_k`` passages.

    Args:
        passages: the corpus (see :func:`load_passages`).
        top_k: passages returned per query.
        k1: BM25 term-frequency saturation.
        b: BM25 length normalisation.
    """

    name = "search"
    description = "Search the knowledge base; returns the most relevant passages for a query."
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "what to look up"}},
        "required": ["query"],
    }

    def __init__(
        self, passages: Sequence[Passage], *, top_k: int = 2, k1: float = 1.5, b: float = 0.75
    ) -> None:
        if not passages:
            raise ValueError("LocalSearchTool: 'passages' must not be empty")
        if top_k < 1:
            raise ValueError(f"LocalSearchTool: 'top_k' must be >= 1, got {top_k}")
        self.passages = list(passages)
        self.top_k = top_k
        self.k1 = k1
        self.b = b
        self._tf = [Counter(_terms(f"{p.title} {p.text}")) for p in self.passages]
        self._len = [sum(c.values()) for c in self._tf]
        self._avg_len = sum(self._len) / len(self._len) or 1.0
        df: Counter[str] = Counter()
        for c in self._tf:
            df.update(c.keys())
        n = len(self.passages)
        self._idf = {t: math.log(1.0 + (n - d + 0.5) / (d + 0.5)) for t, d in df.items()}

    @classmethod
    def from_file(cls, path: str | Path, *, top_k: int = 2) -> LocalSearchTool:
        """Build the index from a JSONL corpus file (see :func:`load_passages`)."""
        return cls(load_passages(path), top_k=top_k)

    def scores(self, query: str) -> list[float]:
        """BM25 score of every passage for ``query`` (``[num_passages]``)."""
        terms = _terms(query)
        out = []
        for tf, length in zip(self._tf, self._len, strict=True):
            s = 0.0
            norm = self.k1 * (1.0 - self.b + self.b * length / self._avg_len)
            for t in terms:
                f = tf.get(t, 0)
                if f:
                    s += self._idf[t] * f * (self.k1 + 1.0) / (f + norm)
            out.append(s)
        return out

    def search(self, query: str) -> list[Passage]:
        """The ``top_k`` passages with a positive score, best first (ties: corpus order)."""
        scored = [(s, -i) for i, s in enumerate(self.scores(query)) if s > 0.0]
        scored.sort(reverse=True)
        return [self.passages[-i] for _, i in scored[: self.top_k]]

    def call(self, arguments: Mapping[str, Any]) -> str:
        """Search ``arguments["query"]``; the passages are numbered ``[1] title: text``, one per line.

        Raises:
            ToolError: when the query is missing or empty.
        """
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError("argument 'query' must be a non-empty string")
        hits = self.search(query)
        if not hits:
            return "No results."
        return "\n".join(f"[{i}] {p.title}: {p.text}" for i, p in enumerate(hits, 1))


# --------------------------------------------------------------------------------------------------- toolbox
def _check_arguments(tool: Tool, arguments: Mapping[str, Any]) -> str | None:
    props = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", ()) if k not in arguments]
    if missing:
        return f"missing argument(s) {missing} for tool {tool.name!r}; expected {sorted(props)}"
    unknown = [k for k in arguments if props and k not in props]
    if unknown:
        return f"unknown argument(s) {unknown} for tool {tool.name!r}; expected {sorted(props)}"
    return None


class Toolbox:
    """The tools of an agent, by name, with time-limited, exception-free execution.

    Args:
        tools: the tools (names must be unique).
        timeout_s: longest a call may run before its response is an error (the call's thread is abandoned).
        max_response_chars: responses are cut to this many characters (``" ...[truncated]"`` appended).
    """

    def __init__(
        self, tools: Iterable[Tool], *, timeout_s: float = 5.0, max_response_chars: int = 1000
    ) -> None:
        self.tools: dict[str, Tool] = {}
        for tool in tools:
            if tool.name in self.tools:
                raise ValueError(f"Toolbox: duplicate tool name {tool.name!r}")
            self.tools[tool.name] = tool
        if timeout_s <= 0:
            raise ValueError(f"Toolbox: 'timeout_s' must be > 0, got {timeout_s}")
        if max_response_chars < 16:
            raise ValueError(f"Toolbox: 'max_response_chars' must be >= 16, got {max_response_chars}")
        self.timeout_s = timeout_s
        self.max_response_chars = max_response_chars
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    def _executor(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="rlinf-tool")
        return self._pool

    def describe(self) -> list[dict[str, Any]]:
        """OpenAI-style function descriptions of the tools (for a system prompt or a chat template)."""
        return [
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": dict(t.parameters)},
            }
            for t in self.tools.values()
        ]

    def execute(self, call: ToolCall) -> tuple[str, bool]:
        """Run one call.

        Returns:
            ``(response, ok)``: the tool's output, or ``"Error: ..."`` with ``ok=False`` for an unknown tool,
            bad arguments, an exception in the tool or a timeout. Never raises.
        """
        tool = self.tools.get(call.name)
        if tool is None:
            return f"Error: unknown tool {call.name!r}; available: {', '.join(sorted(self.tools))}", False
        problem = _check_arguments(tool, call.arguments)
        if problem is not None:
            return f"Error: {problem}", False
        future = self._executor().submit(tool.call, call.arguments)
        try:
            out = future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            future.cancel()
            return f"Error: tool {call.name!r} timed out after {self.timeout_s:g} s", False
        except ToolError as e:
            return f"Error: {e}", False
        except Exception as e:  # a tool bug must not end the episode: the model sees it
            return f"Error: tool {call.name!r} failed: {type(e).__name__}: {e}", False
        return self._cut(str(out)), True

    def execute_many(self, calls: Sequence[ToolCall]) -> list[tuple[str, bool]]:
        """Run several calls (e.g. those of every episode in a turn); results in the order of ``calls``.

        The calls of a :class:`BatchTool` go to it as one :meth:`BatchTool.call_batch`; the others run one by
        one as in :meth:`execute`. Never raises.
        """
        out: list[tuple[str, bool] | None] = [None] * len(calls)
        batches: dict[str, list[int]] = {}
        for i, call in enumerate(calls):
            tool = self.tools.get(call.name)
            if isinstance(tool, BatchTool) and _check_arguments(tool, call.arguments) is None:
                batches.setdefault(call.name, []).append(i)
            else:
                out[i] = self.execute(call)
        for name, idx in batches.items():
            tool = self.tools[name]
            assert isinstance(tool, BatchTool)
            try:
                results: Sequence[str | ToolError] = tool.call_batch([calls[i].arguments for i in idx])
                if len(results) != len(idx):
                    raise ToolError(f"tool {name!r} returned {len(results)} results for {len(idx)} calls")
            except ToolError as e:
                results = [e] * len(idx)
            except Exception as e:  # a tool bug must not end the episodes: the model sees it
                results = [ToolError(f"tool {name!r} failed: {type(e).__name__}: {e}")] * len(idx)
            for i, r in zip(idx, results, strict=True):
                out[i] = (f"Error: {r}", False) if isinstance(r, ToolError) else (self._cut(str(r)), True)
        return [r for r in out if r is not None]

    def _cut(self, text: str) -> str:
        if len(text) > self.max_response_chars:
            return text[: self.max_response_chars] + " ...[truncated]"
        return text

    def close(self) -> None:
        """Stop the worker threads (calls still running are abandoned)."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
