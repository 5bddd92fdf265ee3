"""The LeRobot dataset format (codebase version v3.0): a writer of episodes and a reader with action chunks.

On-disk layout (one dataset directory)::

    meta/info.json                           codebase_version, fps, features, counts, path templates
    meta/stats.json                          per feature: min, max, mean, std, count, q01, q10, q50, q90, q99
    meta/tasks.parquet                       task_index, indexed by the task string
    meta/episodes/chunk-000/file-000.parquet one row per episode: episode_index, tasks, length, data file,
                                             dataset_from_index / dataset_to_index, per-episode stats/*
    data/chunk-000/file-000.parquet          one row per frame: the features, then timestamp, frame_index,
                                             episode_index, index, task_index (one row group per episode)

Vectors are fixed-size lists, scalars (shape ``(1,)``) plain columns, images PNG bytes in a
``struct<bytes, path>`` column (LeRobot's ``image`` dtype). Image statistics are per channel of the values
scaled to ``[0, 1]``, shaped ``[C, 1, 1]``, as LeRobot computes them. Video features (MP4 under ``videos/``)
are not written, and a dataset with them is refused by the reader.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ...checkpoint import replace_directory

try:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        'the LeRobot dataset format needs pyarrow and pillow: pip install "rlinf-core[lerobot]"'
    ) from e

__all__ = [
    "CODEBASE_VERSION",
    "ActionChunks",
    "LeRobotFeature",
    "LeRobotReader",
    "LeRobotWriter",
]

CODEBASE_VERSION = "v3.0"
"""The LeRobot format version written and read."""

_DATA_FILE = "data/chunk-000/file-000.parquet"
_EPISODES_FILE = "meta/episodes/chunk-000/file-000.parquet"
_TASKS_FILE = "meta/tasks.parquet"
_INDEX_COLUMNS = {
    "timestamp": "float32",
    "frame_index": "int64",
    "episode_index": "int64",
    "index": "int64",
    "task_index": "int64",
}
_DTYPES = ("float32", "float64", "int64", "int32", "bool", "image")
_QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)


def _int_tuple(shape: Iterable[int]) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)


@attrs.frozen
class LeRobotFeature:
    """One feature of ``meta/info.json``.

    ``dtype`` (``float32``, ``int64``, ``bool``, ``image``, ...), ``shape`` of one frame's value (``[H, W, C]``
    for images) and optional per-dimension ``names``.
    """

    dtype: str = attrs.field(validator=attrs.validators.in_(_DTYPES))
    shape: tuple[int, ...] = attrs.field(converter=_int_tuple)
    names: list[str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``info.json`` entry."""
        return {"dtype": self.dtype, "shape": list(self.shape), "names": self.names}


def _hf_feature(feature: LeRobotFeature) -> dict[str, Any]:
    """The Hugging Face ``datasets`` type of a column (the parquet schema metadata LeRobot writes)."""
    if feature.dtype == "image":
        return {"_type": "Image"}
    value = {"dtype": feature.dtype, "_type": "Value"}
    if feature.shape == (1,):
        return value
    return {"feature": value, "length": int(np.prod(feature.shape)), "_type": "List"}


def _arrow_column(feature: LeRobotFeature, values: np.ndarray) -> pa.Array:
    n = len(values)
    if feature.dtype == "image":
        encoded = []
        for image in values:
            buf = io.BytesIO()
            Image.fromarray(np.asarray(image, dtype=np.uint8)).save(buf, format="PNG")
            encoded.append({"bytes": buf.getvalue(), "path": None})
        return pa.array(encoded, type=pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
    flat = np.asarray(values, dtype=feature.dtype).reshape(n, -1)
    if feature.shape == (1,):
        return pa.array(flat[:, 0])
    width = flat.shape[1]
    return pa.FixedSizeListArray.from_arrays(pa.array(flat.reshape(-1)), width)


def _stats(feature: LeRobotFeature, values: np.ndarray) -> dict[str, list[Any]]:
    """LeRobot's statistics of one feature over frames (images: per channel, scaled to [0, 1])."""
    if feature.dtype == "image":
        x = np.asarray(values, dtype=np.float64) / 255.0  # [N, H, W, C]
        x = x.reshape(-1, x.shape[-1])
        keep: tuple[int, ...] = (-1, 1, 1)
    else:
        x = np.asarray(values).reshape(len(values), -1)
        keep = (-1,)
    as_float = x.astype(np.float64)
    out: dict[str, Any] = {
        "min": x.min(axis=0).reshape(keep),
        "max": x.max(axis=0).reshape(keep),
        "mean": as_float.mean(axis=0).reshape(keep),
        "std": as_float.std(axis=0).reshape(keep),
        "count": np.array([len(values)]),
    }
    for q in _QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(as_float, q, axis=0).reshape(keep)
    return {k: v.tolist() for k, v in out.items()}


class LeRobotWriter:
    """Collect episodes, then write a LeRobot v3.0 dataset directory at once (:meth:`write`).

    Args:
        root: the dataset directory; written atomically by :meth:`write` (a staging sibling, then renamed,
            replacing any previous one).
        fps: frames per second of the recording (``timestamp = frame_index / fps``).
        features: the recorded features by name (LeRobot names them ``observation.state``,
            ``observation.images.<camera>``, ``action``, ``next.reward``, ``next.done``); the index columns
            are added by the writer.
        robot_type: stored in ``info.json``.

    Raises:
        ValueError: for a feature named like an index column, or a non-positive ``fps``.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        fps: int,
        features: Mapping[str, LeRobotFeature],
        robot_type: str | None = None,
    ) -> None:
        if fps <= 0:
            raise ValueError(f"fps must be > 0, got {fps}")
        clash = sorted(set(features) & {*_INDEX_COLUMNS, "task"})
        if clash:
            raise ValueError(f"features {clash} are written by the writer itself; rename them")
        self.root = Path(root)
        self.fps = fps
        self.features = dict(features)
        self.robot_type = robot_type
        self._episodes: list[tuple[dict[str, np.ndarray], str]] = []

    @property
    def num_episodes(self) -> int:
        """Episodes added so far."""
        return len(self._episodes)

    def add_episode(self, frames: Mapping[str, np.ndarray], task: str) -> None:
        """Add one episode: every feature's values ``[T, *shape]`` (``T`` frames, the same for all) and its task.

        Raises:
            ValueError: naming the feature when one is missing, extra, empty, of another length or shape.
        """
        missing, extra = sorted(set(self.features) - set(frames)), sorted(set(frames) - set(self.features))
        if missing or extra:
            raise ValueError(f"episode features: missing {missing}, not declared {extra}")
        lengths = {k: len(v) for k, v in frames.items()}
        if len(set(lengths.values())) != 1 or not next(iter(lengths.values())):
            raise ValueError(f"episode features must have the same number (>= 1) of frames: {lengths}")
        episode = {}
        for key, feature in self.features.items():
            values = np.asarray(frames[key])
            shape = values.shape[1:] if values.shape[1:] else (1,)
            if int(np.prod(shape)) != int(np.prod(feature.shape)) or (
                feature.dtype == "image" and shape != feature.shape
            ):
                raise ValueError(
                    f"{key}: frames of shape {values.shape[1:]}, the feature has {feature.shape}"
                )
            episode[key] = values
        self._episodes.append((episode, task))

    def write(self) -> Path:
        """Write the dataset (replacing ``root``); returns ``root``.

        Raises:
            ValueError: when no episode was added.
        """
        if not self._episodes:
            raise ValueError(f"no episode to write to {self.root}")
        replace_directory(self.root, self._write_into)
        return self.root

    def _write_into(self, root: Path) -> None:
        tasks: dict[str, int] = {}
        lengths = [len(next(iter(ep.values()))) for ep, _ in self._episodes]
        task_index = [tasks.setdefault(task, len(tasks)) for _, task in self._episodes]
        total = sum(lengths)
        columns: dict[str, np.ndarray] = {
            key: np.concatenate([ep[key] for ep, _ in self._episodes]) for key in self.features
        }
        frame_index = np.concatenate([np.arange(n) for n in lengths])
        columns["timestamp"] = (frame_index / self.fps).astype(np.float32)
        columns["frame_index"] = frame_index
        columns["episode_index"] = np.repeat(np.arange(len(lengths)), lengths)
        columns["index"] = np.arange(total)
        columns["task_index"] = np.repeat(np.array(task_index), lengths)
        every = {**self.features, **{k: LeRobotFeature(d, (1,)) for k, d in _INDEX_COLUMNS.items()}}
        table = pa.table({k: _arrow_column(f, columns[k]) for k, f in every.items()})
        hf = {"info": {"features": {k: _hf_feature(f) for k, f in every.items()}}}
        table = table.replace_schema_metadata({"huggingface": json.dumps(hf)})
        (root / _DATA_FILE).parent.mkdir(parents=True)
        with pq.ParquetWriter(root / _DATA_FILE, table.schema) as writer:
            start = 0
            for n in lengths:  # one row group per episode, as LeRobot writes them
                writer.write_table(table.slice(start, n))
                start += n
        self._write_meta(root, every, columns, lengths, task_index, tasks)

    def _write_meta(
        self,
        root: Path,
        every: Mapping[str, LeRobotFeature],
        columns: Mapping[str, np.ndarray],
        lengths: Sequence[int],
        task_index: Sequence[int],
        tasks: Mapping[str, int],
    ) -> None:
        names = {i: t for t, i in tasks.items()}
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        rows: list[dict[str, Any]] = []
        for i, n in enumerate(lengths):
            row: dict[str, Any] = {
                "episode_index": i,
                "tasks": [names[task_index[i]]],
                "length": n,
                "data/chunk_index": 0,
                "data/file_index": 0,
                "dataset_from_index": int(bounds[i]),
                "dataset_to_index": int(bounds[i + 1]),
            }
            for key, feature in every.items():
                for stat, value in _stats(feature, columns[key][bounds[i] : bounds[i + 1]]).items():
                    row[f"stats/{key}/{stat}"] = value
            row["meta/episodes/chunk_index"] = 0
            row["meta/episodes/file_index"] = 0
            rows.append(row)
        (root / _EPISODES_FILE).parent.mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), root / _EPISODES_FILE)
        pq.write_table(
            pa.table(
                {"task_index": list(tasks.values()), "__index_level_0__": list(tasks)}
            ).replace_schema_metadata({"pandas": json.dumps(_pandas_index_meta())}),
            root / _TASKS_FILE,
        )
        stats = {key: _stats(feature, columns[key]) for key, feature in every.items()}
        (root / "meta" / "stats.json").write_text(json.dumps(stats, indent=4))
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": self.robot_type,
            "total_episodes": len(lengths),
            "total_frames": int(bounds[-1]),
            "total_tasks": len(tasks),
            "chunks_size": 1000,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": self.fps,
            "splits": {"train": f"0:{len(lengths)}"},
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": None,
            "features": {k: f.to_json() for k, f in every.items()},
        }
        (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))


def _pandas_index_meta() -> dict[str, Any]:
    """The pandas metadata that makes ``pd.read_parquet(tasks.parquet)`` index the table by the task string."""
    return {
        "index_columns": ["__index_level_0__"],
        "column_indexes": [],
        "columns": [
            {
                "name": "task_index",
                "field_name": "task_index",
                "pandas_type": "int64",
                "numpy_type": "int64",
                "metadata": None,
            },
            {
                "name": None,
                "field_name": "__index_level_0__",
                "pandas_type": "unicode",
                "numpy_type": "object",
                "metadata": None,
            },
        ],
        "pandas_version": "2.0.0",
    }


@attrs.frozen
class ActionChunks:
    """Training samples of a dataset: each frame's observation with the actions of the next ``C`` frames.

    Attributes:
        obs: per observation feature, ``[N, *shape]`` (images ``uint8 [N, H, W, C]``).
        actions: ``[N, C, *action_shape]``: the actions of frames ``t .. t + C - 1`` of the frame's episode;
            past the episode's end the last action is repeated (LeRobot clamps the same way).
        mask: ``[N, C]`` bool: ``True`` for real (not padded) steps.
        episode_index: ``[N]`` the episode of each sample.
    """

    obs: dict[str, np.ndarray]
    actions: np.ndarray
    mask: np.ndarray
    episode_index: np.ndarray

    def __len__(self) -> int:
        return len(self.actions)


class LeRobotReader:
    """Read a LeRobot v3.0 dataset directory into memory (every ``data/*/*.parquet`` file).

    Args:
        root: the dataset directory (with ``meta/info.json``).

    Raises:
        FileNotFoundError: without ``meta/info.json`` or data files.
        ValueError: for another codebase version, or video features (not read).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        info_file = self.root / "meta" / "info.json"
        if not info_file.is_file():
            raise FileNotFoundError(f"{self.root} is not a LeRobot dataset: no meta/info.json")
        self.info: dict[str, Any] = json.loads(info_file.read_text())
        version = self.info.get("codebase_version")
        if version != CODEBASE_VERSION:
            raise ValueError(
                f"{info_file}: codebase_version {version!r}; this reader reads {CODEBASE_VERSION}"
            )
        self.features = {
            k: LeRobotFeature(f["dtype"], tuple(f["shape"]), f.get("names"))
            for k, f in self.info["features"].items()
            if f["dtype"] != "video"
        }
        videos = sorted(k for k, f in self.info["features"].items() if f["dtype"] == "video")
        if videos:
            raise ValueError(
                f"{self.root}: video features {videos} are not read; write the images as image features "
                "(LeRobot: use_videos=False)"
            )
        self.fps = int(self.info["fps"])
        files = sorted((self.root / "data").glob("*/*.parquet"))
        if not files:
            raise FileNotFoundError(f"{self.root}: no data/*/*.parquet files")
        table = pa.concat_tables([pq.read_table(f) for f in files])
        order = np.argsort(np.asarray(table.column("index")), kind="stable")
        self._table = table.take(pa.array(order))
        tasks = pq.read_table(self.root / _TASKS_FILE)
        index_name = next(n for n in tasks.column_names if n != "task_index")
        self.tasks: dict[int, str] = dict(
            zip(tasks.column("task_index").to_pylist(), tasks.column(index_name).to_pylist(), strict=True)
        )
        """Task strings by ``task_index``."""
        self.episode_index = np.asarray(self._table.column("episode_index"))
        """``[num_frames]`` the episode of each frame."""

    @property
    def num_frames(self) -> int:
        """Frames in the dataset."""
        return int(self._table.num_rows)

    @property
    def num_episodes(self) -> int:
        """Episodes in the dataset."""
        return len(np.unique(self.episode_index))

    def column(self, key: str) -> np.ndarray:
        """One feature over all frames, ``[num_frames, *shape]`` (images decoded: ``uint8 [N, H, W, C]``).

        Raises:
            KeyError: listing the features when ``key`` is not one.
        """
        if key not in self.features:
            raise KeyError(f"{key!r} is not a feature of {self.root}; it has {sorted(self.features)}")
        feature = self.features[key]
        col = self._table.column(key)
        if feature.dtype == "image":
            return np.stack([np.asarray(Image.open(io.BytesIO(item["bytes"]))) for item in col.to_pylist()])
        values = np.asarray(col.combine_chunks().flatten() if feature.shape != (1,) else col)
        return values.reshape(self.num_frames, *feature.shape).astype(feature.dtype, copy=False)

    def task_of_frames(self) -> list[str]:
        """Each frame's task string."""
        return [self.tasks[int(i)] for i in np.asarray(self._table.column("task_index"))]

    def action_chunks(
        self,
        obs_keys: Iterable[str],
        chunk: int,
        *,
        action_key: str = "action",
        episodes: Sequence[int] | None = None,
    ) -> ActionChunks:
        """Samples for imitation: the observation of each frame and the next ``chunk`` actions (padded, masked).

        Args:
            obs_keys: the observation features to return.
            chunk: ``C``, actions per sample.
            action_key: the action feature.
            episodes: only the frames of these episodes (default: all).

        Raises:
            ValueError: for ``chunk < 1``; KeyError for an unknown feature.
        """
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        actions = self.column(action_key)
        if self.features[action_key].shape == (1,) and actions.ndim == 2:
            actions = actions[:, 0]
        ep = self.episode_index
        keep = np.ones(len(ep), dtype=bool) if episodes is None else np.isin(ep, np.asarray(episodes))
        # Last frame of each frame's episode (frames of an episode are contiguous and in order).
        ends = np.empty(len(ep), dtype=np.int64)
        boundaries = np.flatnonzero(np.diff(ep)) + 1
        for lo, hi in zip(np.r_[0, boundaries], np.r_[boundaries, len(ep)], strict=True):
            ends[lo:hi] = hi - 1
        steps = np.arange(len(ep))[:, None] + np.arange(chunk)[None, :]
        mask = steps <= ends[:, None]
        index = np.minimum(steps, ends[:, None])
        obs = {k: self.column(k)[keep] for k in obs_keys}
        return ActionChunks(obs, actions[index[keep]], mask[keep], ep[keep])
