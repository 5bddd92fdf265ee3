"""Atomic checkpoint directories: ``<log_path>/checkpoints/global_step_<N>/``.

Protocol: ``begin(step)`` makes a hidden staging directory next to the final one; every component (possibly
in other processes) writes its files into it; ``commit(step, staging, meta)`` writes ``meta.json`` and a
``COMPLETE`` marker, fsyncs, and renames the staging directory into place in one ``os.rename``. A crash at
any point leaves either the previous checkpoints untouched plus a stale staging directory (ignored and
cleaned later) or the new complete one — never a half-written ``global_step_<N>``.
"""

from __future__ import annotations

import json
import os
import pickle
import random
import re
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "atomic_write_bytes",
    "capture_rng_state",
    "checkpoint_step",
    "find_latest_checkpoint",
    "is_complete",
    "resolve_resume_dir",
    "restore_rng_state",
]

COMPLETE = "COMPLETE"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")


class CheckpointError(ValueError):
    """A checkpoint that was asked for is missing, incomplete or not a ``global_step_<N>`` directory."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temp file in the same directory, fsync, rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            fd = os.open(Path(dirpath) / name, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(dirpath))


def is_complete(path: str | Path) -> bool:
    """Whether ``path`` is a committed checkpoint directory."""
    return (Path(path) / COMPLETE).is_file()


def find_latest_checkpoint(log_path: str | Path) -> Path | None:
    """The complete ``global_step_<N>`` directory with the highest N under ``<log_path>/checkpoints``, or None."""
    root = Path(log_path) / "checkpoints"
    if not root.is_dir():
        return None
    best: tuple[int, Path] | None = None
    for child in root.iterdir():
        m = _STEP_DIR.match(child.name)
        if m and is_complete(child) and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), child)
    return best[1] if best else None


def resolve_resume_dir(resume_dir: str | None, log_path: str | Path) -> Path | None:
    """Resolve ``runner.resume_dir``: ``None`` → no resume, ``"auto"`` → latest complete checkpoint (or None).

    Raises:
        CheckpointError: when an explicit path is not a complete checkpoint directory.
    """
    if resume_dir is None or resume_dir == "":
        return None
    if resume_dir == "auto":
        return find_latest_checkpoint(log_path)
    path = Path(resume_dir)
    if not path.is_dir():
        raise CheckpointError(
            f"runner.resume_dir: {resume_dir!r} does not exist (expected a global_step_<N> directory or 'auto')"
        )
    if not is_complete(path):
        raise CheckpointError(
            f"runner.resume_dir: {resume_dir!r} is not a complete checkpoint (no {COMPLETE} marker)"
        )
    return path


def checkpoint_step(path: str | Path) -> int:
    """The step N of a ``global_step_<N>`` directory (from ``meta.json``, else the name)."""
    path = Path(path)
    meta = path / "meta.json"
    if meta.is_file():
        return int(json.loads(meta.read_text())["step"])
    m = _STEP_DIR.match(path.name)
    if not m:
        raise CheckpointError(f"{path} is not a global_step_<N> directory")
    return int(m.group(1))


class CheckpointManager:
    """Creates, commits and prunes atomic checkpoints under ``<log_path>/checkpoints``.

    Args:
        log_path: the run directory.
        max_to_keep: keep only the newest N complete checkpoints (``None`` keeps all).
    """

    def __init__(self, log_path: str | Path, *, max_to_keep: int | None = None) -> None:
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 or None, got {max_to_keep}")
        self.root = Path(log_path) / "checkpoints"
        self.max_to_keep = max_to_keep

    def path_for(self, step: int) -> Path:
        """The final directory of the checkpoint at ``step``."""
        return self.root / f"global_step_{step}"

    def begin(self, step: int) -> Path:
        """Create and return a staging directory for the checkpoint at ``step``."""
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        self.root.mkdir(parents=True, exist_ok=True)
        staging = self.root / f".global_step_{step}.staging-{uuid.uuid4().hex[:8]}"
        staging.mkdir()
        return staging

    def commit(self, step: int, staging: Path, meta: Mapping[str, Any] | None = None) -> Path:
        """Mark ``staging`` complete and move it to ``global_step_<step>`` atomically; returns the final path."""
        if not staging.is_dir():
            raise FileNotFoundError(f"staging directory {staging} is gone; was it committed twice?")
        record = {"step": step, "time": time.time(), **(meta or {})}
        (staging / "meta.json").write_text(json.dumps(record, indent=2, default=str))
        (staging / COMPLETE).write_text("")
        _fsync_tree(staging)
        final = self.path_for(step)
        if final.exists():
            # Re-saving a step: move the old one aside first so a crash never leaves neither.
            old = self.root / f".{final.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(staging, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, final)
        _fsync_dir(self.root)
        self._prune()
        return final

    def abort(self, staging: Path) -> None:
        """Discard a staging directory (e.g. after a component failed to write)."""
        shutil.rmtree(staging, ignore_errors=True)

    def save(self, step: int, files: Mapping[str, bytes], meta: Mapping[str, Any] | None = None) -> Path:
        """Write ``files`` (relative path → bytes) as the checkpoint at ``step`` in one atomic commit."""
        staging = self.begin(step)
        try:
            for rel, data in files.items():
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        except BaseException:
            self.abort(staging)
            raise
        return self.commit(step, staging, meta)

    def latest(self) -> Path | None:
        """The newest complete checkpoint, or None."""
        return find_latest_checkpoint(self.root.parent)

    def clean_stale(self) -> list[Path]:
        """Remove staging/old leftovers of crashed saves; returns what was removed."""
        removed = []
        if self.root.is_dir():
            for child in self.root.iterdir():
                if child.name.startswith(".global_step_") and (
                    ".staging-" in child.name or ".old-" in child.name
                ):
                    shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
        return removed

    def _prune(self) -> None:
        if self.max_to_keep is None:
            return
        complete = sorted(
            (int(m.group(1)), c)
            for c in self.root.iterdir()
            if (m := _STEP_DIR.match(c.name)) and is_complete(c)
        )
        for _, path in complete[: -self.max_to_keep]:
            shutil.rmtree(path, ignore_errors=True)


def capture_rng_state() -> bytes:
    """Pickle the RNG states of ``random``, numpy and torch (the latter two only if already imported)."""
    state: dict[str, Any] = {"python": random.getstate()}
    np = sys.modules.get("numpy")
    if np is not None:
        state["numpy"] = np.random.get_state()
    torch = sys.modules.get("torch")
    if torch is not None:
        state["torch"] = torch.get_rng_state()
        if torch.cuda.is_available():
            state["torch_cuda"] = torch.cuda.get_rng_state_all()
    return pickle.dumps(state)


def restore_rng_state(blob: bytes) -> None:
    """Restore RNG states captured by :func:`capture_rng_state`."""
    state = pickle.loads(blob)
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "torch" in state:
        import torch

        torch.set_rng_state(state["torch"])
        if "torch_cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["torch_cuda"])


def replace_directory(target: Path, fill: Callable[[Path], None]) -> None:
    """Run ``fill(staging)`` on a fresh sibling directory, then rename it to ``target`` (replacing it).

    An existing ``target`` is moved aside first and deleted after the rename; when ``fill`` raises, the staging
    directory is removed and ``target`` is left as it was.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.parent / f".{target.name}.staging-{uuid.uuid4().hex[:8]}"
    try:
        staging.mkdir()
        fill(staging)
        old = None
        if target.exists():
            old = target.parent / f".{target.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(target, old)
        os.rename(staging, target)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
