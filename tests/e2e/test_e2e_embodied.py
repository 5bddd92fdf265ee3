"""End to end: the embodied app through real worker groups, in every placement mode, and resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rlinf_core.checkpoint import is_complete
from rlinf_core.config import ConfigError
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import APP_DIR, SMALL, assert_profiled, assert_same_actor_state

pytestmark = pytest.mark.ray


PLACEMENTS = {
    "collocated": (['cluster.component_placement={"actor,env,rollout": 0}'], 1),
    "disaggregated": (["cluster.component_placement={actor: 0, rollout: 1, env: 2}"], 1),
    # Two actor ranks (FSDP2 on gloo) overlapping env and rollout, which run on disjoint slots; 2 stages.
    "hybrid": (
        ["cluster.component_placement={actor: 0-1, env: 2, rollout: 3}", "rollout.pipeline_stage_num=2"],
        2,
    ),
}


def _cfg(app: EmbodiedApp, tmp_path: Path, *extra: str) -> Any:
    overrides = [
        *SMALL,
        "cluster.simulated_accelerators_per_node=4",
        f"runner.logger.log_path={tmp_path}",
        *extra,
    ]
    return app.load_config(APP_DIR / "config" / "cartpole_ppo.yaml", overrides)


@pytest.mark.parametrize("mode", list(PLACEMENTS))
def test_placement_modes_train_evaluate_and_checkpoint(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, mode: str
) -> None:
    extra, actor_ranks = PLACEMENTS[mode]
    cfg = _cfg(app, tmp_path, *extra, "runner.profile=true")
    assert app.world_sizes(cfg)["actor"] == actor_ranks
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    phases = {
        "env": {"env_step", "wait_rollout"},
        "rollout": {"inference", "wait_env", "sync_weights"},
        "actor": {"actor/run_training", "actor/compute_advantages"},
        "driver": {"train_step 1", "train_step 2", "evaluate", "sync_weights"},
    }
    sizes = app.world_sizes(cfg)
    assert sizes is not None
    assert_profiled(result, phases, sizes, [1, 2])
    records = read_metrics(result.metrics_file)
    train = [r for r in records if "train/actor/total_loss" in r]
    evals = [r for r in records if "eval/return_mean" in r]
    assert [r["step"] for r in train] == [1, 2]
    assert [r["step"] for r in evals] == [0, 1, 2]  # before each step, and after the last
    assert all(r["env/steps"] == 32 for r in train)  # 4 envs x 8 steps
    assert all(0 < r["eval/return_mean"] <= 20 and r["eval/num_episodes"] == 4 for r in evals)
    assert all(r["time/wall_s"] > 0 for r in records)
    ckpts = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert ckpts == ["global_step_1", "global_step_2"]
    assert result.last_checkpoint == tmp_path / "checkpoints" / "global_step_2"
    assert is_complete(result.last_checkpoint)


def test_resume_continues_at_the_next_step(app: EmbodiedApp, cluster: Any, tmp_path: Path) -> None:
    first = run_app(app, _cfg(app, tmp_path, "runner.val_check_interval=-1"), cluster=cluster)
    assert first.global_step == 2
    lrs = {int(r["step"]): r["train/actor/lr"] for r in read_metrics(first.metrics_file)}
    # Same run, longer: `auto` picks global_step_2 and training continues with step 3.
    cfg = _cfg(
        app,
        tmp_path,
        "runner.val_check_interval=-1",
        "runner.max_epochs=3",
        "runner.resume_dir=auto",
        "actor.optim.reset_lr_schedule_on_resume=true",  # a longer run: rebuild the schedule over 3 steps
    )
    second = run_app(app, cfg, cluster=cluster)
    assert second.global_step == 3
    records = read_metrics(second.metrics_file)
    assert [int(r["step"]) for r in records] == [1, 2, 3]  # appended to the same metrics.jsonl
    assert is_complete(tmp_path / "checkpoints" / "global_step_3")
    # The optimizer state came back: the rebuilt linear schedule continues from step 2 of 3, not from scratch.
    assert lrs[1] == pytest.approx(1e-3) and records[-1]["train/actor/lr"] == pytest.approx(1e-3 / 3)
    # Each checkpoint holds its run's config; a resume with another model shape is refused before Ray starts.
    meta = json.loads((tmp_path / "checkpoints" / "global_step_3" / "meta.json").read_text())
    assert meta["config"]["actor"]["model"]["hidden_sizes"] == list(
        _cfg(app, tmp_path).actor.model.hidden_sizes
    )
    with pytest.raises(ConfigError, match=r"actor\.model: the checkpoint .* was saved with"):
        _cfg(app, tmp_path, "runner.resume_dir=auto", "actor.model.hidden_sizes=[7]")
    # A checkpoint saved before a field existed (absent from its config) still fits while the field keeps its
    # default; set to something else, the field makes it incompatible.
    del meta["config"]["actor"]["model"]["noise_level"]
    (tmp_path / "checkpoints" / "global_step_3" / "meta.json").write_text(json.dumps(meta))
    _cfg(app, tmp_path, "runner.resume_dir=auto")
    with pytest.raises(ConfigError, match=r"'noise_level': 0\.9"):
        _cfg(app, tmp_path, "runner.resume_dir=auto", "actor.model.noise_level=0.9")
    # Standalone evaluation of a checkpoint.
    metrics = run_app(app, _cfg(app, tmp_path, "runner.max_epochs=3"), cluster=cluster, evaluate_only="auto")
    assert metrics["eval/checkpoint_step"] == 3 and metrics["eval/num_episodes"] == 4


# ------------------------------------------------------------------------------------------- exact resume

_EXACT = ["runner.val_check_interval=1", "runner.save_interval=1", "runner.max_epochs=4"]


def _metrics_by_step(metrics_file: Path, steps: range) -> dict[tuple[int, str], dict[str, float]]:
    """The last record of each kind (train / eval) at each step, without wall-clock figures."""
    out: dict[tuple[int, str], dict[str, float]] = {}
    for r in read_metrics(metrics_file):
        if int(r["step"]) in steps:
            kind = "train" if "train/actor/total_loss" in r else "eval"
            out[(int(r["step"]), kind)] = {
                k: v for k, v in r.items() if not k.startswith("time/") and k != "rollout/env_steps_per_s"
            }
    return out


@pytest.fixture(scope="module")
def straight(app: EmbodiedApp, cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Uninterrupted 4-step runs, constant and linear learning rate (the references of the resume tests)."""
    out = {}
    for schedule in ("constant", "linear"):
        path = tmp_path_factory.mktemp(f"straight-{schedule}")
        result = run_app(
            app, _cfg(app, path, *_EXACT, f"actor.optim.lr_schedule={schedule}"), cluster=cluster
        )
        assert result.global_step == 4
        out[schedule] = path
    return out


def test_half_run_plus_resume_is_bit_identical_to_a_straight_run(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, straight: dict[str, Path]
) -> None:
    """2 steps, then a resume to 4 (constant LR): model, optimizer, trainer counters and the metrics of
    steps 3-4 equal those of 4 uninterrupted steps bit for bit (env episodes and sampled actions included)."""
    common = [*_EXACT, "actor.optim.lr_schedule=constant"]
    first = run_app(app, _cfg(app, tmp_path, *common, "runner.max_epochs=2"), cluster=cluster)
    assert first.global_step == 2
    second = run_app(app, _cfg(app, tmp_path, *common, "runner.resume_dir=auto"), cluster=cluster)
    assert second.global_step == 4
    ref = straight["constant"]
    for step in (2, 4):
        assert_same_actor_state(
            ref / "checkpoints" / f"global_step_{step}", tmp_path / "checkpoints" / f"global_step_{step}"
        )
    expected = _metrics_by_step(ref / "metrics.jsonl", range(3, 5))
    assert set(expected) == {(3, "train"), (4, "train"), (3, "eval"), (4, "eval")}
    assert _metrics_by_step(tmp_path / "metrics.jsonl", range(3, 5)) == expected


@pytest.mark.parametrize("reset", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_resume_with_another_budget_keeps_the_schedule_it_started_with(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, straight: dict[str, Path], reset: bool
) -> None:
    """Step 2 of a linear-LR run planned for 4 steps, resumed with max_epochs=3: step 3 has the 4-step schedule's
    learning rate, or the 3-step one's with actor.optim.reset_lr_schedule_on_resume.

    ``reset`` True is slow: in the default suite test_resume_continues_at_the_next_step resumes a linear-LR run
    with another budget and the reset through the same actor-worker path, and
    packages/rlinf-models/tests/test_models_schedule.py checks ``resumed_schedule_total`` both ways."""
    import shutil

    src = straight["linear"] / "checkpoints" / "global_step_2"
    shutil.copytree(src, tmp_path / "checkpoints" / "global_step_2")
    extra = [*_EXACT, "actor.optim.lr_schedule=linear", "runner.val_check_interval=-1", "runner.max_epochs=3"]
    if reset:
        extra.append("actor.optim.reset_lr_schedule_on_resume=true")
    result = run_app(app, _cfg(app, tmp_path, *extra, "runner.resume_dir=auto"), cluster=cluster)
    assert result.global_step == 3
    (record,) = [r for r in read_metrics(tmp_path / "metrics.jsonl") if "train/actor/lr" in r]
    assert record["step"] == 3
    assert record["train/actor/lr"] == pytest.approx(1e-3 * (1 - 2 / 3) if reset else 1e-3 * (1 - 2 / 4))


def test_resume_after_the_driver_is_sigkilled_is_bit_identical(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, straight: dict[str, Path]
) -> None:
    """train.py (linear LR, 4 steps) SIGKILLed once global_step_2 is committed, then resumed with
    runner.resume_dir=auto: the final model, optimizer and the metrics of steps 3-4 equal the straight run's."""
    import contextlib
    import os
    import signal
    import subprocess
    import sys
    import time

    from rlinf_core.checkpoint import find_latest_checkpoint

    from .test_e2e_embodied_failures import _descendants

    overrides = [
        *SMALL,
        "cluster.simulated_accelerators_per_node=4",
        f"runner.logger.log_path={tmp_path}",
        *_EXACT,
        "actor.optim.lr_schedule=linear",
    ]
    cmd = [sys.executable, str(APP_DIR / "train.py"), *overrides, "cluster.ray_address=local"]
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    started: list[int] = []
    try:
        deadline = time.monotonic() + 240
        while (latest := find_latest_checkpoint(tmp_path)) is None or latest.name == "global_step_1":
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "no global_step_2 within 240 s"
            time.sleep(0.05)
        started = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        time.sleep(2.0)  # Ray's processes share the driver's fate; end any that outlived it
        for pid in started:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    assert find_latest_checkpoint(tmp_path) is not None
    result = run_app(
        app,
        _cfg(app, tmp_path, *_EXACT, "actor.optim.lr_schedule=linear", "runner.resume_dir=auto"),
        cluster=cluster,
    )
    assert result.global_step == 4
    ref = straight["linear"]
    assert_same_actor_state(ref / "checkpoints" / "global_step_4", tmp_path / "checkpoints" / "global_step_4")
    assert _metrics_by_step(tmp_path / "metrics.jsonl", range(3, 5)) == _metrics_by_step(
        ref / "metrics.jsonl", range(3, 5)
    )


# ------------------------------------------------------------------------------------------- flow policy


FLOW_PLACEMENTS = {
    # Two rollout ranks answer each env rank: their replies' chains are concatenated.
    "flow_sde": "cluster.component_placement={actor: 0, rollout: 1-2, env: 3}",
    # Two actor ranks (FSDP2): the velocity network runs once per denoising step inside one training forward.
    "flow_noise": "cluster.component_placement={actor: 0-1, rollout: 2, env: 3}",
}


@pytest.mark.parametrize("method", ["flow_sde", pytest.param("flow_noise", marks=pytest.mark.slow)])
def test_flow_policy_trains_with_its_denoising_chains(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, method: str
) -> None:
    """Pendulum with the flow policy and 2 pipeline stages: the chains of every reply reach the actor (its
    log-probs need them; without them the update raises) and the update starts on-policy."""
    overrides = [
        *SMALL,
        "cluster.simulated_accelerators_per_node=4",
        f"runner.logger.log_path={tmp_path}",
        "runner.save_interval=-1",
        FLOW_PLACEMENTS[method],
        "rollout.pipeline_stage_num=2",
        "actor.model.model_type=flow",
        "actor.model.num_action_chunks=2",
        f"actor.model.noise_method={method}",
        "algorithm.update_epoch=1",
        "actor.global_batch_size=16",
        "actor.micro_batch_size=8",
    ]
    cfg = app.load_config(APP_DIR / "config" / "pendulum_ppo.yaml", overrides)
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    train = [r for r in read_metrics(result.metrics_file) if "train/actor/total_loss" in r]
    assert len(train) == 2
    # One mini-batch per update: it is on-policy, so the log-probs the actor recomputes from the chains must
    # equal the rollout's (ratio 1, nothing clipped).
    for r in train:
        assert abs(r["train/actor/approx_kl"]) < 1e-5 and r["train/actor/clip_fraction"] == 0, r
