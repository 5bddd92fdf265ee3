"""The asynchronous runners' scheduling against fake worker groups (no Ray): the staleness bound, checkpoints,
the off-policy warm-up."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rlinf_core.metrics import read_metrics
from rlinf_runners import AsyncEmbodiedRunner, AsyncOffPolicyRunner, LoggerConfig, RunnerConfig
from rlinf_runners._async_embodied import staleness_metrics


class _Done:
    def __init__(self, results: list[Any]) -> None:
        self.results = results

    def wait(self, timeout: float | None = None) -> list[Any]:
        return self.results

    def done(self) -> bool:
        return True


class FakeGroup:
    """One-rank groups; the actor trains instantly and reports the lag of the batch it was given."""

    def __init__(self, name: str, log: list[tuple[str, Any]], shared: dict[str, Any]) -> None:
        self.name = name
        self.world_size = 1
        self.log = log
        self.shared = shared

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> _Done:
        assert fn.__module__ == "rlinf_core.protocols._roles", f"runners call role methods, not {fn!r}"
        method, shared = fn.__name__, self.shared
        if method == "generate" and args[1] in ("train", "random"):
            self.log.append(("generate", kwargs["min_version"]))
            self.log.append(("mode", args[1]))
        elif method == "interact":
            self.log.append(("interact", kwargs["batch"]))
            # The rollout serves the batch with the newest published weights (at least min_version).
            shared["batches"][kwargs["batch"]] = shared["published"]
        elif method == "publish_weights":
            shared["published"] = shared["version"]
            self.log.append(("publish", shared["version"]))
            return _Done([shared["version"]])
        elif method == "recv_rollout_batch":
            self.log.append(("recv", kwargs["batch"]))
            shared["current"] = kwargs["batch"]
        elif method in ("compute_proximal_logprobs", "received_staleness"):
            lag = shared["version"] - shared["batches"][shared["current"]]
            return _Done([{"staleness/samples": 4.0, "staleness/sum": 4.0 * lag, "staleness/max": lag,
                           "staleness/min": lag, f"staleness/count_{lag}": 4.0}])  # fmt: skip
        elif method == "run_training":
            shared["version"] += 1
            self.log.append(("train", shared["version"]))
            return _Done([{"actor/total_loss": 1.0}])
        elif method == "save_checkpoint":
            self.log.append(("save", self.name))
            (Path(args[0]) / f"{self.name}.json").write_text(json.dumps({"version": shared["version"]}))
        elif method == "load_checkpoint":
            shared["version"] = json.loads((Path(args[0]) / f"{self.name}.json").read_text())["version"]
        elif method == "pop_timings" or method == "compute_advantages_and_returns":
            return _Done([{}])
        elif method == "evaluate":
            return _Done([{"returns": [1.0], "lengths": [1], "successes": [True]}])
        return _Done([{"env_steps": 8}] if method == "interact" else [None])


def _run(
    tmp_path: Path, k: int, runner: type[Any] = AsyncEmbodiedRunner, warmup: int | None = None, **cfg: Any
) -> tuple[list[tuple[str, Any]], Any]:
    log: list[tuple[str, Any]] = []
    shared: dict[str, Any] = {"version": 0, "published": -1, "batches": {}}
    config = RunnerConfig(
        progress_bar=False, logger=LoggerConfig(log_path=str(tmp_path), logger_backends=()), **cfg
    )
    groups = {name: FakeGroup(name, log, shared) for name in ("actor", "rollout", "env")}
    extra = {} if warmup is None else {"random_warmup_steps": warmup}
    made = runner(config, staleness_threshold=k, channel=object(), weights=object(), **groups, **extra)
    return log, made.run()


def _order(log: list[tuple[str, Any]]) -> list[str]:
    named = {"interact", "train", "publish"}
    return [f"{a}{b}" if a in named else a for a, b in log if a in named or (a, b) == ("save", "actor")]


def test_staleness_zero_is_the_synchronous_order(tmp_path: Path) -> None:
    log, result = _run(tmp_path, 0, max_epochs=3, val_check_interval=-1, save_interval=0)
    assert result.global_step == 3
    assert (
        _order(log)
        == [
            *("publish0", "interact0", "train1"),
            *("publish1", "interact1", "train2"),
            *("publish2", "interact2", "train3", "publish3", "save"),
        ][: len(_order(log))]
    )
    assert [v for a, v in log if a == "generate"] == [0, 1, 2]
    records = [r for r in read_metrics(result.metrics_file) if "staleness/max" in r]
    assert [r["staleness/max"] for r in records] == [0, 0, 0]


def test_bound_one_overlaps_the_update_and_never_exceeds_the_bound(tmp_path: Path) -> None:
    log, result = _run(tmp_path, 1, max_epochs=4, val_check_interval=-1, save_interval=0)
    assert result.global_step == 4
    order = _order(log)
    # Batch b + 1 is produced while step b trains, with the weights of version b (at least b + 1 - 1).
    assert order[:5] == ["publish0", "interact0", "interact1", "train1", "publish1"]
    assert [v for a, v in log if a == "generate"] == [0, 0, 1, 2]
    records = [r for r in read_metrics(result.metrics_file) if "staleness/max" in r]
    assert [r["staleness/max"] for r in records] == [0, 1, 1, 1]
    assert records[1]["staleness/frac_1"] == 1.0 and records[1]["staleness/published_version"] == 2


def test_no_batch_of_the_next_checkpoint_interval_starts_before_the_checkpoint(tmp_path: Path) -> None:
    log, _ = _run(tmp_path, 2, max_epochs=4, val_check_interval=-1, save_interval=2)
    order = _order(log)
    # Batch 2 starts only after global_step_2 is saved; batch 1 overlaps step 0, batch 3 overlaps step 2.
    assert order.index("interact2") > order.index("save") > order.index("train2")
    assert order.index("interact1") < order.index("train1")
    assert order.index("interact3") < order.index("train3")


def test_offpolicy_warmup_batches_are_random_and_bounded_like_the_others(tmp_path: Path) -> None:
    log, result = _run(
        tmp_path, 1, AsyncOffPolicyRunner, warmup=2, max_epochs=4, val_check_interval=-1, save_interval=0
    )
    assert result.global_step == 4
    assert [m for a, m in log if a == "mode"] == ["random", "random", "train", "train"]
    assert [v for a, v in log if a == "generate"] == [0, 0, 1, 2]
    assert _order(log)[:5] == ["publish0", "interact0", "interact1", "train1", "publish1"]
    records = [r for r in read_metrics(result.metrics_file) if "staleness/max" in r]
    assert [r["staleness/max"] for r in records] == [0, 1, 1, 1]
    assert [r["rollout/random_actions"] for r in records] == [1.0, 1.0, 0.0, 0.0]


def test_staleness_metrics_merge_ranks() -> None:
    ranks = [
        {"staleness/samples": 2.0, "staleness/sum": 2.0, "staleness/max": 1.0, "staleness/min": 1.0,
         "staleness/count_1": 2.0},
        {"staleness/samples": 2.0, "staleness/sum": 0.0, "staleness/max": 0.0, "staleness/min": 0.0,
         "staleness/count_0": 2.0},
    ]  # fmt: skip
    assert staleness_metrics(ranks) == {
        "staleness/mean": 0.5,
        "staleness/max": 1.0,
        "staleness/min": 0.0,
        "staleness/frac_0": 0.5,
        "staleness/frac_1": 0.5,
    }
    with pytest.raises(ValueError, match="staleness_threshold"):
        AsyncEmbodiedRunner(RunnerConfig(), staleness_threshold=-1, actor=None, rollout=None, env=None)  # type: ignore[arg-type]
