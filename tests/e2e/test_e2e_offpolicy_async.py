"""End to end: asynchronous SAC (``pendulum_sac`` with ``runner.mode: async``) through real worker groups.

With ``algorithm.staleness_threshold: 0`` the asynchronous off-policy runner computes what the synchronous one
does (policy, critics, optimizers, replay buffer, RNGs and metrics); with a positive bound every transition's
lag stays within it; a resume is a continuation. (A killed worker: ``test_e2e_embodied_failures.py``.)
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
from rlinf_core.checkpoint import is_complete
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import APP_DIR, SAC_SMALL, assert_same_actor_state, assert_same_shared_metrics, metric_records

pytestmark = pytest.mark.ray

ASYNC = ["runner.mode=async"]


def _cfg(app: EmbodiedApp, tmp_path: Path, *extra: str) -> Any:
    overrides = [*SAC_SMALL, "runner.max_epochs=4", f"runner.logger.log_path={tmp_path}", *extra]
    return app.load_config(APP_DIR / "config" / "pendulum_sac.yaml", overrides)


def _records(metrics_file: Path) -> dict[tuple[int, str], dict[str, float]]:
    return metric_records(metrics_file, "train/sac/num_updates")


def _assert_same_state(a: Path, b: Path) -> None:
    """Actor files (the replay buffer and its generator included) and the actor's torch generator."""
    assert_same_actor_state(a, b)
    rng = [pickle.loads((p / "actor" / "rng_rank0.pkl").read_bytes())["torch"] for p in (a, b)]
    assert bytes(rng[0].numpy().tobytes()) == bytes(rng[1].numpy().tobytes())


@pytest.fixture(scope="module")
def sync_run(app: EmbodiedApp, cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sync")
    assert run_app(app, _cfg(app, path), cluster=cluster).global_step == 4
    return path


@pytest.mark.slow  # the resume test below makes the same comparison at steps 2 and 4 (and every metric)
def test_staleness_zero_reproduces_the_synchronous_run_after_every_step(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, sync_run: Path
) -> None:
    """Same seeds, 4 steps (the first with random actions): the actor's state after every step (policy, critics,
    targets, temperature, optimizers, replay buffer, RNG) and every shared metric are bit-identical."""
    result = run_app(app, _cfg(app, tmp_path, *ASYNC, "algorithm.staleness_threshold=0"), cluster=cluster)
    assert result.global_step == 4
    for step in range(1, 5):
        name = f"global_step_{step}"
        _assert_same_state(sync_run / "checkpoints" / name, tmp_path / "checkpoints" / name)
    expected, got = _records(sync_run / "metrics.jsonl"), _records(tmp_path / "metrics.jsonl")
    assert expected.keys() == got.keys() and len(expected) == 9  # 4 train steps, 5 evaluations
    sac = ("env/num_episodes", "train/sac/critic_loss", "train/replay_buffer/size")
    assert_same_shared_metrics(expected, got, in_train=sac)
    train = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "staleness/max" in r]
    assert len(train) == 4 and all(r["staleness/max"] == 0 and r["staleness/frac_0"] == 1.0 for r in train)


def test_staleness_zero_with_a_resume_equals_the_synchronous_run(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, sync_run: Path
) -> None:
    """Staleness 0, checkpoints every 2 steps, 2 steps then a resume to 4: the actor's state at both checkpoints
    (replay buffer and RNG included) and every shared metric of the 4 steps and 5 evaluations are bit-identical
    to the synchronous run's. Batch 3 is produced before the evaluation of step 3 (it is not a checkpoint
    boundary), and the result is still the same."""
    common = [*ASYNC, "algorithm.staleness_threshold=0", "runner.save_interval=2"]
    assert run_app(app, _cfg(app, tmp_path, *common, "runner.max_epochs=2"), cluster=cluster).global_step == 2
    resumed = run_app(app, _cfg(app, tmp_path, *common, "runner.resume_dir=auto"), cluster=cluster)
    assert resumed.global_step == 4
    for step in (2, 4):
        name = f"global_step_{step}"
        _assert_same_state(sync_run / "checkpoints" / name, tmp_path / "checkpoints" / name)
    expected, got = _records(sync_run / "metrics.jsonl"), _records(tmp_path / "metrics.jsonl")
    assert expected.keys() == got.keys() and len(expected) == 9  # 4 train steps, 5 evaluations
    assert_same_shared_metrics(expected, got, in_train=("train/sac/critic_loss", "train/replay_buffer/size"))
    train = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "staleness/max" in r]
    assert len(train) == 4 and all(r["staleness/max"] == 0 and r["staleness/frac_0"] == 1.0 for r in train)


@pytest.mark.slow  # the bound and the warm-up schedule are also checked against fake groups (runners' tests)
def test_bound_one_with_warmup_and_a_resume(app: EmbodiedApp, cluster: Any, tmp_path: Path) -> None:
    """Bound 1, two warm-up batches, a checkpoint every 3 steps, 3 steps then a resume to 6: every transition
    lags the version whose step adds it by at most one, each step logs the histogram, the warm-up ends on time,
    and the resumed run goes on from the saved replay buffer."""
    common = [
        *ASYNC,
        "algorithm.staleness_threshold=1",
        "algorithm.random_warmup_steps=2",
        "runner.save_interval=3",
        "runner.val_check_interval=-1",
    ]
    assert run_app(app, _cfg(app, tmp_path, *common, "runner.max_epochs=3"), cluster=cluster).global_step == 3
    resumed = run_app(
        app, _cfg(app, tmp_path, *common, "runner.max_epochs=6", "runner.resume_dir=auto"), cluster=cluster
    )
    assert resumed.global_step == 6 and is_complete(resumed.last_checkpoint)  # type: ignore[arg-type]
    train = [r for r in read_metrics(resumed.metrics_file) if "train/sac/num_updates" in r]
    assert [r["step"] for r in train] == [1, 2, 3, 4, 5, 6]
    assert [r["rollout/random_actions"] for r in train] == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    assert [r["train/replay_buffer/size"] for r in train] == [16.0 * s for s in range(1, 7)]
    assert all(r["train/sac/num_updates"] == 4 and r["env/steps"] == 16 for r in train)
    for r in train:
        assert 0 <= r["staleness/min"] <= r["staleness/mean"] <= r["staleness/max"] <= 1
        fracs = [v for k, v in r.items() if k.startswith("staleness/frac_")]
        assert len(fracs) == 8 and sum(fracs) == pytest.approx(1.0)
    assert train[0]["staleness/max"] == 0  # batch 0 can only use the initial weights
    assert [r["staleness/published_version"] for r in train] == [1, 2, 3, 4, 5, 6]
