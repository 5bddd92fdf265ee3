"""Write a whole directory so that readers see the old one or the complete new one, never a partial one."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

__all__ = ["replace_directory"]


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
