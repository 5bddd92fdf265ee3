"""Replay buffers: a fixed-capacity ring of chunked transitions, and RLPD's half-demo half-online sampling.

A *transition* is one chunked step of one env: ``obs [*obs]``, ``actions [C, D]`` (or ``[C]``), ``rewards [C]``,
``terminations [C]``, ``next_obs [*obs]`` (the observation after the chunk; the episode's last one when it ended
there). The buffer knows nothing of the field names: it stores whatever equally long tensors it is given and
returns them batched, so a buffer of ``[N, C, D]`` actions samples ``[B, C, D]``.

Sampling draws uniformly, with replacement, from the latest ``sample_window_size`` transitions with the
buffer's own ``torch.Generator``, so a buffer restored with :meth:`ReplayBuffer.load_state_dict` samples the
same batches as the one that was saved.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from rlinf_core.checkpoint import atomic_write_bytes
from rlinf_core.protocols import flatten_obs, unflatten_obs

__all__ = ["ReplayBuffer", "SymmetricSampler"]

_FORMAT = 1
"""Version of the :meth:`ReplayBuffer.state_dict` layout."""


class ReplayBuffer:
    """A ring of ``capacity`` transitions with uniform sampling from a window of the latest ones.

    Args:
        capacity: transitions kept; once full, each new one overwrites the oldest.
        sample_window_size: sample from the latest this many transitions (``None``: everything stored).
        min_size: transitions needed before :meth:`ready` is true (learning starts).
        seed: seed of the sampling generator.

    Example:
        >>> import torch
        >>> buf = ReplayBuffer(4, min_size=2, seed=0)
        >>> buf.add({"obs": torch.arange(6.0).reshape(3, 2), "rewards": torch.ones(3, 1)})
        >>> len(buf), buf.ready()
        (3, True)
        >>> buf.sample(5)["obs"].shape
        torch.Size([5, 2])
    """

    def __init__(
        self, capacity: int, *, sample_window_size: int | None = None, min_size: int = 1, seed: int = 0
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if sample_window_size is not None and sample_window_size < 1:
            raise ValueError(f"sample_window_size must be >= 1 or None, got {sample_window_size}")
        if min_size < 1:
            raise ValueError(f"min_size must be >= 1, got {min_size}")
        self.capacity = capacity
        self.sample_window_size = sample_window_size
        self.min_size = min_size
        self.generator = torch.Generator().manual_seed(seed)
        self._storage: dict[str, torch.Tensor] = {}
        self._pos = 0  # next slot to write
        self._size = 0
        self._added = 0  # transitions ever added

    # ------------------------------------------------------------------------------------------- queries
    def __len__(self) -> int:
        return self._size

    @property
    def total_added(self) -> int:
        """Transitions ever added (including overwritten ones)."""
        return self._added

    @property
    def keys(self) -> tuple[str, ...]:
        """The stored fields (empty before the first :meth:`add`)."""
        return tuple(self._storage)

    def ready(self) -> bool:
        """Whether at least ``min_size`` transitions are stored."""
        return self._size >= self.min_size

    def window(self) -> int:
        """How many of the latest transitions :meth:`sample` draws from."""
        if self.sample_window_size is None:
            return self._size
        return min(self._size, self.sample_window_size)

    # ------------------------------------------------------------------------------------------- writes
    def add(self, batch: Mapping[str, torch.Tensor]) -> None:
        """Append ``N`` transitions: every value is ``[N, ...]`` (the same ``N``), stored on the CPU.

        The first call fixes the fields, their trailing shapes and dtypes; later calls must match them.

        Raises:
            ValueError: on missing or extra fields, unequal ``N``, or another trailing shape or dtype.
        """
        if not batch:
            raise ValueError("add: the batch has no fields")
        batch = flatten_obs(batch)
        sizes = {k: int(v.shape[0]) for k, v in batch.items()}
        n = next(iter(sizes.values()))
        if any(s != n for s in sizes.values()):
            raise ValueError(f"add: every field needs the same leading size, got {sizes}")
        if not self._storage:
            self._storage = {
                k: torch.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype) for k, v in batch.items()
            }
        self._check_fields(batch)
        if n == 0:
            return
        if n > self.capacity:  # only the newest `capacity` transitions survive
            batch = {k: v[n - self.capacity :] for k, v in batch.items()}
            self._added += n - self.capacity
            n = self.capacity
        first = min(n, self.capacity - self._pos)
        for k, v in batch.items():
            src = v.detach().to("cpu")
            self._storage[k][self._pos : self._pos + first] = src[:first]
            if first < n:
                self._storage[k][: n - first] = src[first:]
        self._pos = (self._pos + n) % self.capacity
        self._size = min(self._size + n, self.capacity)
        self._added += n

    def _check_fields(self, batch: Mapping[str, torch.Tensor]) -> None:
        if set(batch) != set(self._storage):
            raise ValueError(f"add: fields {sorted(batch)} differ from the stored {sorted(self._storage)}")
        for k, v in batch.items():
            want = self._storage[k]
            if tuple(v.shape[1:]) != tuple(want.shape[1:]) or v.dtype != want.dtype:
                raise ValueError(
                    f"add: field {k!r} has per-transition shape {list(v.shape[1:])} and dtype {v.dtype}; "
                    f"the buffer stores {list(want.shape[1:])} {want.dtype}"
                )

    # -------------------------------------------------------------------------------------------- reads
    def latest_indices(self, count: int) -> torch.Tensor:
        """Storage slots of the latest ``count`` transitions, oldest first, ``[count]`` int64."""
        count = min(count, self._size)
        return (torch.arange(self._pos - count, self._pos) % self.capacity).long()

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """``batch_size`` transitions drawn uniformly (with replacement) from the latest :meth:`window`.

        Returns:
            Each field as ``[batch_size, ...]`` (CPU tensors).

        Raises:
            RuntimeError: when the buffer is empty.
        """
        window = self.window()
        if window == 0:
            raise RuntimeError("sample: the replay buffer is empty")
        offsets = torch.randint(0, window, (batch_size,), generator=self.generator)
        idx = (self._pos - window + offsets) % self.capacity
        return self.gather(idx)

    def gather(self, idx: torch.Tensor) -> dict[str, Any]:
        """The transitions in storage slots ``idx`` (copies), with dict observations as dicts again."""
        return unflatten_obs({k: v[idx] for k, v in self._storage.items()})

    def contents(self) -> dict[str, Any]:
        """Every stored transition, oldest first (copies)."""
        return self.gather(self.latest_indices(self._size))

    # ---------------------------------------------------------------------------------------- persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly: contents (oldest first), counters and the generator state."""
        return {
            "format": _FORMAT,
            "capacity": self.capacity,
            "sample_window_size": self.sample_window_size,
            "min_size": self.min_size,
            "contents": self.contents(),
            "added": self._added,
            "generator": self.generator.get_state(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict`: the same contents, counters and generator (continued sampling).

        Loading into a buffer of another capacity keeps the newest transitions that fit; this buffer's
        ``sample_window_size`` and ``min_size`` stay as configured.

        Raises:
            ValueError: on an unknown format.
        """
        if state.get("format") != _FORMAT:
            raise ValueError(
                f"replay buffer state of format {state.get('format')!r}; this code reads {_FORMAT}"
            )
        contents: Mapping[str, torch.Tensor] = state["contents"]
        self._storage = {}
        self._pos = self._size = 0
        self._added = 0
        if contents:
            # Oldest first from slot 0: samples index the window relative to the newest transition, so the
            # restored buffer draws the same transitions as the saved one whatever its ring position was.
            self.add(contents)
        self._added = int(state["added"])
        self.generator.set_state(state["generator"])

    def save(self, path: str | Path) -> None:
        """Write :meth:`state_dict` to ``path`` (atomically; ``torch.save`` format), e.g. for offline reuse."""
        buf = io.BytesIO()
        torch.save(self.state_dict(), buf)
        atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        capacity: int | None = None,
        sample_window_size: int | None = None,
        min_size: int = 1,
        seed: int | None = None,
    ) -> ReplayBuffer:
        """A buffer holding what :meth:`save` wrote to ``path``.

        Args:
            path: the file.
            capacity: capacity of the new buffer (default: the saved one).
            sample_window_size: its sampling window (default: everything stored).
            min_size: its ``min_size``.
            seed: reseed its generator (default: continue the saved generator).
        """
        state = torch.load(Path(path), map_location="cpu", weights_only=True)
        buf = cls(
            int(state["capacity"]) if capacity is None else capacity,
            sample_window_size=sample_window_size,
            min_size=min_size,
        )
        buf.load_state_dict(state)
        if seed is not None:
            buf.generator.manual_seed(seed)
        return buf


class SymmetricSampler:
    """RLPD's symmetric sampling: each batch is half online transitions and half demonstrations.

    Args:
        online: the online replay buffer.
        demo: the demonstration buffer (same fields).
    """

    def __init__(self, online: ReplayBuffer, demo: ReplayBuffer) -> None:
        self.online = online
        self.demo = demo

    def ready(self) -> bool:
        """Whether both buffers hold their ``min_size``."""
        return self.online.ready() and self.demo.ready()

    def sample(self, batch_size: int) -> dict[str, torch.Tensor]:
        """``batch_size - batch_size // 2`` online transitions followed by ``batch_size // 2`` demo ones."""
        n_demo = batch_size // 2
        online = self.online.sample(batch_size - n_demo)
        if n_demo == 0:
            return online
        online, demo = flatten_obs(online), flatten_obs(self.demo.sample(n_demo))
        missing = set(online) ^ set(demo)
        if missing:
            raise ValueError(f"the demo buffer's fields differ from the online buffer's: {sorted(missing)}")
        return unflatten_obs({k: torch.cat([online[k], demo[k].to(online[k].dtype)]) for k in online})
