"""The multi-turn agent loop: generate → parse → run tools → append their output → generate … per episode.

All active episodes of a batch advance together: one ``engine.generate`` call per turn (per distinct token
budget). Model tokens get ``loss_mask`` 1 and keep their rollout log-probs; the template tokens and tool
outputs appended between turns get ``loss_mask`` 0 and log-prob 0, so they are never trained.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal, Protocol

import attrs
from attrs import validators as v

from ._chat import ChatFormatter
from ._parse import TOOL_CALL_CLOSE, ParsedTurn, parse_turn
from ._tools import Toolbox

__all__ = [
    "FINISH_REASONS",
    "AgentEpisode",
    "AgentLoop",
    "AgentLoopConfig",
    "AgentTurn",
    "SupportsGenerate",
]

FINISH_REASONS = ("answer", "no_answer", "max_turns", "max_length")
"""Why an episode ended: an ``<answer>``; a turn with neither answer nor tool call; the turn limit; the token limit."""


@attrs.frozen(kw_only=True)
class AgentLoopConfig:
    """The agent loop (config ``rollout.agent``)."""

    max_turns: int = attrs.field(default=4, validator=v.ge(1))
    """Model turns per episode at most (a turn = one generation, possibly followed by tool calls)."""
    max_new_tokens_per_turn: int = attrs.field(default=128, validator=v.ge(1))
    """Tokens one model turn may generate."""
    max_total_tokens: int = attrs.field(default=1024, validator=v.ge(2))
    """Prompt + every turn + every tool response at most; an episode reaching it ends (``max_length``)."""
    max_tool_calls_per_turn: int = attrs.field(default=2, validator=v.ge(1))
    """Calls run per turn; extra calls get an error response."""
    tool_role: Literal["user", "tool"] = attrs.field(default="user", validator=v.in_(("user", "tool")))
    """Role of the message carrying tool responses in the chat template."""
    wrap_tool_response: bool = True
    """Wrap responses in ``<tool_response>...</tool_response>`` (false if the template does it)."""
    stop: tuple[str, ...] = (TOOL_CALL_CLOSE,)
    """Stop strings of each turn besides eos (a turn ends right after its tool call)."""


class SupportsGenerate(Protocol):
    """A generation engine (``rlinf_rollout.llm.GenerationEngine`` fits)."""

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Any) -> Sequence[Any]: ...


@dataclasses.dataclass
class AgentTurn:
    """One model turn of an episode.

    Attributes:
        start: index in ``AgentEpisode.token_ids`` of the turn's first model token.
        end: one past its last model token (the tool response, if any, starts here).
        text: the decoded model tokens.
        tool_calls: the well-formed calls (``{"name", "arguments"}``).
        tool_responses: the responses: one error per malformed call block first, then one per call.
        num_errors: responses that are errors (malformed call, unknown tool, bad arguments, failure, timeout).
        generation_finish: the engine's ``finish_reason`` (``"stop"`` or ``"length"``).
    """

    start: int
    end: int
    text: str
    tool_calls: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    tool_responses: list[str] = dataclasses.field(default_factory=list)
    num_errors: int = 0
    generation_finish: str = "stop"


@dataclasses.dataclass
class AgentEpisode:
    """A finished episode, ready for the reward and the actor.

    Attributes:
        prompt_ids: ``[P]`` the first prompt.
        token_ids: ``[T]`` prompt + every model turn + every tool turn (``T <= max_total_tokens``).
        loss_mask: ``[T]`` 1 exactly on model-generated tokens.
        rollout_logprobs: ``[T]`` the engine's log-prob of each model token (0.0 elsewhere).
        turns: the model turns, in order.
        answer: the final ``<answer>`` text, or ``None``.
        finish_reason: one of :data:`FINISH_REASONS`.
        meta: the request's extra fields (passed through, e.g. the reference answer).
    """

    prompt_ids: list[int]
    token_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    turns: list[AgentTurn]
    answer: str | None = None
    finish_reason: str = "no_answer"
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def response_text(self) -> str:
        """The model's text of every turn, concatenated (tool outputs excluded)."""
        return "".join(t.text for t in self.turns)

    @property
    def num_tool_calls(self) -> int:
        """Tool call blocks over the episode (well-formed or not)."""
        return sum(len(t.tool_responses) for t in self.turns)

    @property
    def num_tool_errors(self) -> int:
        """Error responses over the episode."""
        return sum(t.num_errors for t in self.turns)

    def to_dict(self) -> dict[str, Any]:
        """Plain Python containers (picklable, JSON-able)."""
        out = dataclasses.asdict(self)
        out["response_text"] = self.response_text
        out["num_tool_calls"] = self.num_tool_calls
        out["num_tool_errors"] = self.num_tool_errors
        return out


def _field(out: Any, name: str) -> Any:
    return out[name] if isinstance(out, Mapping) else getattr(out, name)


def _with_limits(sampling: Any, max_new_tokens: int, stop: tuple[str, ...]) -> Any:
    """A copy of ``sampling`` (attrs, dataclass or dict) with the turn's token budget and stop strings."""
    if isinstance(sampling, Mapping):
        merged = tuple(dict.fromkeys((*tuple(sampling.get("stop", ())), *stop)))
        return {**sampling, "max_new_tokens": max_new_tokens, "stop": merged}
    merged = tuple(dict.fromkeys((*tuple(getattr(sampling, "stop", ())), *stop)))
    if attrs.has(type(sampling)):
        return attrs.evolve(sampling, max_new_tokens=max_new_tokens, stop=merged)
    if dataclasses.is_dataclass(sampling) and not isinstance(sampling, type):
        return dataclasses.replace(sampling, max_new_tokens=max_new_tokens, stop=merged)
    raise TypeError(
        f"sampling must be a mapping, an attrs class or a dataclass with max_new_tokens/stop, got {type(sampling)}"
    )


class AgentLoop:
    """Runs batches of tool-using episodes on a generation engine.

    Args:
        engine: anything with ``generate(prompts, sampling) -> outputs``; each output has (as attributes or
            keys) ``token_ids``, ``logprobs`` and ``finish_reason``, optionally ``text``.
        formatter: the chat formatting (tokenizer + template).
        toolbox: the tools.
        cfg: limits and formatting.
    """

    def __init__(
        self, engine: SupportsGenerate, formatter: ChatFormatter, toolbox: Toolbox, cfg: AgentLoopConfig
    ) -> None:
        self.engine = engine
        self.formatter = formatter
        self.toolbox = toolbox
        self.cfg = cfg

    def prompt_ids(self, messages: Sequence[Mapping[str, str]]) -> list[int]:
        """The first prompt of an episode (chat template + generation prompt)."""
        return self.formatter.prompt_ids(messages)

    def run(
        self,
        prompts: Sequence[Sequence[int]],
        sampling: Any,
        *,
        metas: Sequence[Mapping[str, Any]] | None = None,
    ) -> list[AgentEpisode]:
        """Run one episode per prompt until each answers or hits a limit.

        Args:
            prompts: ``[N][P_i]`` first prompts (see :meth:`prompt_ids`).
            sampling: the engine's sampling parameters; ``max_new_tokens`` and ``stop`` are set per turn.
            metas: ``[N]`` extra fields copied into each episode's ``meta``.

        Returns:
            ``[N]`` episodes in the order of ``prompts``.

        Raises:
            ValueError: when a prompt is empty or longer than ``max_total_tokens - 1``.
        """
        cfg = self.cfg
        if metas is not None and len(metas) != len(prompts):
            raise ValueError(f"metas must have one entry per prompt: {len(metas)} vs {len(prompts)}")
        episodes: list[AgentEpisode] = []
        for i, p in enumerate(prompts):
            if not 0 < len(p) < cfg.max_total_tokens:
                raise ValueError(
                    f"prompt {i} has {len(p)} tokens; it must have 1 to max_total_tokens - 1 "
                    f"({cfg.max_total_tokens - 1}) tokens"
                )
            episodes.append(
                AgentEpisode(
                    prompt_ids=list(p),
                    token_ids=list(p),
                    loss_mask=[0] * len(p),
                    rollout_logprobs=[0.0] * len(p),
                    turns=[],
                    meta=dict(metas[i]) if metas is not None else {},
                )
            )
        active = list(range(len(episodes)))
        while active:
            by_budget: dict[int, list[int]] = {}
            for i in active:
                budget = min(cfg.max_new_tokens_per_turn, cfg.max_total_tokens - len(episodes[i].token_ids))
                by_budget.setdefault(budget, []).append(i)
            calling: list[tuple[int, ParsedTurn]] = []
            for budget, idx in by_budget.items():
                outs = self.engine.generate(
                    [episodes[i].token_ids for i in idx], _with_limits(sampling, budget, cfg.stop)
                )
                if len(outs) != len(idx):
                    raise RuntimeError(f"the engine returned {len(outs)} outputs for {len(idx)} prompts")
                for i, out in zip(idx, outs, strict=True):
                    parsed = self._take_turn(episodes[i], out, budget)
                    if parsed is not None:
                        calling.append((i, parsed))
            # Every episode's tool calls of this turn run together: a batch tool (the retriever) gets one request.
            calls = [c for _, parsed in calling for c in parsed.tool_calls]
            results = iter(self.toolbox.execute_many(calls))
            still = [
                i
                for i, parsed in calling
                if self._answer_tools(episodes[i], parsed, [next(results) for _ in parsed.tool_calls])
            ]
            active = sorted(still)
        return episodes

    def _take_turn(self, ep: AgentEpisode, out: Any, budget: int) -> ParsedTurn | None:
        """Append one generated turn; returns its parse when it calls tools (else the episode ended: ``None``)."""
        cfg = self.cfg
        ids = [int(t) for t in _field(out, "token_ids")][:budget]
        lps = [float(x) for x in _field(out, "logprobs")][: len(ids)]
        if len(lps) != len(ids):
            raise RuntimeError(f"the engine returned {len(ids)} tokens but {len(lps)} logprobs")
        finish = str(_field(out, "finish_reason"))
        # Special tokens stay in: a tokenizer may register <tool_call> as one. Only a closing eos is dropped.
        text = self.formatter.tokenizer.decode(ids, skip_special_tokens=False)
        eos_text = self.formatter.eos_token
        if eos_text and text.endswith(eos_text):
            text = text[: -len(eos_text)]
        start = len(ep.token_ids)
        ep.token_ids += ids
        ep.loss_mask += [1] * len(ids)
        ep.rollout_logprobs += lps
        turn = AgentTurn(start=start, end=len(ep.token_ids), text=text, generation_finish=finish)
        ep.turns.append(turn)
        parsed = parse_turn(text, max_calls=cfg.max_tool_calls_per_turn)
        if parsed.answer is not None:
            ep.answer = parsed.answer
            ep.finish_reason = "answer"
            return None
        if not parsed.wants_tools:
            ep.finish_reason = "max_length" if finish == "length" else "no_answer"
            return None
        return parsed

    def _answer_tools(
        self, ep: AgentEpisode, parsed: ParsedTurn, results: Sequence[tuple[str, bool]]
    ) -> bool:
        """Record the last turn's tool results and append them; returns whether the episode continues."""
        cfg = self.cfg
        turn = ep.turns[-1]
        responses = [f"Error: {e}" for e in parsed.errors]
        turn.num_errors = len(parsed.errors)
        for call, (response, ok) in zip(parsed.tool_calls, results, strict=True):
            turn.tool_calls.append(call.to_dict())
            responses.append(response)
            turn.num_errors += 0 if ok else 1
        turn.tool_responses = responses
        if len(ep.turns) >= cfg.max_turns:
            ep.finish_reason = "max_turns"
            return False
        eos = self.formatter.eos_token_id
        ids = ep.token_ids[turn.start : turn.end]
        tool_ids = self.formatter.tool_turn_ids(responses, model_ended_with_eos=bool(ids) and ids[-1] == eos)
        # The next turn needs room for at least one generated token.
        if len(ep.token_ids) + len(tool_ids) >= cfg.max_total_tokens:
            ep.finish_reason = "max_length"
            return False
        ep.token_ids += tool_ids
        ep.loss_mask += [0] * len(tool_ids)
        ep.rollout_logprobs += [0.0] * len(tool_ids)
        return True
