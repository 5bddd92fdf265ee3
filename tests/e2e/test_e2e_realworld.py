"""Robots as node-group hardware: the dummy-Franka SAC config end to end, and a lost robot ending the run.

The env worker is placed on the ``franka`` node group's hardware unit and drives a dummy Franka server (its own
process, reached over 127.0.0.1) exactly as it would a real arm's robot server.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from rlinf_runners.apps import EmbodiedApp, run_app

from .conftest import _RUNNER, APP_DIR, assert_profiled

pytestmark = pytest.mark.ray

CONFIG = APP_DIR / "config" / "realworld_dummy_franka_sac_cnn.yaml"

# Two short training steps: 8 env steps each, one eval episode of 8 steps, a small CNN.
SMALL = [
    *_RUNNER,
    "env.train.max_steps_per_rollout_epoch=8",
    "env.eval.max_steps_per_rollout_epoch=8",
    "env.eval.max_episode_steps=8",
    "actor.global_batch_size=8",
    "actor.micro_batch_size=8",
    "actor.model.image_feature_dim=16",
    "actor.model.hidden_sizes=[16]",
    "algorithm.utd_ratio=0.25",
    "algorithm.random_warmup_steps=1",
    "algorithm.replay_buffer.min_buffer_size=8",
]


def _dummy_robot_pids() -> list[int]:
    """Processes running a dummy robot server on this machine."""
    out = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "rlinf_envs.realworld.dummy_robot" in text:
            out.append(int(cmdline.parent.name))
    return out


def test_dummy_franka_sac_trains_with_the_env_on_the_robot(app: EmbodiedApp, tmp_path: Path) -> None:
    from rlinf_scheduler import Cluster

    cfg = app.load_config(CONFIG, [*SMALL, f"runner.logger.log_path={tmp_path}", "runner.profile=true"])
    placements: list[Any] = []

    def on_step(step: int, _record: dict[str, float]) -> None:
        if not placements:  # called for the train and the eval record of a step
            placements.extend(g.placements for name, g in cluster.groups.items() if name.startswith("env"))

    with Cluster(cfg.cluster, ray_address="local", num_cpus=2, interrupt_main_on_failure=False) as cluster:
        result = run_app(app, cfg, cluster=cluster, on_step=on_step)
    ((placement,),) = placements
    assert result.global_step == 2
    assert (placement.resource_kind, placement.hardware_type, placement.node_group) == (
        "hardware",
        "Franka",
        "franka",
    )
    assert placement.hardware_configs == ({"node_rank": 0},)
    assert (result.log_path / "checkpoints" / "global_step_2" / "actor" / "model.pt").is_file()
    phases = {"env": {"env_step"}, "rollout": {"inference"}, "actor": {"actor/run_training"}}
    sizes = app.world_sizes(cfg)
    assert sizes is not None
    assert_profiled(result, phases, sizes, [1, 2])
    assert not _dummy_robot_pids(), "the dummy robot servers outlived the run"


def test_lost_robot_ends_the_run_naming_it(app: EmbodiedApp, tmp_path: Path) -> None:
    """The robot server dies (the arm's controller crashed): the next command fails, the run ends in < 10 s."""
    from rlinf_scheduler import Cluster, WorkerFailedError

    cfg = app.load_config(
        CONFIG,
        [
            *SMALL,
            f"runner.logger.log_path={tmp_path}",
            "runner.max_epochs=50",
            "runner.val_check_interval=-1",
        ],
    )
    killed_at: list[float] = []

    def on_step(step: int, _record: dict[str, float]) -> None:
        if step == 2 and not killed_at:
            pids = _dummy_robot_pids()
            assert len(pids) == 1, pids
            os.kill(pids[0], signal.SIGKILL)
            killed_at.append(time.monotonic())

    with Cluster(cfg.cluster, ray_address="local", num_cpus=2, interrupt_main_on_failure=False) as cluster:
        with pytest.raises(WorkerFailedError) as err:
            run_app(app, cfg, cluster=cluster, on_step=on_step)
        elapsed = time.monotonic() - killed_at[0]
    message = str(err.value)
    print(f"the run ended {elapsed:.2f} s after the robot server died")
    assert elapsed < 10.0, f"the run took {elapsed:.1f} s to end after the robot died"
    assert "Franka unit 0" in message and "node group 'franka'" in message, message
    assert "RobotUnreachable" in message, message


@pytest.mark.multinode
@pytest.mark.slow
def test_killed_robot_node_ends_the_run_naming_the_robot(app: EmbodiedApp, tmp_path: Path) -> None:
    """Two Ray nodes: the actor and rollout on node 0, the env worker and its robot on node 1 (the robot's
    node group). Removing node 1 (the robot's computer lost) ends the run in < 10 s, naming the robot."""
    import ray
    from ray.cluster_utils import Cluster as RayTestCluster
    from rlinf_scheduler import Cluster, WorkerFailedError

    overrides = [
        *SMALL,
        f"runner.logger.log_path={tmp_path}",
        "runner.max_epochs=50",
        "runner.val_check_interval=-1",
        "cluster.num_nodes=2",
        "cluster.node_groups=[{label: franka, node_ranks: [1], hardware: {type: Franka, configs: [{node_rank: 1}]}}]",
    ]
    cfg = app.load_config(CONFIG, overrides)
    nodes = RayTestCluster(
        initialize_head=True,
        head_node_args={"num_cpus": 2, "include_dashboard": False, "env_vars": {"RLINF_NODE_RANK": "0"}},
    )
    try:
        robot_node = nodes.add_node(num_cpus=1, env_vars={"RLINF_NODE_RANK": "1"})
        killed_at: list[float] = []

        def on_step(step: int, _record: dict[str, float]) -> None:
            if step == 2 and not killed_at:
                killed_at.append(time.monotonic())
                nodes.remove_node(robot_node)

        ray.init(address=nodes.address, log_to_driver=False)
        try:
            with Cluster(cfg.cluster, interrupt_main_on_failure=False) as cluster:
                with pytest.raises(WorkerFailedError) as err:
                    run_app(app, cfg, cluster=cluster, on_step=on_step)
                elapsed = time.monotonic() - killed_at[0]
        finally:
            ray.shutdown()
    finally:
        nodes.shutdown()
    message = str(err.value)
    print(f"the run ended {elapsed:.2f} s after the robot's node was removed:\n{message[:400]}")
    assert elapsed < 10.0, f"the run took {elapsed:.1f} s to end after the robot's node was lost"
    assert "Franka unit 0" in message and "on node 1, node group 'franka'" in message, message
