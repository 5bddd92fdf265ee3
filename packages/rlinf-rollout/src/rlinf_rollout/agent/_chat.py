"""Token-level chat formatting for the agent loop: the first prompt and the tool-response turns.

Tool responses are rendered by the tokenizer's own chat template: the text the template adds after an
assistant message (closing it) plus a tool/user message plus the generation prompt of the next assistant
turn is found by rendering a reference conversation with and without the tool message. Those tokens are
appended after the model's tokens as they are (no re-tokenisation of model output), so the rollout log-probs
stay valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

from ._parse import ANSWER_CLOSE, ANSWER_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from ._tools import Toolbox

__all__ = ["DEFAULT_AGENT_INSTRUCTIONS", "ChatFormatter", "ChatTokenizer", "build_system_prompt"]

_SENTINEL = "\x00RLINF_ASSISTANT_END\x00"

DEFAULT_AGENT_INSTRUCTIONS = (
    "Answer the question. You may call a tool by writing "
    f'{TOOL_CALL_OPEN}{{"name": "<tool>", "arguments": {{...}}}}{TOOL_CALL_CLOSE}; '
    "its result comes back in <tool_response></tool_response>. "
    f"Give the final answer as {ANSWER_OPEN}...{ANSWER_CLOSE}."
)


class ChatTokenizer(Protocol):
    """The parts of a Hugging Face tokenizer the agent loop uses."""

    eos_token: Any
    eos_token_id: Any

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...

    def encode(self, text: str, **kwargs: Any) -> list[int]: ...

    def decode(self, token_ids: Any, **kwargs: Any) -> str: ...


def build_system_prompt(toolbox: Toolbox, instructions: str = DEFAULT_AGENT_INSTRUCTIONS) -> str:
    """The system message: ``instructions`` and one line per tool (name, description, argument names)."""
    lines = [instructions, "Tools:"]
    for tool in toolbox.tools.values():
        args = ", ".join(tool.parameters.get("properties", {}))
        lines.append(f"- {tool.name}({args}): {tool.description}")
    return "\n".join(lines)


class ChatFormatter:
    """Turns conversations into token ids with the tokenizer's chat template.

    Args:
        tokenizer: a Hugging Face tokenizer with a chat template.
        tool_role: the role of the message carrying tool responses (``"user"``: every template knows it,
            Qwen's template renders ``"tool"`` messages as a user turn too).
        wrap_tool_response: wrap each response in ``<tool_response>`` ... ``</tool_response>`` (set false when
            the template wraps ``"tool"`` messages itself, as Qwen2.5's does).
    """

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        *,
        tool_role: Literal["user", "tool"] = "user",
        wrap_tool_response: bool = True,
    ) -> None:
        if tool_role not in ("user", "tool"):
            raise ValueError(f"ChatFormatter: 'tool_role' must be 'user' or 'tool', got {tool_role!r}")
        self.tokenizer = tokenizer
        self.tool_role = tool_role
        self.wrap_tool_response = wrap_tool_response
        eos = tokenizer.eos_token_id
        self.eos_token_id: int | None = eos if isinstance(eos, int) else None
        self.eos_token: str | None = tokenizer.eos_token if isinstance(tokenizer.eos_token, str) else None
        base = [{"role": "user", "content": "q"}, {"role": "assistant", "content": _SENTINEL}]
        rendered = self._render(base, add_generation_prompt=False)
        cut = rendered.find(_SENTINEL)
        if cut < 0:
            raise ValueError("ChatFormatter: the chat template drops assistant message content")
        self._prefix = rendered[: cut + len(_SENTINEL)]
        self._base = base
        self.assistant_close = rendered[cut + len(_SENTINEL) :]
        """What the template writes after an assistant message's content (e.g. ``<|im_end|>\\n``)."""

    def _render(self, messages: Sequence[Mapping[str, str]], *, add_generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        if not isinstance(text, str):
            raise TypeError(f"apply_chat_template(tokenize=False) returned {type(text).__name__}, not str")
        return text

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without added special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """Token ids of ``messages`` followed by the assistant generation prompt."""
        return self.encode(self._render(messages, add_generation_prompt=True))

    def tool_message(self, responses: Sequence[str]) -> dict[str, str]:
        """The message carrying the responses of one turn's tool calls."""
        if self.wrap_tool_response:
            content = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in responses)
        else:
            content = "\n".join(responses)
        return {"role": self.tool_role, "content": content}

    def tool_turn_text(self, responses: Sequence[str], *, model_ended_with_eos: bool = False) -> str:
        """Text appended after a model turn: the template's assistant close, the tool message, the next prompt.

        Args:
            responses: one string per tool call of the turn.
            model_ended_with_eos: the model's tokens already end with the eos token (it is not repeated).
        """
        full = self._render([*self._base, self.tool_message(responses)], add_generation_prompt=True)
        if not full.startswith(self._prefix):
            raise ValueError(
                "ChatFormatter: the chat template re-renders earlier messages when one is appended"
            )
        text = full[len(self._prefix) :]
        if model_ended_with_eos and self.eos_token and text.startswith(self.eos_token):
            text = text[len(self.eos_token) :]
        return text

    def tool_turn_ids(self, responses: Sequence[str], *, model_ended_with_eos: bool = False) -> list[int]:
        """Token ids of :meth:`tool_turn_text` (never trained: loss mask 0)."""
        return self.encode(self.tool_turn_text(responses, model_ended_with_eos=model_ended_with_eos))
