"""EmbodiedRunner's loop logic against fake worker groups (no Ray)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rlinf_core.checkpoint import is_complete
from rlinf_core.metrics import read_metrics
from rlinf_runners import EmbodiedRunner, LoggerConfig, RunnerConfig
from rlinf_scheduler import ProcessTrace, Span, load_trace, now_us, tracing_enabled


class _Done:
    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def wait(self, timeout: float | None = None) -> list[Any]:
        return self.results


class FakeGroup:
    """Records calls; answers like one-rank actor/rollout/env groups would."""

    def __init__(self, name: str, log: list[str], evals: list[float]) -> None:
        self.name = name
        self.world_size = 1
        self.log = log
        self.evals = evals
        self.version = 0
        self.fail_at = -1

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _Done:
        assert fn.__module__ == "rlinf_core.protocols._roles", f"runners call role methods, not {fn!r}"
        method = fn.__name__
        self.log.append(f"{self.name}.{method}")
        if method == "pop_timings":
            return _Done([{"work": 0.5}])
        if method == "pop_trace":
            now = now_us()
            return _Done(
                [ProcessTrace(f"{self.name}:0", "host", 1, (Span("work", "compute", now - 10, 5, "main"),))]
            )
        if method == "interact":
            return _Done(
                [{"returns": [10.0, 20.0], "lengths": [10, 20], "successes": [False, True], "env_steps": 64}]
            )
        if method == "evaluate":
            ret = self.evals.pop(0)
            return _Done([{"returns": [ret, ret], "lengths": [1, 1], "successes": [True, False]}])
        if method == "run_training":
            if self.version == self.fail_at:
                raise RuntimeError("actor broke")
            self.version += 1
            return _Done([{"actor/total_loss": 1.0 / self.version}])
        if method == "compute_advantages_and_returns":
            return _Done([{"rollout/advantages": 0.0}])
        if method == "save_checkpoint":
            (Path(args[0]) / f"{self.name}.json").write_text(json.dumps({"version": self.version}))
        if method == "load_checkpoint":
            self.version = json.loads((Path(args[0]) / f"{self.name}.json").read_text())["version"]
        return _Done([None])


def _runner(tmp_path: Path, log: list[str], evals: list[float], **cfg: Any) -> EmbodiedRunner:
    config = RunnerConfig(
        progress_bar=False, logger=LoggerConfig(log_path=str(tmp_path), logger_backends=()), **cfg
    )
    groups = {name: FakeGroup(name, log, evals) for name in ("actor", "rollout", "env")}
    return EmbodiedRunner(config, channel=object(), **groups)


def test_loop_order_eval_cadence_checkpoints_and_metrics(tmp_path: Path) -> None:
    log: list[str] = []
    result = _runner(
        tmp_path, log, [1.0, 2.0, 3.0], max_epochs=4, val_check_interval=2, save_interval=3
    ).run()
    assert result.global_step == 4
    step = log[: log.index("env.pop_timings") + 1]
    assert step == [
        "actor.sync_model_to_rollout",
        "rollout.sync_model_from_actor",
        "rollout.generate",
        "env.evaluate",
        "actor.recv_rollout_batch",
        "rollout.generate",
        "env.interact",
        "actor.compute_advantages_and_returns",
        "actor.run_training",
        "actor.pop_timings",
        "rollout.pop_timings",
        "env.pop_timings",
    ]
    records = read_metrics(result.metrics_file)
    assert [(r["step"], r["eval/return_mean"]) for r in records if "eval/return_mean" in r] == [
        (0, 1.0),
        (2, 2.0),
        (4, 3.0),  # the final evaluation after the last step
    ]
    train = [r for r in records if "train/actor/total_loss" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4]
    assert train[0]["env/return_mean"] == 15.0 and train[0]["env/success_rate"] == 0.5
    assert train[0]["env/steps"] == 64 and train[0]["time/actor/work"] == 0.5
    assert train[0]["rollout/advantages"] == 0.0
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["global_step_3", "global_step_4"]  # every 3 steps and after the last
    assert all(is_complete(tmp_path / "checkpoints" / c) for c in ckpts)


def test_profiled_run_logs_usage_and_a_crash_leaves_a_valid_trace(tmp_path: Path) -> None:
    log: list[str] = []
    runner = _runner(
        tmp_path, log, [1.0] * 5, max_epochs=4, val_check_interval=-1, save_interval=-1, profile=True
    )
    runner.actor.fail_at = 2  # type: ignore[attr-defined]  # the third update raises
    with pytest.raises(RuntimeError, match="actor broke"):
        runner.run()
    assert not tracing_enabled()  # the driver's recorder is off again
    assert (
        log.count("actor.set_tracing") == 1
    )  # on at the start; a failed run does not call the workers again
    assert log.count("env.pop_trace") == 2  # after each complete step
    events = load_trace(tmp_path / "trace.json")
    processes = {e["args"]["name"].split(" ")[0] for e in events if e["name"] == "process_name"}
    assert processes == {"actor:0", "rollout:0", "env:0", "driver"}
    driver_spans = {e["name"] for e in events if e["ph"] == "X" and e["name"].startswith("train_step")}
    assert driver_spans == {"train_step 1", "train_step 2", "train_step 3"}  # the failed step's too
    train = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "train/actor/total_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert {f"profile/{g}/busy_frac" for g in ("actor", "rollout", "env", "driver")} <= r.keys()


def test_stop_eval_return_ends_early_and_saves(tmp_path: Path) -> None:
    log: list[str] = []
    result = _runner(
        tmp_path, log, [1.0, 5.0, 9.0], max_epochs=10, val_check_interval=1, stop_eval_return=5.0
    ).run()
    assert result.global_step == 1 and result.last_eval["eval/return_mean"] == 5.0
    assert result.last_checkpoint is not None and result.last_checkpoint.name == "global_step_1"


def test_resume_restores_step_and_actor(tmp_path: Path) -> None:
    _runner(tmp_path, [], [], max_epochs=2, val_check_interval=-1, save_interval=1).run()
    log: list[str] = []
    runner = _runner(
        tmp_path, log, [], max_epochs=3, val_check_interval=-1, save_interval=1, resume_dir="auto"
    )
    result = runner.run()
    assert result.global_step == 3
    assert log[0] == "actor.load_checkpoint" and log.count("actor.run_training") == 1
    assert runner.actor.version == 3  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="does not exist"):
        _runner(tmp_path, [], [], resume_dir=str(tmp_path / "nope")).run()


def test_evaluation_progress_bar_follows_the_slowest_env_rank(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlinf_scheduler import Empty

    runner = _runner(tmp_path, [], [])
    runner.env.world_size = 2  # type: ignore[attr-defined]
    reports = [
        {"rank": 0, "done": 6, "total": 10, "episodes": 1},
        {"rank": 1, "done": 3, "total": 10, "episodes": 0},
        {"rank": 0, "done": 10, "total": 10, "episodes": 4},
        {"rank": 1, "done": 10, "total": 10, "episodes": 4},
    ]
    shown: list[int] = []

    class Chan:
        def get(self, key: str, timeout: float) -> Any:
            assert key == "k"
            return self.get_nowait(key)

        def get_nowait(self, key: str) -> Any:
            if not reports:
                raise Empty("none")
            return reports.pop(0)

    class Call:
        def done(self) -> bool:
            return not reports

        def wait(self, timeout: float | None = None) -> list[str]:
            return ["r0", "r1"]

    import rlinf_runners._embodied as embodied

    real = embodied.tqdm

    def spy(*args: Any, **kwargs: Any) -> Any:
        bar = real(*args, **kwargs)
        refresh = bar.refresh

        def record(*a: Any, **k: Any) -> Any:
            shown.append(bar.n)
            return refresh(*a, **k)

        bar.refresh = record
        return bar

    monkeypatch.setattr(embodied, "tqdm", spy)
    assert runner._wait_showing_progress(Call(), Chan(), "k") == ["r0", "r1"]  # type: ignore[arg-type]
    # The bar waits for every rank's first report, then shows the slowest rank's chunk steps.
    assert shown == [0, 3, 3, 10]
    assert "episodes=8" in capsys.readouterr().err
