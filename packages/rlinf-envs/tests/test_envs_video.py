"""Evaluation videos: frames from observations or the renderer, files written per episode and decodable."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from rlinf_envs import VideoConfig
from rlinf_envs._video import EpisodeVideos, frames_of

iio = pytest.importorskip("imageio.v3", reason='needs the video extra: pip install "rlinf-envs[video]"')


class _Renderer:
    def render(self) -> np.ndarray:
        return np.full((3, 16, 20, 3), 7, np.uint8)


def test_frames_from_obs_take_the_newest_stacked_frame_and_render_works() -> None:
    stacked = np.concatenate([np.zeros((3, 8, 8, 3), np.uint8), np.full((3, 8, 8, 3), 9, np.uint8)], axis=-1)
    frames = frames_of(_Renderer(), {"rgb": stacked, "state": np.zeros((3, 2))}, "obs", 2)  # type: ignore[arg-type]
    assert frames.shape == (2, 8, 8, 3) and (frames == 9).all()
    assert frames_of(_Renderer(), None, "render", 2).shape == (2, 16, 20, 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"env\.eval\.video_cfg\.source: 'obs' needs a colour image"):
        frames_of(_Renderer(), np.zeros((3, 4), np.float32), "obs", 1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'render' is not supported by object"):
        frames_of(object(), None, "render", 1)  # type: ignore[arg-type]


def test_each_episode_is_written_once_with_its_outcome_and_decodes(tmp_path: Path) -> None:
    videos = EpisodeVideos(VideoConfig(save_video=True, fps=5), tmp_path, "rank0", 2)
    rng = np.random.default_rng(0)
    clip = [rng.integers(0, 256, (2, 33, 41, 3), dtype=np.uint8) for _ in range(6)]  # odd sizes: cropped even
    for frames in clip[:4]:
        videos.add(frames)
    videos.finish(0, success=True, task="pick up the bowl")
    videos.finish(0, success=False, task=None)  # already written: ignored
    for frames in clip[4:]:
        videos.add(frames)
    videos.close()  # env 1 never finished
    names = sorted(Path(f).name for f in videos.files)
    assert names == ["rank0_env0_pick_up_the_bowl_success.mp4", "rank0_env1_unfinished.mp4"]
    first = iio.imread(tmp_path / names[0])
    assert first.shape == (4, 32, 40, 3)  # 4 frames (not the ones after the episode ended)
    assert iio.imread(tmp_path / names[1]).shape[0] == 6
    # Lossy, but the picture is the recorded one: compare with a tolerance on the mean.
    assert np.abs(first[0].astype(int) - clip[0][0, :32, :40].astype(int)).mean() < 60
