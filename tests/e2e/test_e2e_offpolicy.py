"""End to end: off-policy SAC (``pendulum_sac``) through real worker groups, placements, and exact resume."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from rlinf_core.checkpoint import is_complete
from rlinf_core.metrics import read_metrics
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import APP_DIR, SAC_SMALL, assert_profiled, assert_same_actor_state

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def cluster(app: EmbodiedApp) -> Iterator[Any]:
    from rlinf_scheduler import Cluster

    c = Cluster(
        num_nodes=1,
        simulated_accelerators_per_node=4,
        ray_address="local",
        num_cpus=2,
        interrupt_main_on_failure=False,
    )
    try:
        yield c
    finally:
        c.shutdown()


def _cfg(app: EmbodiedApp, tmp_path: Path, *extra: str) -> Any:
    overrides = [*SAC_SMALL, f"runner.logger.log_path={tmp_path}", *extra]
    return app.load_config(APP_DIR / "config" / "pendulum_sac.yaml", overrides)


def _buffer(checkpoint: Path) -> dict[str, Any]:
    import torch

    state: dict[str, Any] = torch.load(checkpoint / "actor" / "trainer.pt", weights_only=True)["buffer"]
    return state


@pytest.mark.parametrize(
    "placement",
    ['{"actor,env,rollout": 0}', "{actor: 0, rollout: 1, env: 2}"],
    ids=["collocated", "disaggregated"],
)
def test_pendulum_sac_trains_evaluates_and_checkpoints(
    app: EmbodiedApp, cluster: Any, tmp_path: Path, placement: str
) -> None:
    cfg = _cfg(
        app,
        tmp_path,
        f"cluster.component_placement={placement}",
        "runner.max_epochs=3",
        "runner.profile=true",
    )
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 3
    phases = {"env": {"env_step"}, "rollout": {"inference"}, "actor": {"actor/run_training"}}
    sizes = app.world_sizes(cfg)
    assert sizes is not None
    assert_profiled(result, phases, sizes, [1, 2, 3])
    records = read_metrics(result.metrics_file)
    train = [r for r in records if "train/replay_buffer/size" in r]
    evals = [r for r in records if "eval/return_mean" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert [r["rollout/random_actions"] for r in train] == [1.0, 0.0, 0.0]
    assert [r["train/replay_buffer/size"] for r in train] == [16.0, 32.0, 48.0]
    assert [r["train/sac/num_updates"] for r in train] == [4.0, 4.0, 4.0]
    assert all(r["env/steps"] == 16 for r in train)
    assert all(r["train/sac/critic_loss"] >= 0 and r["train/sac/alpha"] > 0 for r in train)
    assert [r["step"] for r in evals] == [0, 1, 2, 3]
    assert all(r["eval/num_episodes"] == 2 and r["eval/return_mean"] < 0 for r in evals)
    assert is_complete(tmp_path / "checkpoints" / "global_step_3")
    # Transitions: the env steps each env 8 times per training step (no episode ends within 24 steps), so a
    # transition's next_obs is the obs of the same env one step later (time-major: 2 envs per step).
    buf = _buffer(tmp_path / "checkpoints" / "global_step_3")["contents"]
    assert (
        buf["obs"].shape == (48, 3) and buf["actions"].shape == (48, 1, 1) and buf["rewards"].shape == (48, 1)
    )
    assert (buf["next_obs"][:-2] == buf["obs"][2:]).all()
    assert not buf["terminations"].any()
    assert (buf["actions"].abs() <= 2.0).all()


_EXACT = ["runner.max_epochs=4"]


def _torch_rng(checkpoint: Path) -> bytes:
    """The actor's torch generator state (python's ``random`` is also drawn on by Ray inside the process)."""
    state = pickle.loads((checkpoint / "actor" / "rng_rank0.pkl").read_bytes())
    return bytes(state["torch"].numpy().tobytes())


@pytest.mark.filterwarnings("error:resuming")  # no learning-rate schedule: no warning about a new budget
def test_half_run_plus_resume_is_bit_identical_to_a_straight_run(
    app: EmbodiedApp, cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """2 steps, then a resume to 4: policy, critics, target critics, temperature, optimizers, the replay buffer
    (contents and generator), the RNGs and the metrics of steps 3-4 equal those of 4 uninterrupted steps."""
    ref = tmp_path_factory.mktemp("straight")
    assert run_app(app, _cfg(app, ref, *_EXACT), cluster=cluster).global_step == 4
    half = tmp_path_factory.mktemp("half")
    assert run_app(app, _cfg(app, half, "runner.max_epochs=2"), cluster=cluster).global_step == 2
    assert run_app(app, _cfg(app, half, *_EXACT, "runner.resume_dir=auto"), cluster=cluster).global_step == 4
    for step in (2, 4):
        a, b = ref / "checkpoints" / f"global_step_{step}", half / "checkpoints" / f"global_step_{step}"
        assert_same_actor_state(a, b)
        assert _torch_rng(a) == _torch_rng(b)  # the next reparameterised samples too
    names = {p.name for p in (ref / "checkpoints" / "global_step_4" / "actor").iterdir()}
    assert {"model.pt", "critic.pt", "optimizer.pt", "trainer.pt"} <= names
    assert len(_buffer(ref / "checkpoints" / "global_step_4")["contents"]["obs"]) == 64

    def by_step(path: Path) -> dict[tuple[int, bool], dict[str, float]]:
        out = {}
        for r in read_metrics(path / "metrics.jsonl"):
            if int(r["step"]) in (3, 4):
                clean = {
                    k: v for k, v in r.items() if not k.startswith("time/") and k != "rollout/env_steps_per_s"
                }
                out[(int(r["step"]), "eval/return_mean" in r)] = clean
        return out

    expected = by_step(ref)
    assert len(expected) == 4
    assert by_step(half) == expected
