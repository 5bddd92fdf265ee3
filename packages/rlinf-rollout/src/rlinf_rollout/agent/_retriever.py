"""The retrieval service: ``RetrieverWorker`` (the ``retriever`` worker group) and ``RetrieverClient``.

Each retriever rank holds the whole index (:class:`~rlinf_rollout.agent.BM25Index` over ``tools.corpus_path``);
a rollout worker's :class:`RetrieverClient` splits a batch of queries into contiguous shares, one per rank,
sends them at once and waits at most ``timeout_s`` for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray
from rlinf_scheduler import Worker, shard_bounds

from ._config import RetrieverConfig
from ._retrieval import BM25Index
from ._tools import ToolError, load_passages

__all__ = ["RetrieverClient", "RetrieverWorker"]


class RetrieverWorker(Worker):
    """One rank of the ``retriever`` group: an index over the local corpus, searched in batches.

    Args:
        cfg: the retriever (``tools.retriever``).
        corpus_path: the JSONL corpus (``{"id", "title", "text"}`` per line).

    Raises:
        FileNotFoundError: when the corpus does not exist.
        ValueError: for a malformed corpus (file and line named).
    """

    def __init__(self, cfg: RetrieverConfig, corpus_path: str | Path) -> None:
        super().__init__()
        self.cfg = cfg
        # Only bm25 exists (RetrieverConfig refuses other types); a dense index would be chosen here.
        self.index = BM25Index(load_passages(corpus_path), k1=cfg.k1, b=cfg.b, stopwords=cfg.stopwords)

    def num_passages(self) -> int:
        """Passages in the index."""
        return len(self.index)

    def search(self, queries: Sequence[str], top_k: int) -> list[list[dict[str, Any]]]:
        """Per query its ``top_k`` best passages ``{"id", "title", "text", "score"}``, best first.

        A query without any indexed term (or an empty one) gets an empty list.

        Raises:
            ValueError: when ``top_k`` < 1.
        """
        if top_k < 1:
            raise ValueError(f"search: 'top_k' must be >= 1, got {top_k}")
        with self.timer("retrieve"):
            return self.index.search([str(q) for q in queries], top_k)


class RetrieverClient:
    """Batched search on the ``retriever`` group from another worker (a :class:`SearchBackend`).

    The group's ranks are the named Ray actors ``f"{group}:{rank}"`` of the run's namespace; they are looked up
    on the first search (the retriever group may start after the caller).

    Args:
        group: the retriever group's name (``"retriever"`` in the agent app).
        namespace: the run's Ray namespace (``Worker.namespace``).
        world_size: the group's size, or a function returning it (called on the first search, e.g.
            ``lambda: worker.group_world_size("retriever")``).
        timeout_s: longest a search waits for the group; past it the call is a :class:`ToolError` naming the
            group, the ranks still running and the number of queries.
    """

    def __init__(
        self, group: str, *, namespace: str, world_size: int | Callable[[], int], timeout_s: float
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"RetrieverClient: 'timeout_s' must be > 0, got {timeout_s}")
        self.group = group
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._world_size = world_size
        self._handles: list[Any] | None = None

    def _actors(self) -> list[Any]:
        if self._handles is None:
            n = self._world_size if isinstance(self._world_size, int) else self._world_size()
            try:
                self._handles = [
                    ray.get_actor(f"{self.group}:{r}", namespace=self.namespace) for r in range(n)
                ]
            except ValueError:
                raise ToolError(
                    f"no retriever group {self.group!r} in this run (namespace {self.namespace!r}); "
                    "place 'retriever' in cluster.component_placement"
                ) from None
        return self._handles

    def search(self, queries: Sequence[str], top_k: int) -> list[list[dict[str, Any]]]:
        """Per query its ``top_k`` passages, best first (one request per retriever rank, sent at once).

        Raises:
            ToolError: when the group does not answer within ``timeout_s`` or is gone.
        """
        if not queries:
            return []
        actors = self._actors()
        shares = [shard_bounds(len(queries), r, len(actors)) for r in range(len(actors))]
        refs = [
            (r, actors[r].search.remote(list(queries[a:b]), top_k))
            for r, (a, b) in enumerate(shares)
            if b > a
        ]
        _, pending = ray.wait([ref for _, ref in refs], num_returns=len(refs), timeout=self.timeout_s)
        if pending:
            late = [r for r, ref in refs if ref in pending]
            raise ToolError(
                f"the retriever group {self.group!r} did not answer search of {len(queries)} queries within "
                f"{self.timeout_s:g} s (ranks {late} still running)"
            )
        try:
            parts: list[list[list[dict[str, Any]]]] = ray.get([ref for _, ref in refs])
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
            raise ToolError(f"the retriever group {self.group!r} failed: {type(e).__name__}") from e
        return [hits for part in parts for hits in part]
