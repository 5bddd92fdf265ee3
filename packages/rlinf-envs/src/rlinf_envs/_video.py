"""Evaluation videos: frames of the first few envs, one per policy step, written as MP4 when their episode ends."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from rlinf_core.protocols import VecEnv

from ._config import VideoConfig

__all__ = ["EpisodeVideos", "frames_of"]


def frames_of(env: VecEnv, obs: Any, source: str, count: int) -> np.ndarray:
    """``[count, H, W, 3]`` uint8 frames of the first ``count`` envs.

    Args:
        env: the envs (``render()`` for ``source="render"``).
        obs: their current observation (``source="obs"``: its ``rgb`` entry, or the array itself when it is an
            image; with frame stacking, the newest 3 channels).
        source: ``obs`` or ``render``.
        count: how many envs.

    Raises:
        ValueError: naming ``env.eval.video_cfg.source`` when the observation has no colour image or the backend
            cannot render.
    """
    if source == "render":
        render = getattr(env, "render", None)
        if render is None:
            raise ValueError(
                f"env.eval.video_cfg.source: 'render' is not supported by {type(env).__name__}; use 'obs' with a "
                f"camera observation mode"
            )
        return np.asarray(render())[:count]
    image = obs.get("rgb") if isinstance(obs, dict) else obs
    if image is None or np.asarray(image).ndim != 4 or np.asarray(image).dtype != np.uint8:
        raise ValueError(
            "env.eval.video_cfg.source: 'obs' needs a colour image observation (an 'rgb' entry [H, W, 3] uint8); "
            "use source: render, or a camera obs_mode"
        )
    return np.asarray(image)[:count, ..., -3:]


class EpisodeVideos:
    """The frames of ``count`` envs' first episodes; each is written when its episode ends.

    Args:
        cfg: ``env.eval.video_cfg``.
        out_dir: the directory of the MP4 files.
        prefix: file name prefix (the env rank).
        count: envs recorded.
    """

    def __init__(self, cfg: VideoConfig, out_dir: str | Path, prefix: str, count: int) -> None:
        try:
            import imageio.v3 as iio  # noqa: F401  (checked here: fail before the evaluation, not after it)
            import imageio_ffmpeg  # noqa: F401
        except ImportError as e:
            raise ImportError(f'evaluation videos need imageio: pip install "rlinf-envs[video]" ({e})') from e
        self.cfg = cfg
        self.out_dir = Path(out_dir)
        self.prefix = prefix
        self.frames: list[list[np.ndarray]] = [[] for _ in range(count)]
        self.open = [True] * count
        self.files: list[str] = []

    def add(self, frames: np.ndarray) -> None:
        """Append one frame per still-recorded env (``frames`` ``[count, H, W, 3]``)."""
        for i, on in enumerate(self.open):
            if on:
                self.frames[i].append(np.ascontiguousarray(frames[i]))

    def finish(self, env_index: int, *, success: bool | None, task: str | None) -> None:
        """Write env ``env_index``'s episode and stop recording it (no-op for other envs)."""
        if env_index >= len(self.open) or not self.open[env_index]:
            return
        self.open[env_index] = False
        self._write(env_index, success, task)

    def close(self) -> None:
        """Write the episodes still open (cut by the evaluation's step limit)."""
        for i, on in enumerate(self.open):
            if on:
                self.open[i] = False
                self._write(i, None, None)

    def _write(self, i: int, success: bool | None, task: str | None) -> None:
        import imageio.v3 as iio

        frames = self.frames[i]
        self.frames[i] = []
        if not frames:
            return
        outcome = {True: "success", False: "failure", None: "unfinished"}[success]
        label = "" if task is None else "_" + re.sub(r"[^A-Za-z0-9_.-]+", "_", task)[:60]
        path = self.out_dir / f"{self.prefix}_env{i}{label}_{outcome}.mp4"
        path.parent.mkdir(parents=True, exist_ok=True)
        # Even sizes: H.264 with yuv420p needs them.
        h, w = frames[0].shape[0] // 2 * 2, frames[0].shape[1] // 2 * 2
        video = np.stack([f[:h, :w] for f in frames])
        # macro_block_size 2: keep the size (imageio would pad to multiples of 16); even sizes suit yuv420p.
        iio.imwrite(path, video, fps=self.cfg.fps, codec="libx264", macro_block_size=2)
        self.files.append(str(path))
