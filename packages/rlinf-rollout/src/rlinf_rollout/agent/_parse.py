"""Parsing a model turn: Qwen/Hermes-style ``<tool_call>{json}</tool_call>`` blocks and ``<answer>...</answer>``."""

from __future__ import annotations

import json
import re

from ._tools import ToolCall

__all__ = [
    "ANSWER_CLOSE",
    "ANSWER_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ParsedTurn",
    "extract_answer",
    "format_tool_call",
    "parse_turn",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

_TOOL_CALL_RE = re.compile(re.escape(TOOL_CALL_OPEN) + r"(.*?)" + re.escape(TOOL_CALL_CLOSE), re.DOTALL)
_ANSWER_RE = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)


class ParsedTurn:
    """What one model turn asked for.

    Attributes:
        tool_calls: the well-formed calls, in order.
        errors: one message per malformed ``<tool_call>`` block (each gets an error response).
        answer: the text of the last ``<answer>...</answer>``, stripped, or ``None``.
    """

    __slots__ = ("answer", "errors", "tool_calls")

    def __init__(self, tool_calls: list[ToolCall], errors: list[str], answer: str | None) -> None:
        self.tool_calls = tool_calls
        self.errors = errors
        self.answer = answer

    @property
    def wants_tools(self) -> bool:
        """Whether the turn holds a tool call block (well-formed or not)."""
        return bool(self.tool_calls or self.errors)

    def __repr__(self) -> str:
        return f"ParsedTurn(tool_calls={self.tool_calls!r}, errors={self.errors!r}, answer={self.answer!r})"


def extract_answer(text: str) -> str | None:
    """The stripped content of the LAST ``<answer>...</answer>`` in ``text``, or ``None``."""
    matches = _ANSWER_RE.findall(text)
    return matches[-1].strip() if matches else None


def _parse_call(body: str) -> ToolCall | str:
    body = body.strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as e:
        return f"the tool call is not valid JSON ({e.msg} at char {e.pos}): {body[:80]!r}"
    if not isinstance(obj, dict):
        return f'a tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, got {type(obj).__name__}'
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return 'the tool call has no "name" string'
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return f'"arguments" of {name!r} is a string that is not a JSON object: {args[:80]!r}'
    if not isinstance(args, dict):
        return f'"arguments" of {name!r} must be a JSON object, got {type(args).__name__}'
    return ToolCall(name, args)


def parse_turn(text: str, *, max_calls: int = 4) -> ParsedTurn:
    """Parse the tool calls and the final answer of one model turn.

    A ``<tool_call>`` block whose body is not a JSON object with a ``"name"`` string and an ``"arguments"``
    object (a JSON-encoded object string is accepted) is reported in ``errors``; so is an opening tag without
    its closing tag, and calls beyond ``max_calls``.

    Args:
        text: the decoded model output of the turn.
        max_calls: calls executed per turn at most.
    """
    calls: list[ToolCall] = []
    errors: list[str] = []
    for match in _TOOL_CALL_RE.finditer(text):
        parsed = _parse_call(match.group(1))
        if isinstance(parsed, str):
            errors.append(parsed)
        elif len(calls) >= max_calls:
            errors.append(f"at most {max_calls} tool calls per turn; {parsed.name!r} was not run")
        else:
            calls.append(parsed)
    tail = _TOOL_CALL_RE.sub("", text)
    if TOOL_CALL_OPEN in tail:
        errors.append(f"{TOOL_CALL_OPEN} without a closing {TOOL_CALL_CLOSE}")
    return ParsedTurn(calls, errors, extract_answer(text))


def format_tool_call(name: str, arguments: dict[str, object]) -> str:
    """The canonical text of a call: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""
    body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}{body}{TOOL_CALL_CLOSE}"
