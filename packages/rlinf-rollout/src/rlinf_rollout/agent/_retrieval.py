"""Retrieval for the ``search`` tool as a service: a BM25 index, the passage format, and the tool over a backend.

:class:`BM25Index` is Okapi BM25 over a local JSONL corpus (numpy, no other dependency).
:class:`RetrievalSearchTool` is the agent's ``search`` tool over any :class:`SearchBackend`: in the agent app
the backend is the ``retriever`` worker group (``rlinf_rollout.agent.RetrieverWorker``), reached through
``RetrieverClient``. Several episodes' searches of one turn go to the backend as one batch
(:meth:`RetrievalSearchTool.call_batch`, used by :meth:`~rlinf_rollout.agent.Toolbox.execute_many`).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from ._tools import _STOPWORDS, Passage, ToolError

__all__ = [
    "BM25Index",
    "RetrievalSearchTool",
    "SearchBackend",
    "format_passages",
    "tokenize",
]

_WORD_RE = re.compile(r"[^\W_]+")  # runs of letters and digits: punctuation and underscores split words


def tokenize(text: str, *, stopwords: bool = True) -> list[str]:
    """Lower-case ``text``, split it on everything but letters and digits, and drop English stopwords.

    Example:
        >>> tokenize("Who founded Zasgrox, and when?")
        ['founded', 'zasgrox']
    """
    words = _WORD_RE.findall(text.lower())
    return [w for w in words if w not in _STOPWORDS] if stopwords else words


class SearchBackend(Protocol):
    """What :class:`RetrievalSearchTool` needs: batched top-k search (``RetrieverClient`` and the index fit)."""

    def search(self, queries: Sequence[str], top_k: int) -> list[list[dict[str, Any]]]:
        """``[Q]`` queries → ``[Q][<= top_k]`` passages ``{"id", "title", "text", "score"}``, best first."""
        ...


class BM25Index:
    """Okapi BM25 over passages (title and text indexed together).

    The score of passage ``d`` for query ``q`` is

        ``sum_{t in q} idf(t) * f(t, d) * (k1 + 1) / (f(t, d) + k1 * (1 - b + b * |d| / avgdl))``

    with ``f(t, d)`` the count of term ``t`` in ``d``, ``|d|`` its length in terms, ``avgdl`` the mean length, and
    ``idf(t) = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5))`` (Lucene's non-negative form; ``N`` passages, ``n(t)``
    of them containing ``t``). A query term repeated counts once per occurrence, as in Lucene.
    See Robertson & Zaragoza, "The Probabilistic Relevance Framework: BM25 and Beyond" (2009).

    Args:
        passages: the corpus (:func:`~rlinf_rollout.agent.load_passages`).
        k1: term-frequency saturation (Pyserini's default 0.9, which Search-R1's BM25 retriever uses).
        b: length normalisation (Pyserini's default 0.4).
        stopwords: drop English stopwords from passages and queries (see :func:`tokenize`).
    """

    def __init__(
        self, passages: Sequence[Passage], *, k1: float = 0.9, b: float = 0.4, stopwords: bool = True
    ) -> None:
        if not passages:
            raise ValueError("BM25Index: 'passages' must not be empty")
        if k1 < 0:
            raise ValueError(f"BM25Index: 'k1' must be >= 0, got {k1}")
        if not 0.0 <= b <= 1.0:
            raise ValueError(f"BM25Index: 'b' must be in [0, 1], got {b}")
        self.passages = list(passages)
        self.k1 = k1
        self.b = b
        self.stopwords = stopwords
        counts = [Counter(tokenize(f"{p.title} {p.text}", stopwords=stopwords)) for p in self.passages]
        self.doc_len = np.asarray([sum(c.values()) for c in counts], dtype=np.float64)
        """``[N]`` passage lengths in terms."""
        self.avg_len = float(self.doc_len.mean()) or 1.0
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for d, c in enumerate(counts):
            for term, f in c.items():
                docs, freqs = postings.setdefault(term, ([], []))
                docs.append(d)
                freqs.append(f)
        n = len(self.passages)
        self._postings = {
            t: (np.asarray(docs, dtype=np.int64), np.asarray(freqs, dtype=np.float64))
            for t, (docs, freqs) in postings.items()
        }
        self.idf = {t: math.log(1.0 + (n - len(d) + 0.5) / (len(d) + 0.5)) for t, (d, _) in postings.items()}
        """``idf(t)`` of every indexed term."""
        self._norm = k1 * (1.0 - b + b * self.doc_len / self.avg_len)

    def __len__(self) -> int:
        return len(self.passages)

    def scores(self, query: str) -> np.ndarray:
        """``[N]`` BM25 score of every passage for ``query`` (0 where no query term occurs)."""
        out = np.zeros(len(self.passages), dtype=np.float64)
        for term in tokenize(query, stopwords=self.stopwords):
            posting = self._postings.get(term)
            if posting is None:
                continue
            docs, freqs = posting
            out[docs] += self.idf[term] * freqs * (self.k1 + 1.0) / (freqs + self._norm[docs])
        return out

    def top_k(self, query: str, k: int) -> list[tuple[int, float]]:
        """The ``k`` best ``(passage index, score)`` with a positive score, best first (ties: corpus order)."""
        if k < 1:
            raise ValueError(f"top_k: 'k' must be >= 1, got {k}")
        s = self.scores(query)
        hits = np.flatnonzero(s > 0.0)
        order = hits[np.argsort(-s[hits], kind="stable")][:k]
        return [(int(i), float(s[i])) for i in order]

    def search(self, queries: Sequence[str], top_k: int) -> list[list[dict[str, Any]]]:
        """Batched search: per query its ``top_k`` passages ``{"id", "title", "text", "score"}`` (maybe none)."""
        out = []
        for q in queries:
            hits = self.top_k(q, top_k)
            out.append(
                [
                    {"id": p.id, "title": p.title, "text": p.text, "score": s}
                    for p, s in ((self.passages[i], s) for i, s in hits)
                ]
            )
        return out


def format_passages(passages: Sequence[Mapping[str, Any]]) -> str:
    """Search-R1's rendering of retrieved passages: ``Doc i(Title: <title>) <text>``, one per line.

    An empty result reads ``No search results are found.`` (RLinf's Search-R1 tool says the same).
    """
    if not passages:
        return "No search results are found."
    return "\n".join(
        f"Doc {i}(Title: {p.get('title', '')}) {p.get('text', '')}" for i, p in enumerate(passages, 1)
    )


class RetrievalSearchTool:
    """The agent's ``search`` tool over a :class:`SearchBackend`; results in Search-R1's format.

    Args:
        backend: batched top-k search (the retriever group's client, or a :class:`BM25Index`).
        top_k: passages returned per query.
        information_tags: wrap each response in ``<information>...</information>`` as Search-R1 does.
    """

    name = "search"
    description = "Search the knowledge base; returns the most relevant passages for a query."
    parameters: Mapping[str, Any] = {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "what to look up"}},
        "required": ["query"],
    }

    def __init__(self, backend: SearchBackend, *, top_k: int = 3, information_tags: bool = False) -> None:
        if top_k < 1:
            raise ValueError(f"RetrievalSearchTool: 'top_k' must be >= 1, got {top_k}")
        self.backend = backend
        self.top_k = top_k
        self.information_tags = information_tags

    def _render(self, passages: Sequence[Mapping[str, Any]]) -> str:
        text = format_passages(passages)
        return f"<information>{text}</information>" if self.information_tags else text

    @staticmethod
    def _query(arguments: Mapping[str, Any]) -> str:
        query = arguments.get("query")
        if not isinstance(query, str) or not query.strip():
            raise ToolError("argument 'query' must be a non-empty string")
        return query.strip()

    def call(self, arguments: Mapping[str, Any]) -> str:
        """Search ``arguments["query"]``.

        Raises:
            ToolError: when the query is missing or empty, or the backend fails (its message).
        """
        result = self.call_batch([arguments])[0]
        if isinstance(result, ToolError):
            raise result
        return result

    def call_batch(self, arguments: Sequence[Mapping[str, Any]]) -> list[str | ToolError]:
        """Run several calls with one backend request; a bad query fails alone (its entry is a ``ToolError``).

        Raises:
            ToolError: when the backend request fails (every call of the batch failed).
        """
        results: list[str | ToolError] = []
        queries: list[str] = []
        slots: list[int] = []
        for i, args in enumerate(arguments):
            try:
                queries.append(self._query(args))
            except ToolError as e:
                results.append(e)
                continue
            results.append("")
            slots.append(i)
        if queries:
            hits = self.backend.search(queries, self.top_k)
            if len(hits) != len(queries):
                raise ToolError(f"the search backend returned {len(hits)} results for {len(queries)} queries")
            for i, passages in zip(slots, hits, strict=True):
                results[i] = self._render(passages)
        return results
