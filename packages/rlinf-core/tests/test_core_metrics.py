from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rlinf_core.metrics import MetricLogger, plot_run, read_metrics
from rlinf_core.metrics._plot import main as plot_main


def test_jsonl_records_have_step_and_wall_time(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, backends=("tensorboard",)) as logger:
        logger.log({"train/loss": 1.5, "eval/return_mean": np.float32(20.0), "skip": "text"}, step=1)
        logger.log({"train/loss": 0.5}, step=2)
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2]
    assert lines[0]["eval/return_mean"] == 20.0 and "skip" not in lines[0]
    assert lines[1]["time/wall_s"] >= lines[0]["time/wall_s"] >= 0
    assert any((tmp_path / "tensorboard").iterdir())
    assert lines[1]["time/since_process_start_s"] >= lines[0]["time/since_process_start_s"] > 0


def test_since_process_start_counts_the_time_before_the_import() -> None:
    # A fresh interpreter that waits 0.5 s before importing: the clock starts at process creation, not import.
    code = (
        "import time; time.sleep(0.5); "
        "from rlinf_core.metrics import seconds_since_process_start as s; "
        "from rlinf_core.metrics._logger import _START; "
        "print(s(), time.monotonic() - _START)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    since_start, since_import = map(float, out.stdout.split())
    assert 0.5 <= since_start < 30
    assert since_start >= since_import + 0.45


def test_unknown_backend_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(
        ValueError, match=r"logger_backends: unknown \['tensorbord'\]; allowed: tensorboard, wandb, swanlab"
    ):
        MetricLogger(tmp_path / "run", backends=("tensorbord",))
    assert not (tmp_path / "run").exists() or not (tmp_path / "run" / "metrics.jsonl").exists()


def test_read_metrics_skips_truncated_line(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "a": 2}\n{"step": 2, "a"')
    assert read_metrics(tmp_path) == [{"step": 1.0, "a": 2.0}]


def test_plot_writes_png_per_key(tmp_path: Path) -> None:
    with MetricLogger(tmp_path, backends=()) as logger:
        for step in range(5):
            logger.log({"eval/return_mean": step * 10.0, "train/loss": 1.0 / (step + 1)}, step=step)
    paths = plot_run([tmp_path])
    assert sorted(p.name for p in paths) == ["eval_return_mean.png", "train_loss.png"]
    assert all(p.stat().st_size > 1000 and p.read_bytes()[:4] == b"\x89PNG" for p in paths)
    assert (
        plot_main([str(tmp_path), "--x", "time/wall_s", "--keys", "train/loss", "--out", str(tmp_path / "o")])
        == 0
    )
    assert (tmp_path / "o" / "train_loss.png").is_file()


def _tensorboard_texts(log_dir: Path) -> list[tuple[str, int, str]]:
    """(tag, step, text) of every text summary in the event files under ``log_dir`` (read with tensorboardX's
    own protobuf definitions: TFRecord framing = length u64, crc u32, payload, crc u32)."""
    import struct

    from tensorboardX.proto.event_pb2 import Event

    out = []
    for path in sorted(log_dir.rglob("events.out.tfevents.*")):
        data = path.read_bytes()
        pos = 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            event = Event.FromString(data[pos + 12 : pos + 12 + n])
            pos += 12 + n + 4
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == "text":
                    out.append((value.tag, event.step, value.tensor.string_val[0].decode()))
    return out


def test_samples_go_to_jsonl_and_tensorboard_text(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "response": "a | b\nc", "reward": float(i % 2)} for i in range(10)]
    with MetricLogger(tmp_path, ["tensorboard"]) as logger:
        path = logger.log_samples("eval", rows, step=4, shown=3)
    assert path == tmp_path / "samples" / "eval_step4.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines == [{"step": 4, **r} for r in rows]
    ((tag, step, text),) = _tensorboard_texts(tmp_path / "tensorboard")
    assert tag.startswith("samples/eval") and step == 4
    table = text.splitlines()
    assert table[0] == "| prompt | response | reward |" and len(table) == 2 + 3  # header, rule, 3 shown
    assert "a \\| b<br>c" in table[2]


def test_timeline_plot_draws_a_step_of_a_trace(tmp_path: Path) -> None:
    from rlinf_core.metrics import plot_timeline
    from rlinf_core.metrics._plot import main
    from rlinf_scheduler import DRIVER, ProcessTrace, Span, Timeline

    t = Timeline()
    t.add(
        ProcessTrace(
            "env:0", "n", 1, (Span("env_step", "compute", 10, 30, "m"), Span("recv", "wait", 40, 20, "m"))
        )
    )
    driver = (Span("train_step 1", "compute", 0, 100, "m"), Span("train_step 2", "compute", 100, 100, "m"))
    t.add(ProcessTrace(DRIVER, "n", 1, driver))
    t.write(tmp_path / "trace.json")
    png = plot_timeline(tmp_path / "trace.json", tmp_path / "t.png", step=1)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no train_step 7"):
        plot_timeline(tmp_path / "trace.json", tmp_path / "t.png", step=7)
    assert main([str(tmp_path), "--timeline"]) == 0
    assert (tmp_path / "plots" / "timeline.png").is_file()
