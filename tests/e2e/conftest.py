from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

APP_DIR = Path(__file__).resolve().parents[2] / "apps" / "embodied"


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, app: Any) -> Iterator[Any]:
    """A local Ray cluster for one test module: 2 CPUs and the module's ``CLUSTER_SLOTS`` simulated accelerator
    slots (4 when it sets none)."""
    from rlinf_scheduler import Cluster

    c = Cluster(
        num_nodes=1,
        simulated_accelerators_per_node=getattr(request.module, "CLUSTER_SLOTS", 4),
        ray_address="local",
        num_cpus=2,
        interrupt_main_on_failure=False,
    )
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture(scope="session")
def app() -> Any:
    """The embodied app over ``apps/embodied`` (its configs)."""
    from rlinf_runners.apps import EmbodiedApp

    return EmbodiedApp(APP_DIR)


# 2 training steps, an evaluation and a checkpoint after each, no progress bar, no logger backends.
_RUNNER = [
    "runner.max_epochs=2",
    "runner.val_check_interval=1",
    "runner.save_interval=1",
    "runner.stop_eval_return=null",
    "runner.progress_bar=false",
    "runner.step_timeout_s=120",
    "runner.logger.logger_backends=[]",
]

# A CartPole run small enough for a test: 4 envs x 8 steps, 2 training steps, tiny eval.
SMALL = [
    *_RUNNER,
    "env.train.total_num_envs=4",
    "env.train.max_steps_per_rollout_epoch=8",
    "env.eval.total_num_envs=4",
    "env.eval.max_steps_per_rollout_epoch=20",
    "env.eval.max_episode_steps=20",
    "actor.global_batch_size=32",
    "actor.micro_batch_size=16",
    "actor.model.hidden_sizes=[16]",
    "algorithm.update_epoch=2",
]


# A pendulum_sac run small enough for a test: 2 envs x 8 steps per training step, random actions in step 1,
# 4 gradient steps per training step.
SAC_SMALL = [
    *_RUNNER,
    "cluster.simulated_accelerators_per_node=4",
    "env.train.total_num_envs=2",
    "env.train.max_steps_per_rollout_epoch=8",
    "env.eval.total_num_envs=2",
    "env.eval.max_steps_per_rollout_epoch=20",
    "env.eval.max_episode_steps=20",
    "actor.global_batch_size=16",
    "actor.micro_batch_size=16",
    "actor.model.hidden_sizes=[16]",
    "algorithm.utd_ratio=0.25",
    "algorithm.random_warmup_steps=1",
    "algorithm.replay_buffer.min_buffer_size=8",
]


_ASYNC_ONLY = ("time/", "staleness/", "rollout/env_steps_per_s")
"""Metrics a synchronous and an asynchronous run differ in by design: wall-clock figures, the async bookkeeping."""


def metric_records(metrics_file: Path, train_key: str) -> dict[tuple[int, str], dict[str, float]]:
    """A run's records by ``(step, "train" | "eval")`` (train records hold ``train_key``), without ``_ASYNC_ONLY``."""
    from rlinf_core.metrics import read_metrics

    out: dict[tuple[int, str], dict[str, float]] = {}
    for r in read_metrics(metrics_file):
        kind = "train" if train_key in r else "eval"
        out[(int(r["step"]), kind)] = {k: v for k, v in r.items() if not k.startswith(_ASYNC_ONLY)}
    return out


def assert_same_shared_metrics(
    expected: dict[tuple[int, str], dict[str, float]],
    got: dict[tuple[int, str], dict[str, float]],
    *keys: tuple[int, str],
    in_train: tuple[str, ...] = (),
) -> None:
    """Every metric the two runs' records ``keys`` (default: all of ``expected``) both hold is equal.

    ``in_train``: metrics that each compared train record of both runs must hold.
    """
    for key in keys or expected:
        shared = expected[key].keys() & got[key].keys()
        if key[1] == "train":
            assert set(in_train) <= shared, key
        assert {k: expected[key][k] for k in shared} == {k: got[key][k] for k in shared}, key


def assert_same_actor_state(a: Path, b: Path) -> None:
    """Every ``actor/*.pt`` file (model, optimizer, trainer state) of two checkpoints is bit-identical.

    Except ``trainer.pt``'s ``total_steps``: the budget each run was started with (a half run plans half).
    """
    import torch

    names = sorted(p.name for p in (a / "actor").glob("*.pt"))
    assert names == sorted(p.name for p in (b / "actor").glob("*.pt")) and "model.pt" in names
    for name in names:
        x = _flatten(torch.load(a / "actor" / name, weights_only=True))
        y = _flatten(torch.load(b / "actor" / name, weights_only=True))
        assert x.keys() == y.keys(), name
        for key, vx in x.items():
            if name == "trainer.pt" and key == "total_steps/":
                continue
            same = torch.equal(vx, y[key]) if isinstance(vx, torch.Tensor) else vx == y[key]
            assert same, f"{name}:{key} differs"


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        return {k: v for key, item in obj.items() for k, v in _flatten(item, f"{prefix}{key}/").items()}
    if isinstance(obj, list | tuple):
        return {k: v for i, item in enumerate(obj) for k, v in _flatten(item, f"{prefix}{i}/").items()}
    return {prefix: obj}


def assert_profiled(
    result: Any, phases: dict[str, set[str]], world_sizes: dict[str, int], steps: list[int]
) -> None:
    """A ``runner.profile`` run's trace is valid and shows every worker with its phases.

    ``phases``: per group, span names some rank of it recorded (its own work, not only waits); every rank of
    ``world_sizes`` and the driver appear as processes with spans; each training step in ``steps`` logged
    ``profile/<group>/busy_frac`` for every group.
    """
    from rlinf_core.metrics import read_metrics
    from rlinf_scheduler import load_trace

    assert result.trace_file == result.log_path / "trace.json"
    events = load_trace(result.trace_file)
    labels = {e["pid"]: e["args"]["name"].split(" ")[0] for e in events if e["name"] == "process_name"}
    expected = {f"{g}:{r}" for g, n in world_sizes.items() for r in range(n)} | {"driver"}
    assert set(labels.values()) == expected
    names: dict[str, set[str]] = {label: set() for label in labels.values()}
    for e in events:
        if e["ph"] == "X":
            assert e["cat"] in ("compute", "wait")
            names[labels[e["pid"]]].add(e["name"])
    assert all(names.values()), {label: n for label, n in names.items() if not n}
    for group, wanted in phases.items():
        seen = set().union(*(n for label, n in names.items() if label.split(":")[0] == group))
        assert wanted <= seen, (group, wanted - seen)
    records = {r["step"]: r for r in read_metrics(result.metrics_file) if "profile/driver/busy_frac" in r}
    assert sorted(records) == steps
    for r in records.values():
        for group in [*world_sizes, "driver"]:
            assert 0.0 <= r[f"profile/{group}/busy_frac"] <= 1.0 + 1e-9, group
            assert r[f"profile/{group}/idle_s"] >= -1e-9
    assert set(result.busy) == {*world_sizes, "driver"}


def run_tiny_vla_ppo(
    app: Any,
    cluster: Any,
    tmp_path: Path,
    config: str,
    paths: dict[str, Path],
    *overrides: str,
    head: str = "model.action_out_proj.weight",
    trained_head: str | None = None,
    read_initial: Callable[[Path], dict[str, Any]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run PPO ``config`` (a tiny-VLA LIBERO run of 2 steps) on a tiny checkpoint's ``paths``, and check the run.

    Each update has one mini-batch, so the actor's log-probs of the rollout's chains must be the rollout's;
    both steps train, the evaluation rounds run and the last checkpoint is complete, with a trained action head.

    Args:
        head: an action-head tensor of the initial checkpoint (LeRobot's layout: the actor state's key too).
        trained_head: its key in the actor state, when it differs from ``head``.
        read_initial: the checkpoint directory's weights (default: its single ``model.safetensors``).

    Returns:
        The checkpoint's actor state and the initial weights, for the caller's further checks.
    """
    import torch
    from rlinf_core.checkpoint import is_complete
    from rlinf_core.metrics import read_metrics
    from rlinf_runners.apps import run_app
    from safetensors.torch import load_file

    cfg = app.load_config(
        APP_DIR / "config" / config,
        [
            *_RUNNER,
            "runner.val_check_interval=2",
            "runner.save_interval=2",
            f"runner.logger.log_path={tmp_path / 'run'}",
            *(f"actor.model.{k}={v}" for k, v in paths.items()),
            *overrides,
        ],
    )
    result = run_app(app, cfg, cluster=cluster)
    assert result.global_step == 2
    records = read_metrics(result.metrics_file)
    train = [r for r in records if "train/actor/total_loss" in r]
    assert [r["step"] for r in train] == [1, 2]
    for r in train:
        assert abs(r["train/actor/approx_kl"]) < 1e-6 and r["train/actor/clip_fraction"] == 0, r
        assert r["env/steps"] == 16  # 2 envs x 8 steps
    assert [r["step"] for r in records if "eval/num_episodes" in r] == [0, 2]
    assert result.last_checkpoint is not None and is_complete(result.last_checkpoint)
    trained = torch.load(result.last_checkpoint / "actor" / "model.pt", map_location="cpu", weights_only=True)
    model_dir = paths["model_path"]
    initial = read_initial(model_dir) if read_initial else load_file(str(model_dir / "model.safetensors"))
    now, before = trained[trained_head or head], initial[head]
    assert now.shape == before.shape and not torch.equal(now, before), head
    assert_pretrained_export(result.last_checkpoint, cfg.actor.model, trained)
    return trained, initial


def assert_pretrained_export(checkpoint: Path, model: Any, trained: dict[str, Any]) -> None:
    """``checkpoint``'s ``pretrained/`` export starts a new run from the saved actor's network.

    The policy that ``actor.model.model_path=<checkpoint>`` builds (as a new run's actor does) has the network
    (value head included; LoRA adapters merged) of ``model`` loaded with ``trained`` (``actor/model.pt``).
    """
    import attrs
    import torch
    from rlinf_models.policies import PRETRAINED_SUBDIR, build_policy
    from rlinf_models.vla import plain_state_dict
    from rlinf_models.vla.testing import libero_spec

    assert (checkpoint / PRETRAINED_SUBDIR / "config.json").is_file()
    spec = libero_spec()  # the weights do not depend on the image size or the instructions
    saved: Any = build_policy(spec, model)
    saved.load_state_dict(trained)
    again: Any = build_policy(spec, attrs.evolve(model, model_path=str(checkpoint)))
    want, got = plain_state_dict(saved.model), plain_state_dict(again.model)
    assert got.keys() == want.keys()
    for key, value in want.items():
        torch.testing.assert_close(got[key], value, atol=0, rtol=0, msg=key)
