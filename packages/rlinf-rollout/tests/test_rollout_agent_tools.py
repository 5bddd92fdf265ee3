"""Tools of the agent loop: the safe calculator, BM25 search, the toolbox's error handling and parsing."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from rlinf_rollout.agent import (
    CalculatorTool,
    LocalSearchTool,
    Passage,
    Toolbox,
    ToolCall,
    ToolError,
    ToolsConfig,
    build_toolbox,
    extract_answer,
    load_passages,
    parse_turn,
    safe_eval_arithmetic,
)


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("17 * 23", 391),
        ("(2 + 3) * -4", -20),
        ("7 / 2", 3.5),
        ("2 ^ 10", 1024),
        ("1,234 + 1", 1235),
        ("9 // 2 % 3", 1),
    ],
)
def test_calculator_is_exact(expr: str, value: float) -> None:
    assert safe_eval_arithmetic(expr) == value


def test_calculator_formats_results() -> None:
    calc = CalculatorTool()
    assert calc.call({"expression": "123456789 * 987654321"}) == str(123456789 * 987654321)
    assert calc.call({"expression": "6 / 3"}) == "2"
    assert calc.call({"expression": "1 / 3"}) == "0.333333"


@pytest.mark.parametrize(
    "expr",
    [
        "__import__('os')",
        "abs(-1)",
        "x + 1",
        "(1).real",
        "[1, 2]",
        "1 if 1 else 2",
        "'a' * 3",
        "2 ** 10000",
        "1/0",
        "",
    ],
)
def test_calculator_rejects_everything_but_arithmetic(expr: str) -> None:
    with pytest.raises(ToolError):
        safe_eval_arithmetic(expr)


def test_bm25_ranks_the_passage_with_the_rare_terms_first(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "title": "Velmora", "text": "Velmora is a river town founded in 1802 by weavers."},
        {
            "id": "b",
            "title": "Quennix",
            "text": "Quennix is the capital of Zorblat; the town has a river port.",
        },
        {"id": "c", "title": "Cats", "text": "Cats purr when content."},
    ]
    path = tmp_path / "corpus.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    tool = LocalSearchTool.from_file(path, top_k=2)
    assert [p.id for p in tool.search("What is the capital of Zorblat?")] == ["b"]
    assert [p.id for p in tool.search("river town founded")] == ["a", "b"]
    assert tool.call({"query": "purr"}).startswith("[1] Cats: Cats purr")
    assert tool.call({"query": "unrelated words"}) == "No results."
    scores = tool.scores("river")
    assert scores[0] > 0 and scores[1] > 0 and scores[2] == 0


def test_corpus_errors_name_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: duplicate passage id 'a'"):
        load_passages(path)
    path.write_text('{"id": "a"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: a passage needs a 'text'"):
        load_passages(path)
    with pytest.raises(FileNotFoundError):
        load_passages(tmp_path / "missing.jsonl")


class _Slow:
    name = "slow"
    description = "sleeps"
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}, "required": []}

    def call(self, arguments: Mapping[str, Any]) -> str:
        time.sleep(1.0)
        return "late"


class _Buggy:
    name = "buggy"
    description = "raises"
    parameters: Mapping[str, Any] = {"type": "object", "properties": {}, "required": []}

    def call(self, arguments: Mapping[str, Any]) -> str:
        raise KeyError("boom")


def test_toolbox_turns_failures_and_timeouts_into_error_strings() -> None:
    box = Toolbox([CalculatorTool(), _Slow(), _Buggy()], timeout_s=0.2, max_response_chars=20)
    try:
        assert box.execute(ToolCall("calculator", {"expression": "2+2"})) == ("4", True)
        text, ok = box.execute(ToolCall("slow", {}))
        assert not ok and text == "Error: tool 'slow' timed out after 0.2 s"
        text, ok = box.execute(ToolCall("buggy", {}))
        assert not ok and "KeyError" in text and "boom" in text
        text, ok = box.execute(ToolCall("calculator", {}))
        assert not ok and "missing argument(s) ['expression']" in text
        text, ok = box.execute(ToolCall("calculator", {"expression": "10 ** 25"}))
        assert ok and text == "1" + "0" * 19 + " ...[truncated]"
        assert [d["function"]["name"] for d in box.describe()] == ["calculator", "slow", "buggy"]
    finally:
        box.close()
    with pytest.raises(ValueError, match="duplicate tool name 'calculator'"):
        Toolbox([CalculatorTool(), CalculatorTool()])


def test_parse_turn_reads_calls_and_the_last_answer() -> None:
    text = (
        'think <tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call> '
        '<tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"1+1\\"}"}</tool_call>'
    )
    parsed = parse_turn(text)
    assert parsed.tool_calls == [
        ToolCall("search", {"query": "x"}),
        ToolCall("calculator", {"expression": "1+1"}),
    ]
    assert parsed.errors == [] and parsed.answer is None and parsed.wants_tools
    assert len(parse_turn(text, max_calls=1).errors) == 1
    assert extract_answer("<answer> a </answer> then <answer>b</answer>") == "b"
    assert not parse_turn("<answer>b</answer>").wants_tools


def test_tools_config_validates_and_builds(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="allowed: calculator, search"):
        ToolsConfig(enabled=("calculator", "web"))
    with pytest.raises(ValueError, match=r"tools\.corpus_path is required"):
        ToolsConfig(enabled=("search",))
    (tmp_path / "c.jsonl").write_text('{"id": "1", "title": "T", "text": "hello world"}\n')
    box = build_toolbox(ToolsConfig(corpus_path="c.jsonl", search_top_k=1), base_dir=tmp_path)
    assert sorted(box.tools) == ["calculator", "search"]
    assert box.execute(ToolCall("search", {"query": "hello"}))[0] == "[1] T: hello world"
    assert isinstance(box.tools["search"], LocalSearchTool)
    assert LocalSearchTool([Passage("x", "", "y")]).top_k == 2
