"""Atomic checkpoints with resume (``runner.resume_dir``: a path or ``auto``)."""

from ._checkpoint import (
    CheckpointError,
    CheckpointManager,
    atomic_write_bytes,
    capture_rng_state,
    checkpoint_step,
    find_latest_checkpoint,
    is_complete,
    replace_directory,
    resolve_resume_dir,
    restore_rng_state,
)

__all__ = [
    "CheckpointError",
    "CheckpointManager",
    "atomic_write_bytes",
    "capture_rng_state",
    "checkpoint_step",
    "find_latest_checkpoint",
    "is_complete",
    "replace_directory",
    "resolve_resume_dir",
    "restore_rng_state",
]
