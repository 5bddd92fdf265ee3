"""The agent loop on a real Hugging Face tokenizer + chat template and the HF generate engine (tiny model)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from rlinf_models.llm import LLMModelConfig, load_tokenizer
from rlinf_models.llm.testing import make_tiny_model_dir
from rlinf_rollout.agent import (
    AgentLoop,
    AgentLoopConfig,
    CalculatorTool,
    ChatFormatter,
    Toolbox,
    format_tool_call,
)
from rlinf_rollout.llm import HFGenerateEngine, SamplingConfig


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    torch.set_num_threads(1)
    yield make_tiny_model_dir(tmp_path_factory.mktemp("tiny_agent_model"))


class _TokenScript:
    """Replays fixed texts through the real tokenizer (one per turn), with made-up log-probs."""

    def __init__(self, tokenizer: Any, turns: Sequence[str]) -> None:
        self.tok = tokenizer
        self.turns = list(turns)
        self.k = 0

    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingConfig) -> list[dict[str, Any]]:
        assert isinstance(sampling, SamplingConfig) and "</tool_call>" in sampling.stop
        ids = self.tok.encode(self.turns[self.k], add_special_tokens=False)
        self.k += 1
        return [{"token_ids": ids, "logprobs": [-0.5] * len(ids), "finish_reason": "stop"} for _ in prompts]


def test_tool_turn_tokens_follow_the_real_chat_template(model_dir: Path) -> None:
    tok = load_tokenizer(LLMModelConfig(model_path=str(model_dir)))
    fmt = ChatFormatter(tok)
    assert fmt.assistant_close == "<|im_end|>\n"
    text = fmt.tool_turn_text(["391"])
    assert (
        text
        == "<|im_end|>\n<|im_start|>user\n<tool_response>\n391\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    )
    assert fmt.tool_turn_text(["391"], model_ended_with_eos=True).startswith("\n<|im_start|>user")
    # The appended ids are exactly what the template renders for the whole conversation.
    call = format_tool_call("calculator", {"expression": "17 * 23"})
    messages = [{"role": "user", "content": "What is 17 * 23?"}]
    engine = _TokenScript(tok, [call, "<answer>391</answer><|im_end|>"])
    loop = AgentLoop(engine, fmt, Toolbox([CalculatorTool()]), AgentLoopConfig())
    (ep,) = loop.run([loop.prompt_ids(messages)], SamplingConfig())
    assert ep.answer == "391" and ep.finish_reason == "answer"
    full = tok.apply_chat_template(
        [
            *messages,
            {"role": "assistant", "content": call},
            {"role": "user", "content": "<tool_response>\n391\n</tool_response>"},
            {"role": "assistant", "content": "<answer>391</answer>"},
        ],
        tokenize=False,
    )
    assert tok.decode(ep.token_ids) == full.rstrip("\n")
    model_text = tok.decode([t for t, m in zip(ep.token_ids, ep.loss_mask, strict=True) if m])
    assert model_text == call + "<answer>391</answer><|im_end|>"


def test_loop_drives_the_hf_engine_and_keeps_its_logprobs(model_dir: Path) -> None:
    cfg = LLMModelConfig(model_path=str(model_dir))
    engine = HFGenerateEngine(cfg, max_batch_size=4)
    tok = load_tokenizer(cfg)
    loop = AgentLoop(
        engine,
        ChatFormatter(tok),
        Toolbox([CalculatorTool()]),
        AgentLoopConfig(max_turns=2, max_new_tokens_per_turn=12),
    )
    prompts = [
        loop.prompt_ids([{"role": "user", "content": q}]) for q in ("What is 2 * 3?", "What is 4 + 5?")
    ]
    eps = loop.run(prompts, SamplingConfig(temperature=1.0, seed=0))
    for ep in eps:
        assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.rollout_logprobs)
        generated = [lp for lp, m in zip(ep.rollout_logprobs, ep.loss_mask, strict=True) if m]
        assert 0 < len(generated) <= 24 and all(lp <= 0.0 for lp in generated)
        assert ep.finish_reason in ("answer", "no_answer", "max_turns", "max_length")
        assert sum(ep.loss_mask) == sum(t.end - t.start for t in ep.turns)
    engine.shutdown()
