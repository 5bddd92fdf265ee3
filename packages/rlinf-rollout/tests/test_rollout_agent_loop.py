"""A character-level ChatML tokenizer and a scripted engine for the agent loop tests."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

SPECIAL = ("<|im_start|>", "<|im_end|>")


class CharChatTokenizer:
    """Characters are tokens (id = ord + 2); ``<|im_start|>`` = 0, ``<|im_end|>`` = 1 (eos)."""

    eos_token = "<|im_end|>"
    eos_token_id = 1

    def apply_chat_template(
        self,
        conversation: Sequence[Mapping[str, str]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
    ) -> str:
        assert not tokenize
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in conversation)
        return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            for sid, tok in enumerate(SPECIAL):
                if text.startswith(tok, i):
                    ids.append(sid)
                    i += len(tok)
                    break
            else:
                ids.append(ord(text[i]) + 2)
                i += 1
        return ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        out = []
        for t in token_ids:
            if t < 2:
                if not skip_special_tokens:
                    out.append(SPECIAL[t])
            else:
                out.append(chr(t - 2))
        return "".join(out)


class ScriptedEngine:
    """Answers each prompt with ``script(prompt_text, turn_index)``; honours ``stop`` and ``max_new_tokens``.

    Log-prob of the k-th generated token = ``-(k + 1) / 100`` (distinct, checkable). A response ending with
    ``<|im_end|>`` stops there with finish ``"stop"``.
    """

    def __init__(self, tokenizer: CharChatTokenizer, script: Callable[[str, int], str]) -> None:
        self.tok = tokenizer
        self.script = script
        self.calls: list[tuple[int, Any]] = []

    def generate(self, prompts: Sequence[Sequence[int]], sampling: Any) -> list[dict[str, Any]]:
        self.calls.append((len(prompts), sampling))
        outs = []
        for p in prompts:
            text = self.tok.decode(list(p))
            turn = text.count("<|im_start|>assistant") - 1
            response = self.script(text, turn)
            finish = "stop"
            for s in sampling.get("stop", ()):
                cut = response.find(s)
                if cut >= 0:
                    response = response[: cut + len(s)]
            ids = self.tok.encode(response)
            if len(ids) > sampling["max_new_tokens"]:
                ids, finish = ids[: sampling["max_new_tokens"]], "length"
            outs.append(
                {
                    "token_ids": ids,
                    "logprobs": [-(k + 1) / 100 for k in range(len(ids))],
                    "finish_reason": finish,
                    "text": self.tok.decode(ids),
                }
            )
        return outs


# ------------------------------------------------------------------------------------------------------ tests
import json  # noqa: E402

import pytest  # noqa: E402
from rlinf_rollout.agent import (  # noqa: E402
    AgentLoop,
    AgentLoopConfig,
    CalculatorTool,
    ChatFormatter,
    LocalSearchTool,
    Passage,
    Toolbox,
    format_tool_call,
)

SAMPLING = {"temperature": 1.0, "max_new_tokens": 999, "stop": ()}


def _loop(script: Callable[[str, int], str], **cfg: Any) -> tuple[AgentLoop, ScriptedEngine]:
    tok = CharChatTokenizer()
    engine = ScriptedEngine(tok, script)
    passages = [
        Passage("p1", "Zorblat", "The capital of Zorblat is Quennix."),
        Passage("p2", "Misc", "Cats purr."),
    ]
    toolbox = Toolbox([CalculatorTool(), LocalSearchTool(passages, top_k=1)], timeout_s=2.0)
    return AgentLoop(engine, ChatFormatter(tok), toolbox, AgentLoopConfig(**cfg)), engine


def _prompt(loop: AgentLoop, q: str) -> list[int]:
    return loop.prompt_ids([{"role": "system", "content": "tools"}, {"role": "user", "content": q}])


def _calc_then_answer(text: str, turn: int) -> str:
    if turn == 0:
        return "Let me compute. " + format_tool_call("calculator", {"expression": "17 * 23"}) + "junk after"
    result = text.rsplit("<tool_response>\n", 1)[1].split("\n</tool_response>", 1)[0]
    return f"<answer>{result}</answer><|im_end|>"


def test_masks_are_exactly_the_model_tokens_and_tool_output_is_not_trained() -> None:
    loop, engine = _loop(_calc_then_answer)
    tok = loop.formatter.tokenizer
    prompt = _prompt(loop, "What is 17 * 23?")
    (ep,) = loop.run([prompt], SAMPLING, metas=[{"answer": "391"}])
    assert ep.finish_reason == "answer" and ep.answer == "391" and ep.meta == {"answer": "391"}
    assert len(ep.turns) == 2
    n = len(ep.token_ids)
    assert len(ep.loss_mask) == len(ep.rollout_logprobs) == n
    assert ep.token_ids[: len(prompt)] == prompt
    # The masked positions are exactly the turns' spans, and those decode to what the engine produced.
    trained = [i for i, m in enumerate(ep.loss_mask) if m]
    spans = [i for t in ep.turns for i in range(t.start, t.end)]
    assert trained == spans
    first = ep.turns[0]
    assert tok.decode(ep.token_ids[first.start : first.end]).endswith("</tool_call>")  # stop string honoured
    assert "junk after" not in ep.response_text
    assert ep.rollout_logprobs[first.start] == pytest.approx(-0.01)
    assert all(lp == 0.0 for i, lp in enumerate(ep.rollout_logprobs) if not ep.loss_mask[i])
    # The tool output sits between the turns, untrained, and holds the exact product.
    gap = tok.decode(ep.token_ids[first.end : ep.turns[1].start])
    assert (
        gap
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert all(ep.loss_mask[i] == 0 for i in range(first.end, ep.turns[1].start))
    assert first.tool_calls == [{"name": "calculator", "arguments": {"expression": "17 * 23"}}]
    assert first.tool_responses == ["391"] and first.num_errors == 0
    # The engine saw the stop string and a per-turn token budget.
    assert all("</tool_call>" in s["stop"] and s["max_new_tokens"] == 128 for _, s in engine.calls)
    d = ep.to_dict()
    assert (
        json.loads(json.dumps(d))["num_tool_calls"] == 1 and d["turns"][1]["text"] == "<answer>391</answer>"
    )


def test_malformed_calls_get_error_responses_not_crashes() -> None:
    bad = [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "calculator", "arguments": [1]}</tool_call>',
        format_tool_call("nope", {}),
        format_tool_call("calculator", {"expr": "1+1"}),
        format_tool_call("calculator", {"expression": "__import__('os').system('echo hi')"}),
        format_tool_call("calculator", {"expression": "1/0"}),
        format_tool_call("search", {"query": ""}),
        "<tool_call>{",
    ]

    def script(text: str, turn: int) -> str:
        return bad[turn] if turn < len(bad) else "<answer>done</answer>"

    loop, _ = _loop(script, max_turns=len(bad) + 1, max_total_tokens=20000)
    (ep,) = loop.run([_prompt(loop, "q")], SAMPLING)
    assert ep.finish_reason == "answer" and len(ep.turns) == len(bad) + 1
    responses = [t.tool_responses for t in ep.turns[:-1]]
    assert all(len(r) == 1 and r[0].startswith("Error: ") for r in responses), responses
    assert all(t.num_errors == 1 for t in ep.turns[:-1])
    assert "not valid JSON" in responses[0][0]
    assert "unknown tool 'nope'" in responses[3][0] and "calculator, search" in responses[3][0]
    assert "unsupported expression element" in responses[5][0]
    assert "division by zero" in responses[6][0]
    assert "without a closing" in responses[8][0]
    assert ep.num_tool_errors == len(bad)


def test_limits_end_episodes_and_batches_advance_together() -> None:
    def loop_forever(text: str, turn: int) -> str:
        q = text.split("<|im_start|>user\n", 1)[1].split("<|im_end|>", 1)[0]
        if "never" in text:
            return format_tool_call("search", {"query": "capital of Zorblat"})
        if "silent" in text:
            return "I do not know.<|im_end|>"
        return f"<answer>{q}</answer>"

    loop, engine = _loop(loop_forever, max_turns=3, max_total_tokens=2000)
    prompts = [_prompt(loop, q) for q in ("never", "silent", "ask")]
    eps = loop.run(prompts, SAMPLING)
    assert [e.finish_reason for e in eps] == ["max_turns", "no_answer", "answer"]
    assert len(eps[0].turns) == 3 and "Quennix" in eps[0].turns[0].tool_responses[0]
    assert eps[1].answer is None and eps[1].response_text == "I do not know."
    assert engine.calls[0][0] == 3 and engine.calls[1][0] == 1  # finished episodes leave the batch
    # A token cap ends an episode before the next turn has no room; nothing exceeds it.
    loop2, _ = _loop(loop_forever, max_turns=50, max_total_tokens=300)
    (ep,) = loop2.run([prompts[0]], SAMPLING)
    assert ep.finish_reason == "max_length" and len(ep.token_ids) <= 300
    assert sum(ep.loss_mask) == sum(t.end - t.start for t in ep.turns)


def test_turn_budget_truncates_to_length() -> None:
    loop, _ = _loop(lambda _t, _i: "x" * 500, max_new_tokens_per_turn=32)
    (ep,) = loop.run([_prompt(loop, "q")], SAMPLING)
    assert ep.finish_reason == "max_length" and ep.turns[0].generation_finish == "length"
    assert sum(ep.loss_mask) == 32


def test_prompt_longer_than_the_limit_is_rejected() -> None:
    loop, _ = _loop(lambda _t, _i: "", max_total_tokens=10)
    with pytest.raises(ValueError, match="max_total_tokens"):
        loop.run([_prompt(loop, "a long question")], SAMPLING)
