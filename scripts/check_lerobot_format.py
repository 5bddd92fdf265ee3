"""Check our LeRobot format against the real ``lerobot`` package, in both directions.

``lerobot`` pins another torch than this workspace, so it lives in its own environment::

    uv venv /tmp/lerobot-venv && uv pip install --python /tmp/lerobot-venv lerobot
    uv run python scripts/check_lerobot_format.py --lerobot-python /tmp/lerobot-venv/bin/python

1. ``LeRobotWriter`` writes a dataset (a vector state, an RGB image column, actions, rewards, done flags, two
   tasks); lerobot's ``LeRobotDataset`` loads it with ``delta_timestamps`` action chunks, and every value, pad
   flag and task string is compared with what was written.
2. lerobot writes a dataset (``LeRobotDataset.create``, ``add_frame``, ``save_episode``, ``finalize``, images
   as image features); ``LeRobotReader`` reads it back and compares it with the values lerobot was given.

Exit status 0 when both directions agree; the failing comparison is printed otherwise.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from rlinf_core.data.lerobot import LeRobotFeature, LeRobotReader, LeRobotWriter

FPS = 10
CHUNK = 3
LENGTHS = (5, 3, 4)

FEATURES = {
    "observation.state": LeRobotFeature("float32", (3,), ["a", "b", "c"]),
    "observation.images.front": LeRobotFeature("image", (6, 8, 3), ["height", "width", "channel"]),
    "action": LeRobotFeature("float32", (2,), ["x", "y"]),
    "next.reward": LeRobotFeature("float32", (1,)),
    "next.done": LeRobotFeature("bool", (1,)),
}


def episodes(seed: int) -> list[tuple[dict[str, np.ndarray], str]]:
    """Deterministic episodes (the same in both processes)."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate(LENGTHS):
        frames = {
            "observation.state": rng.normal(size=(n, 3)).astype(np.float32),
            "observation.images.front": rng.integers(0, 256, (n, 6, 8, 3), dtype=np.uint8),
            "action": rng.normal(size=(n, 2)).astype(np.float32),
            "next.reward": rng.normal(size=n).astype(np.float32),
            "next.done": np.arange(n) == n - 1,
        }
        out.append((frames, f"task {i % 2}"))
    return out


# Runs under lerobot's interpreter: argv = [mode, dataset dir, seed].
LEROBOT_SIDE = r"""
import json, sys
import numpy as np
from lerobot.datasets.lerobot_dataset import LeRobotDataset
mode, root, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
FPS, CHUNK, LENGTHS = %(fps)d, %(chunk)d, %(lengths)r
def episodes(seed):
%(episodes_src)s
if mode == "write":
    features = %(features)s
    ds = LeRobotDataset.create("local/rlinf-check", fps=FPS, features=features, root=root, use_videos=False)
    for frames, task in episodes(seed):
        for t in range(len(frames["action"])):
            ds.add_frame({**{k: (v[t] if v[t].ndim else np.array([v[t]])) for k, v in frames.items()}, "task": task})
        ds.save_episode()
    ds.finalize()
    print(json.dumps({"ok": True}))
else:
    ds = LeRobotDataset("local/rlinf-check", root=root, delta_timestamps={"action": [i / FPS for i in range(CHUNK)]})
    expect = episodes(seed)
    starts = np.cumsum([0] + [len(f["action"]) for f, _ in expect])
    problems = []
    if len(ds) != starts[-1] or ds.meta.total_episodes != len(expect):
        problems.append(f"length {len(ds)} / episodes {ds.meta.total_episodes}")
    for e, (frames, task) in enumerate(expect):
        n = len(frames["action"])
        for t in range(n):
            item = ds[int(starts[e] + t)]
            if item["task"] != task or int(item["episode_index"]) != e or int(item["frame_index"]) != t:
                problems.append(f"frame {e}/{t}: task/index {item['task']!r} {item['episode_index']} {item['frame_index']}")
            if not np.allclose(item["observation.state"].numpy(), frames["observation.state"][t]):
                problems.append(f"frame {e}/{t}: observation.state")
            image = (item["observation.images.front"].numpy().transpose(1, 2, 0) * 255).round()
            if not np.array_equal(image.astype(np.uint8), frames["observation.images.front"][t]):
                problems.append(f"frame {e}/{t}: observation.images.front")
            idx = np.minimum(np.arange(t, t + CHUNK), n - 1)
            if not np.allclose(item["action"].numpy(), frames["action"][idx]):
                problems.append(f"frame {e}/{t}: action chunk")
            if item["action_is_pad"].numpy().tolist() != (np.arange(t, t + CHUNK) >= n).tolist():
                problems.append(f"frame {e}/{t}: action_is_pad")
            if not np.isclose(float(item["next.reward"]), frames["next.reward"][t]) or bool(item["next.done"]) != bool(frames["next.done"][t]):
                problems.append(f"frame {e}/{t}: next.reward / next.done")
    stats = ds.meta.stats
    if stats is None or "observation.state" not in stats:
        problems.append("meta/stats.json not loaded")
    print(json.dumps({"ok": not problems, "problems": problems[:20], "frames": len(ds), "version": ds.meta.info["codebase_version"] if isinstance(ds.meta.info, dict) else ds.meta.info.codebase_version}))
"""


def _lerobot_script() -> str:
    import inspect
    import textwrap

    body = inspect.getsource(episodes).split(
        '"""Deterministic episodes (the same in both processes)."""\n', 1
    )[1]
    features = {k: {"dtype": f.dtype, "shape": f.shape, "names": f.names} for k, f in FEATURES.items()}
    return LEROBOT_SIDE % {
        "fps": FPS,
        "chunk": CHUNK,
        "lengths": LENGTHS,
        "episodes_src": textwrap.indent(textwrap.dedent(body), "    "),
        "features": repr(features),
    }


def _run_lerobot(python: str, mode: str, root: Path, seed: int) -> dict[str, object]:
    out = subprocess.run(
        [python, "-c", _lerobot_script(), mode, str(root), str(seed)],
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(root.parent)},
        timeout=600,
    )
    if out.returncode != 0:
        raise RuntimeError(f"lerobot ({mode}) failed:\n{out.stderr[-3000:]}")
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def check_ours_in_lerobot(python: str, tmp: Path) -> list[str]:
    """Direction 1: our writer, lerobot's reader."""
    root = tmp / "written_by_rlinf"
    writer = LeRobotWriter(root, fps=FPS, features=FEATURES)
    for frames, task in episodes(1):
        writer.add_episode(frames, task)
    writer.write()
    result = _run_lerobot(python, "read", root, 1)
    print(f"lerobot read our dataset: {result}")
    return [] if result["ok"] else [f"lerobot reading ours: {result['problems']}"]


def check_lerobots_in_ours(python: str, tmp: Path) -> list[str]:
    """Direction 2: lerobot's writer, our reader."""
    root = tmp / "written_by_lerobot"
    _run_lerobot(python, "write", root, 2)
    reader = LeRobotReader(root)
    expect = episodes(2)
    problems = []
    if reader.num_episodes != len(expect) or reader.num_frames != sum(LENGTHS):
        problems.append(f"{reader.num_episodes} episodes, {reader.num_frames} frames")
    for key in FEATURES:
        want = np.concatenate([f[key] for f, _ in expect])
        got = reader.column(key)
        if not np.allclose(got.reshape(want.shape).astype(np.float64), want.astype(np.float64)):
            problems.append(f"column {key}")
    tasks = [t for f, t in expect for _ in range(len(f["action"]))]
    if reader.task_of_frames() != tasks:
        problems.append("task strings")
    chunks = reader.action_chunks(["observation.state"], CHUNK)
    start = 0
    for frames, _ in expect:
        n = len(frames["action"])
        for t in range(n):
            idx = np.minimum(np.arange(t, t + CHUNK), n - 1)
            if not np.allclose(chunks.actions[start + t], frames["action"][idx]):
                problems.append(f"action chunk of frame {start + t}")
            if chunks.mask[start + t].tolist() != (np.arange(t, t + CHUNK) < n).tolist():
                problems.append(f"mask of frame {start + t}")
        start += n
    print(
        f"our reader read lerobot's dataset: {reader.num_episodes} episodes, {reader.num_frames} frames, "
        f"{problems or 'ok'}"
    )
    return problems


def main() -> int:
    """Run both directions; 0 when they agree, 1 when not, 2 without lerobot."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--lerobot-python",
        default="/tmp/lerobot-venv/bin/python",
        help="a Python interpreter with lerobot installed",
    )
    args = parser.parse_args()
    version = subprocess.run(
        [args.lerobot_python, "-c", "import importlib.metadata as m; print(m.version('lerobot'))"],
        capture_output=True,
        text=True,
    )
    if version.returncode != 0:
        print(f"no lerobot at {args.lerobot_python}: {version.stderr.strip()[-300:]}", file=sys.stderr)
        return 2
    print(f"lerobot {version.stdout.strip()} at {args.lerobot_python}")
    with tempfile.TemporaryDirectory() as d:
        problems = check_ours_in_lerobot(args.lerobot_python, Path(d))
        problems += check_lerobots_in_ours(args.lerobot_python, Path(d))
    print("OK: both directions agree" if not problems else f"FAILED: {problems}")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
