"""The retrieval service pieces: BM25 against the formula, the retriever worker, the batched search tool."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from rlinf_rollout.agent import (
    BM25Index,
    Passage,
    RetrievalSearchTool,
    RetrieverConfig,
    Toolbox,
    ToolCall,
    ToolsConfig,
    build_toolbox,
    format_passages,
    tokenize,
)

# Three passages; terms after tokenising (stopwords dropped), title first:
#   a: [apple, pie, apple]          (3 terms)
#   b: [pear, tart, apple, pear]    (4 terms)
#   c: [plum]                       (1 term)
PASSAGES = [
    Passage("a", "Apple", "pie, the apple!"),
    Passage("b", "Pear", "A tart of apple and PEAR."),
    Passage("c", "Plum", ""),
]


def _bm25(
    f: int, n_t: int, length: int, *, n: int = 3, avg: float = 8 / 3, k1: float = 0.9, b: float = 0.4
) -> float:
    idf = math.log(1 + (n - n_t + 0.5) / (n_t + 0.5))
    return idf * f * (k1 + 1) / (f + k1 * (1 - b + b * length / avg))


def test_tokenize_lowercases_strips_punctuation_and_stopwords() -> None:
    assert tokenize("The Apple-pie, of Zürich!") == ["apple", "pie", "zürich"]
    assert tokenize("the of", stopwords=False) == ["the", "of"]
    assert tokenize("snake_case") == ["snake", "case"]


def test_bm25_matches_the_formula_by_hand() -> None:
    index = BM25Index(PASSAGES)
    assert index.doc_len.tolist() == [3.0, 4.0, 1.0]
    s = index.scores("apple")
    # "apple": in a twice (|a| = 3) and in b once (|b| = 4): n(apple) = 2.
    assert s[0] == pytest.approx(_bm25(2, 2, 3))
    assert s[1] == pytest.approx(_bm25(1, 2, 4))
    assert s[2] == 0.0
    # Two terms add up; "pear" is in b only (twice).
    s = index.scores("apple pear")
    assert s[1] == pytest.approx(_bm25(1, 2, 4) + _bm25(2, 1, 4))
    # Other k1 / b
    other = BM25Index(PASSAGES, k1=1.5, b=0.75)
    assert other.scores("pie")[0] == pytest.approx(_bm25(1, 1, 3, k1=1.5, b=0.75))


def test_bm25_top_k_order_ties_and_empty_queries() -> None:
    index = BM25Index(PASSAGES)
    assert [i for i, _ in index.top_k("apple", 5)] == [0, 1]  # only positive scores
    assert [i for i, _ in index.top_k("apple", 1)] == [0]
    same = BM25Index([Passage("x", "", "kiwi"), Passage("y", "", "kiwi")])
    assert [i for i, _ in same.top_k("kiwi", 2)] == [0, 1]  # ties: corpus order
    assert index.search(["", "the of", "durian"], 2) == [[], [], []]
    with pytest.raises(ValueError, match="'k' must be >= 1"):
        index.top_k("apple", 0)
    with pytest.raises(ValueError, match="'b' must be in"):
        BM25Index(PASSAGES, b=2.0)


def test_retriever_worker_batches_and_top_k(tmp_path: Path) -> None:
    from rlinf_rollout.agent import RetrieverWorker

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(f'{{"id": "{p.id}", "title": "{p.title}", "text": "{p.text}"}}' for p in PASSAGES),
        encoding="utf-8",
    )
    worker = RetrieverWorker(RetrieverConfig(), str(corpus))  # outside a group: a plain object
    assert worker.num_passages() == 3
    out = worker.search(["apple", "", "plum", "apple"], 1)
    assert [[h["id"] for h in hits] for hits in out] == [["a"], [], ["c"], ["a"]]
    assert set(out[0][0]) == {"id", "title", "text", "score"} and out[0][0]["score"] > 0
    assert [h["id"] for h in worker.search(["apple"], 3)[0]] == ["a", "b"]
    assert worker.search([], 2) == []
    with pytest.raises(ValueError, match="top_k"):
        worker.search(["apple"], 0)
    with pytest.raises(FileNotFoundError):
        RetrieverWorker(RetrieverConfig(), str(tmp_path / "missing.jsonl"))


class _Backend:
    def __init__(self) -> None:
        self.requests: list[list[str]] = []
        self.index = BM25Index(PASSAGES)

    def search(self, queries: Sequence[str], top_k: int) -> list[list[dict[str, Any]]]:
        self.requests.append(list(queries))
        return self.index.search(queries, top_k)


def test_search_tool_formats_like_search_r1_and_batches_one_request() -> None:
    backend = _Backend()
    tool = RetrievalSearchTool(backend, top_k=2)
    assert (
        tool.call({"query": "apple"})
        == "Doc 1(Title: Apple) pie, the apple!\nDoc 2(Title: Pear) A tart of apple and PEAR."
    )
    assert format_passages([]) == "No search results are found."
    tagged = RetrievalSearchTool(backend, top_k=1, information_tags=True)
    assert tagged.call({"query": "plum"}) == "<information>Doc 1(Title: Plum) </information>"
    backend.requests.clear()
    box = Toolbox([tool], max_response_chars=40)
    calls = [
        ToolCall("search", {"query": "plum"}),
        ToolCall("search", {"query": "  "}),  # a bad query fails alone
        ToolCall("nope", {}),
        ToolCall("search", {"query": "pear"}),
        ToolCall("search", {"q": "x"}),  # bad arguments: checked before the batch
    ]
    results = box.execute_many(calls)
    assert backend.requests == [["plum", "pear"]]  # one request for the whole turn
    assert results[0] == ("Doc 1(Title: Plum) ", True)
    assert results[1] == ("Error: argument 'query' must be a non-empty string", False)
    assert results[2][1] is False and "unknown tool 'nope'" in results[2][0]
    assert results[3][1] is True and results[3][0].endswith("...[truncated]")
    assert results[4][1] is False and "missing argument" in results[4][0]


def test_search_tool_backend_failure_is_an_error_for_each_call() -> None:
    class Broken:
        def search(self, queries: Sequence[str], top_k: int) -> list[list[dict[str, Any]]]:
            raise RuntimeError("index gone")

    box = Toolbox([RetrievalSearchTool(Broken())])
    results = box.execute_many([ToolCall("search", {"query": "a"}), ToolCall("search", {"query": "b"})])
    assert all(not ok and "RuntimeError: index gone" in text for text, ok in results)
    assert box.execute(ToolCall("search", {"query": "a"}))[1] is False


def test_tools_config_service_mode_validation() -> None:
    cfg = ToolsConfig(enabled=("search",), corpus_path="c.jsonl", search_backend="service")
    box = build_toolbox(cfg)  # no retriever: describable, calls are errors
    text, ok = box.execute(ToolCall("search", {"query": "x"}))
    assert not ok and "not connected to a retriever" in text
    assert isinstance(box.tools["search"], RetrievalSearchTool)
    with pytest.raises(
        ValueError, match=r"tools.search_backend: unknown value 'remote'; allowed: local, service"
    ):
        ToolsConfig(corpus_path="c.jsonl", search_backend="remote")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"tools.retriever.type: unknown value 'dense'; allowed: bm25"):
        RetrieverConfig(type="dense")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not list 'search'"):
        ToolsConfig(enabled=("calculator",), search_backend="service")
