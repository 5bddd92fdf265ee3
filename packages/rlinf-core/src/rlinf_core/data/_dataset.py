"""Prompt datasets for reasoning RL and SFT: JSONL / Parquet rows → :class:`PromptExample`.

A row is a mapping with either a ``prompt`` (a user message, text) or ``messages`` (a chat:
``[{"role": ..., "content": ...}, ...]``), the reference ``answer`` (a string, a number, or a list of
accepted answers) and, for SFT demonstrations, a ``solution`` (the assistant's target text). A row of a
vision-language task also carries ``images``: a list of image references (a file path, relative paths taken
from the dataset file's directory, or a ``data:image/...;base64,`` URI) that the prompt shows, in order. Other
keys are kept in :attr:`PromptExample.extra`. Errors name the file, the line (JSONL) or row (Parquet) and the key.
"""

from __future__ import annotations

import importlib
import json
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import attrs

__all__ = ["DatasetError", "PromptDataset", "PromptExample", "PromptSampler", "load_prompt_dataset"]

_ROLES = ("system", "user", "assistant", "tool")


class DatasetError(ValueError):
    """A dataset file that cannot be read or has an invalid row (the message names file, row and key)."""


@attrs.frozen(kw_only=True)
class PromptExample:
    """One prompt of a dataset.

    Attributes:
        messages: the chat to continue, ``({"role": ..., "content": ...}, ...)``; a plain ``prompt`` row
            becomes one user message.
        answers: the accepted reference answers (strings), possibly empty for unlabelled prompts.
        solution: the assistant's target text for SFT (``None`` when the row has none).
        extra: the row's other keys.
        images: the prompt's images, in order: absolute file paths or ``data:`` URIs (empty for text).
    """

    messages: tuple[Mapping[str, str], ...]
    answers: tuple[str, ...] = ()
    solution: str | None = None
    images: tuple[str, ...] = ()
    extra: Mapping[str, Any] = attrs.field(factory=dict)

    @property
    def prompt_text(self) -> str:
        """The content of the last user message (handy for logs)."""
        for message in reversed(self.messages):
            if message.get("role") == "user":
                return message.get("content", "")
        return self.messages[-1].get("content", "") if self.messages else ""


class PromptDataset(Sequence[PromptExample]):
    """An in-memory, indexable list of :class:`PromptExample` read from one file.

    Args:
        examples: the rows.
        source: where they came from (for messages).
    """

    def __init__(self, examples: Sequence[PromptExample], source: str = "<memory>") -> None:
        self._examples = list(examples)
        self.source = source

    def __len__(self) -> int:
        return len(self._examples)

    @overload
    def __getitem__(self, index: int) -> PromptExample: ...
    @overload
    def __getitem__(self, index: slice) -> PromptDataset: ...
    def __getitem__(self, index: int | slice) -> PromptExample | PromptDataset:
        if isinstance(index, slice):
            return PromptDataset(self._examples[index], self.source)
        return self._examples[index]

    def __iter__(self) -> Iterator[PromptExample]:
        return iter(self._examples)

    def __repr__(self) -> str:
        return f"PromptDataset({len(self)} examples from {self.source!r})"


def _answers(value: Any, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, bool):
        raise DatasetError(f"{where}: 'answer' must be a string, a number or a list of them, got a bool")
    if isinstance(value, str | int | float):
        return (str(value),)
    if isinstance(value, list | tuple):
        out = []
        for item in value:
            if isinstance(item, bool) or not isinstance(item, str | int | float):
                raise DatasetError(
                    f"{where}: 'answer' list entries must be strings or numbers, got {type(item).__name__}"
                )
            out.append(str(item))
        return tuple(out)
    raise DatasetError(
        f"{where}: 'answer' must be a string, a number or a list of them, got {type(value).__name__}"
    )


def _messages(value: Any, where: str, key: str) -> tuple[Mapping[str, str], ...]:
    if not isinstance(value, list | tuple) or not value:
        raise DatasetError(f"{where}: {key!r} must be a non-empty list of {{'role', 'content'}} mappings")
    out: list[Mapping[str, str]] = []
    for i, message in enumerate(value):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise DatasetError(f"{where}: {key}[{i}] must be a mapping with 'role' and 'content'")
        role, content = message["role"], message["content"]
        if role not in _ROLES:
            raise DatasetError(f"{where}: {key}[{i}].role is {role!r}; allowed: {', '.join(_ROLES)}")
        if not isinstance(content, str):
            raise DatasetError(f"{where}: {key}[{i}].content must be a string, got {type(content).__name__}")
        out.append({"role": str(role), "content": content})
    return tuple(out)


def _images(value: Any, where: str, key: str, base: Path) -> tuple[str, ...]:
    """Image references of a row: relative paths resolved from ``base``, ``data:`` URIs kept as they are."""
    if value is None:
        return ()
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise DatasetError(f"{where}: {key!r} must be a list of image paths or data: URIs")
    out = []
    for i, ref in enumerate(value):
        if not isinstance(ref, str) or not ref:
            raise DatasetError(f"{where}: {key}[{i}] must be a non-empty string (a path or a data: URI)")
        if ref.startswith("data:"):
            out.append(ref)
            continue
        path = Path(ref).expanduser()
        path = path if path.is_absolute() else base / path
        if not path.is_file():
            raise DatasetError(f"{where}: {key}[{i}] {ref!r} is not a file (looked at {path})")
        out.append(str(path))
    return tuple(out)


def _example(
    row: Any,
    where: str,
    *,
    prompt_key: str,
    messages_key: str,
    answer_key: str,
    solution_key: str,
    require_answer: bool,
    require_solution: bool,
    image_key: str = "images",
    base: Path = Path(),
) -> PromptExample:
    if not isinstance(row, Mapping):
        raise DatasetError(f"{where}: a row must be a JSON object, got {type(row).__name__}")
    if row.get(messages_key) is not None:
        messages = _messages(row[messages_key], where, messages_key)
    elif row.get(prompt_key) is not None:
        prompt = row[prompt_key]
        if not isinstance(prompt, str) or not prompt:
            raise DatasetError(f"{where}: {prompt_key!r} must be a non-empty string")
        messages = ({"role": "user", "content": prompt},)
    else:
        raise DatasetError(
            f"{where}: missing key {prompt_key!r} (or {messages_key!r}); the row has keys {sorted(row)}"
        )
    if require_answer and row.get(answer_key) is None:
        raise DatasetError(f"{where}: missing key {answer_key!r}; the row has keys {sorted(row)}")
    answers = _answers(row.get(answer_key), where)
    if require_answer and not answers:
        raise DatasetError(f"{where}: {answer_key!r} is an empty list")
    solution = row.get(solution_key)
    if solution is None and require_solution:
        raise DatasetError(
            f"{where}: missing key {solution_key!r} (SFT needs the target text); the row has keys {sorted(row)}"
        )
    if solution is not None and not isinstance(solution, str):
        raise DatasetError(f"{where}: {solution_key!r} must be a string, got {type(solution).__name__}")
    images = _images(row.get(image_key), where, image_key, base)
    used = {prompt_key, messages_key, answer_key, solution_key, image_key}
    extra = {k: v for k, v in row.items() if k not in used}
    return PromptExample(messages=messages, answers=answers, solution=solution, extra=extra, images=images)


def _read_jsonl(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise DatasetError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None


def _read_parquet(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        parquet = importlib.import_module("pyarrow.parquet")
    except ImportError as e:
        raise ImportError(f"reading {path} needs pyarrow: pip install pyarrow") from e
    try:
        table = parquet.read_table(str(path))
    except Exception as e:  # pyarrow raises its own ArrowInvalid/OSError family
        raise DatasetError(f"{path}: not a readable Parquet file ({e})") from None
    for i, row in enumerate(table.to_pylist()):
        yield f"{path} row {i}", row


def load_prompt_dataset(
    path: str | Path,
    *,
    prompt_key: str = "prompt",
    messages_key: str = "messages",
    answer_key: str = "answer",
    solution_key: str = "solution",
    image_key: str = "images",
    require_answer: bool = True,
    require_solution: bool = False,
    limit: int | None = None,
) -> PromptDataset:
    """Read a ``.jsonl`` (or ``.json`` lines) or ``.parquet`` file of prompts.

    Args:
        path: the file.
        prompt_key: key of a plain-text prompt (a user message).
        messages_key: key of a chat prompt (a list of ``{"role", "content"}``); used when present.
        answer_key: key of the reference answer(s).
        solution_key: key of the SFT target text.
        image_key: key of the prompt's images (paths, relative ones from the file's directory, or ``data:``
            URIs); rows without it are text prompts.
        require_answer: every row must have an answer (RL with a verifier needs it).
        require_solution: every row must have a solution (SFT data).
        limit: read at most this many rows.

    Returns:
        The rows, in file order.

    Raises:
        DatasetError: for a missing or empty file, an unknown suffix, invalid JSON, or a row without a
            required key or an image file that does not exist (the message names the file, the line/row and
            the key).
        ImportError: for a Parquet file without pyarrow installed.
    """
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"dataset file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".json", ".ndjson"):
        rows = _read_jsonl(path)
    elif suffix in (".parquet", ".pq"):
        rows = _read_parquet(path)
    else:
        raise DatasetError(f"{path}: unknown dataset format {suffix!r}; allowed: .jsonl, .json, .parquet")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be >= 1 or None, got {limit}")
    examples = []
    for where, row in rows:
        examples.append(
            _example(
                row,
                where,
                prompt_key=prompt_key,
                messages_key=messages_key,
                answer_key=answer_key,
                solution_key=solution_key,
                require_answer=require_answer,
                require_solution=require_solution,
                image_key=image_key,
                base=path.parent,
            )
        )
        if limit is not None and len(examples) >= limit:
            break
    if not examples:
        raise DatasetError(f"{path}: the dataset has no rows")
    return PromptDataset(examples, str(path))


class PromptSampler:
    """Draws batches of dataset indices: a seeded shuffle per epoch, resumable.

    Args:
        size: number of examples.
        seed: shuffle seed (epoch ``e`` uses ``seed + e``).
        shuffle: shuffle each epoch (else file order).
    """

    def __init__(self, size: int, *, seed: int = 0, shuffle: bool = True) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order = self._make_order()

    def _make_order(self) -> list[int]:
        order = list(range(self.size))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[int]:
        """The next ``n`` indices (crossing into the next epoch, freshly shuffled, when needed)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        out: list[int] = []
        while len(out) < n:
            if self.position >= self.size:
                self.epoch += 1
                self.position = 0
                self._order = self._make_order()
            take = min(n - len(out), self.size - self.position)
            out += self._order[self.position : self.position + take]
            self.position += take
        return out

    def state_dict(self) -> dict[str, int]:
        """The position to resume from."""
        return {"epoch": self.epoch, "position": self.position, "size": self.size, "seed": self.seed}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Continue from a :meth:`state_dict` (of a sampler over a dataset of the same size).

        Raises:
            ValueError: if the dataset size changed.
        """
        if int(state["size"]) != self.size:
            raise ValueError(
                f"the sampler state is for a dataset of {state['size']} examples, this one has {self.size}"
            )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._order = self._make_order()
