from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from rlinf_core.checkpoint import (
    CheckpointManager,
    capture_rng_state,
    checkpoint_step,
    find_latest_checkpoint,
    resolve_resume_dir,
    restore_rng_state,
)


def test_save_commit_and_latest(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(2, {"actor/model.pt": b"a"})
    mgr.save(10, {"actor/model.pt": b"b"}, meta={"note": "x"})
    latest = find_latest_checkpoint(tmp_path)
    assert latest == tmp_path / "checkpoints" / "global_step_10"
    assert (latest / "actor" / "model.pt").read_bytes() == b"b"
    assert checkpoint_step(latest) == 10
    assert resolve_resume_dir("auto", tmp_path) == latest
    assert resolve_resume_dir(None, tmp_path) is None


def test_incomplete_staging_is_ignored_and_cleaned(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, {"x": b"1"})
    staging = mgr.begin(2)
    (staging / "x").write_bytes(b"partial")
    assert find_latest_checkpoint(tmp_path) == mgr.path_for(1)
    assert mgr.clean_stale() == [staging]
    with pytest.raises(ValueError, match="not a complete checkpoint"):
        os.makedirs(tmp_path / "half")
        resolve_resume_dir(str(tmp_path / "half"), tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        resolve_resume_dir(str(tmp_path / "nope"), tmp_path)


def test_resave_same_step_and_prune(tmp_path: Path) -> None:
    mgr = CheckpointManager(tmp_path, max_to_keep=2)
    for step in (1, 2, 3):
        mgr.save(step, {"x": str(step).encode()})
    mgr.save(3, {"x": b"again"})
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["global_step_2", "global_step_3"]
    assert (mgr.path_for(3) / "x").read_bytes() == b"again"


def test_crash_mid_save_leaves_last_good_checkpoint(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import os
        from rlinf_core.checkpoint import CheckpointManager
        mgr = CheckpointManager({str(tmp_path)!r})
        mgr.save(1, {{"model": b"good"}})
        staging = mgr.begin(2)
        (staging / "model").write_bytes(b"half")
        os._exit(9)  # killed before commit
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], timeout=120)
    assert proc.returncode == 9
    latest = resolve_resume_dir("auto", tmp_path)
    assert latest is not None and checkpoint_step(latest) == 1
    assert (latest / "model").read_bytes() == b"good"


def test_rng_state_round_trip() -> None:
    import torch

    blob = capture_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    restore_rng_state(blob)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a
