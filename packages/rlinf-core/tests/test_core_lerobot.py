"""The LeRobot v3.0 format: our writer and reader agree; the real lerobot package is checked by a slow test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rlinf_core.data.lerobot import LeRobotFeature, LeRobotReader, LeRobotWriter

ROOT = Path(__file__).resolve().parents[3]
FEATURES = {
    "observation.state": LeRobotFeature("float32", (3,)),
    "observation.images.cam": LeRobotFeature("image", (4, 5, 3)),
    "action": LeRobotFeature("float32", (2,)),
    "next.reward": LeRobotFeature("float32", (1,)),
    "next.done": LeRobotFeature("bool", (1,)),
}


def _episode(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {
        "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
        "observation.images.cam": rng.integers(0, 256, (n, 4, 5, 3), dtype=np.uint8),
        "action": rng.normal(size=(n, 2)).astype(np.float32),
        "next.reward": rng.normal(size=n).astype(np.float32),
        "next.done": np.arange(n) == n - 1,
    }


def test_round_trip_layout_and_action_chunks(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    eps = [_episode(rng, 4), _episode(rng, 2)]
    writer = LeRobotWriter(tmp_path / "ds", fps=5, features=FEATURES)
    writer.add_episode(eps[0], "push")
    writer.add_episode(eps[1], "pull")
    root = writer.write()
    info = json.loads((root / "meta" / "info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["total_frames"] == 6 and info["total_tasks"] == 2
    assert {"timestamp", "frame_index", "episode_index", "index", "task_index"} <= set(info["features"])
    for path in (
        "data/chunk-000/file-000.parquet",
        "meta/episodes/chunk-000/file-000.parquet",
        "meta/tasks.parquet",
    ):
        assert (root / path).is_file()
    stats = json.loads((root / "meta" / "stats.json").read_text())
    assert np.array(stats["observation.images.cam"]["mean"]).shape == (3, 1, 1)

    reader = LeRobotReader(root)
    assert (reader.num_episodes, reader.num_frames, reader.fps) == (2, 6, 5)
    for key in FEATURES:
        want = np.concatenate([e[key] for e in eps])
        np.testing.assert_array_equal(reader.column(key).reshape(want.shape), want)
    assert reader.task_of_frames() == ["push"] * 4 + ["pull"] * 2
    chunks = reader.action_chunks(["observation.state"], 3)
    assert chunks.actions.shape == (6, 3, 2) and chunks.mask.shape == (6, 3)
    # frame 2 of episode 0 (length 4): actions 2, 3, then 3 again as padding
    np.testing.assert_array_equal(chunks.actions[2], eps[0]["action"][[2, 3, 3]])
    assert chunks.mask[2].tolist() == [True, True, False]
    assert chunks.mask[5].tolist() == [True, False, False]  # the last frame of episode 1
    held_out = reader.action_chunks(["observation.state"], 1, episodes=[1])
    assert len(held_out) == 2 and set(held_out.episode_index.tolist()) == {1}


def test_bad_input_is_named(tmp_path: Path) -> None:
    writer = LeRobotWriter(tmp_path / "ds", fps=5, features=FEATURES)
    with pytest.raises(ValueError, match=r"missing \['next.done'\]"):
        writer.add_episode(
            {k: v for k, v in _episode(np.random.default_rng(0), 2).items() if k != "next.done"}, "t"
        )
    bad = _episode(np.random.default_rng(0), 2)
    bad["action"] = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"action: frames of shape \(3,\)"):
        writer.add_episode(bad, "t")
    with pytest.raises(ValueError, match="no episode"):
        writer.write()
    with pytest.raises(ValueError, match="written by the writer"):
        LeRobotWriter(tmp_path / "x", fps=5, features={"index": LeRobotFeature("int64", (1,))})
    with pytest.raises(FileNotFoundError, match=r"no meta/info\.json"):
        LeRobotReader(tmp_path)


LEROBOT_PYTHON = os.environ.get("RLINF_LEROBOT_PYTHON", "/tmp/lerobot-venv/bin/python")


@pytest.mark.slow
@pytest.mark.skipif(
    not Path(LEROBOT_PYTHON).exists(),
    reason=f"no lerobot environment at {LEROBOT_PYTHON} (set RLINF_LEROBOT_PYTHON; see scripts/check_lerobot_format.py)",
)
def test_the_real_lerobot_reads_ours_and_we_read_its() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "check_lerobot_format.py"),
            "--lerobot-python",
            LEROBOT_PYTHON,
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK: both directions agree" in out.stdout
