"""Cluster on one local Ray node: attach, probe, simulated accelerators, node groups, node ordering rules."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import pytest
import ray
from rlinf_scheduler import (
    Cluster,
    ClusterConfig,
    ClusterView,
    NodeGroupConfig,
    NodePlacementStrategy,
    PackedPlacementStrategy,
    SchedulerTimeoutError,
    Worker,
)
from rlinf_scheduler._cluster import _order_nodes

cloudpickle.register_pickle_by_value(sys.modules[__name__])

HEAD = {"node:__internal_head__": 1.0}


def _alive(*heads: bool) -> list[dict[str, Any]]:
    return [
        {"NodeID": f"n{i}", "Resources": HEAD if h else {}, "NodeManagerPort": i} for i, h in enumerate(heads)
    ]


def _probes(ips: list[str], ranks: list[str | None]) -> list[dict[str, Any]]:
    return [{"ip": ip, "node_rank": r} for ip, r in zip(ips, ranks, strict=True)]


# ------------------------------------------------------------------------------- node ordering (pure, no Ray)


def test_order_without_node_ranks_is_head_first_then_by_ip() -> None:
    alive = _alive(False, False, True, False)
    probes = _probes(["10.0.0.10", "10.0.0.9", "10.0.0.200", "10.0.0.11"], [None] * 4)
    assert _order_nodes(alive, probes) == [2, 1, 0, 3]


def test_order_by_node_rank_env() -> None:
    alive = _alive(True, False, False)
    probes = _probes(["10.0.0.1", "10.0.0.2", "10.0.0.3"], ["2", "0", " 1 "])
    assert _order_nodes(alive, probes) == [1, 2, 0]


@pytest.mark.parametrize(
    ("ranks", "message"),
    [
        (["0", None, "1"], r"RLINF_NODE_RANK is set on 2 of 3 nodes"),
        (["0", "0", "1"], r"unique and cover 0\.\.2 .* got \[0, 0, 1\]"),
        (["0", "1", "3"], r"unique and cover 0\.\.2 .* got \[0, 1, 3\]"),
        (["0", "one", "2"], r"must be an integer, got 'one'"),
    ],
)
def test_bad_node_ranks_are_clear_errors(ranks: list[str | None], message: str) -> None:
    alive = _alive(True, False, False)
    probes = _probes(["10.0.0.1", "10.0.0.2", "10.0.0.3"], ranks)
    with pytest.raises(ValueError, match=message):
        _order_nodes(alive, probes)


def test_config_type_is_checked() -> None:
    with pytest.raises(TypeError, match="config: expected a ClusterConfig"):
        Cluster({"num_nodes": 1})  # type: ignore[arg-type]


# ------------------------------------------------------------------------------------------ with a Ray node


@pytest.fixture(scope="module")
def ray_instance() -> Iterator[None]:
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


class EnvReporter(Worker):
    def env(self, *names: str) -> dict[str, str | None]:
        return {n: os.environ.get(n) for n in names}

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()


@pytest.mark.ray
def test_cluster_probes_its_node_and_simulates_accelerators(ray_instance: None) -> None:
    config = ClusterConfig(num_nodes=1, simulated_accelerators_per_node=2)
    with Cluster(config, simulated_accelerators_per_node=3) as cluster:
        assert isinstance(cluster, ClusterView)
        assert cluster.num_nodes == 1 and cluster.num_accelerators == 3
        assert cluster.accelerator_type == "cpu" and cluster.accelerators_per_node(0) == 3
        node = cluster.node(0)
        assert node.rank == 0 and node.is_head
        assert node.ip == ray.util.get_node_ip_address()
        assert node.num_cpus == 2 and node.num_accelerators == 3 and node.accelerator_model == "simulated"
        assert Path(node.python_interpreter).name.startswith("python")
        assert node.python_version == ".".join(str(v) for v in sys.version_info[:3])
        assert cluster.namespace.startswith("rlinf-")
        with pytest.raises(IndexError, match=r"node rank 1 out of range: the cluster has nodes 0\.\.0"):
            cluster.node(1)
        group = EnvReporter.create_group().launch(cluster, PackedPlacementStrategy(0, 2), name="acc")
        assert [
            e["RLINF_VISIBLE_ACCELERATORS"] for e in group.env("RLINF_VISIBLE_ACCELERATORS").wait(60)
        ] == [
            "0",
            "1",
            "2",
        ]
        assert set(group.node_id().wait(timeout=30)) == {node.node_id}
    # The cluster attached to this process's Ray connection, so it leaves Ray running.
    assert ray.is_initialized()


@pytest.mark.ray
def test_without_accelerators_the_nodes_are_the_resources(ray_instance: None) -> None:
    with Cluster(num_nodes=1, namespace="rlinf-test-explicit-ns") as cluster:
        assert cluster.namespace == "rlinf-test-explicit-ns"
        assert cluster.num_accelerators == 0 and cluster.accelerator_type == ""
        group = EnvReporter.create_group().launch(cluster, NodePlacementStrategy([0, 0]))
        assert group.name == "EnvReporter"
        envs = group.env("LOCAL_RANK", "LOCAL_WORLD_SIZE").wait(timeout=60)
        assert envs == [
            {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"},
            {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
        ]
        assert ray.get_actor("EnvReporter:1", namespace="rlinf-test-explicit-ns") is not None


@pytest.mark.ray
def test_waiting_for_missing_nodes_times_out_with_the_count(ray_instance: None) -> None:
    with pytest.raises(SchedulerTimeoutError, match=r"for 3 Ray node\(s\) \(num_nodes=3\) but found 1 alive"):
        Cluster(num_nodes=3, node_wait_timeout_s=0.5)


@pytest.mark.ray
def test_node_group_env_vars_and_interpreter_reach_workers(ray_instance: None, tmp_path: Path) -> None:
    wrapper = tmp_path / "python-wrapper.sh"
    wrapper.write_text(f'#!/bin/sh\nexport RLINF_TEST_WRAPPED=yes\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    config = ClusterConfig(
        num_nodes=1,
        node_groups=[
            NodeGroupConfig(
                label="special",
                node_ranks=[0],
                env_vars={"RLINF_TEST_GROUP_VAR": "from-group", "PATH": f"{tmp_path}/bin"},
                python_interpreter_path=str(wrapper),
            )
        ],
    )
    names = ("RLINF_TEST_GROUP_VAR", "RLINF_TEST_WRAPPED", "RANK")
    with Cluster(config) as cluster:
        grouped = EnvReporter.create_group().launch(cluster, NodePlacementStrategy([0], node_group="special"))
        assert grouped.env(*names).wait(timeout=120) == [
            {"RLINF_TEST_GROUP_VAR": "from-group", "RLINF_TEST_WRAPPED": "yes", "RANK": "0"}
        ]
        # A path-like variable is put in front of the worker's own value (RLinf's default), not replacing it.
        (got,) = grouped.env("PATH").wait(timeout=60)
        inherited = cluster.node(0).inherited_path_env["PATH"]
        entries = [f"{tmp_path}/bin", *inherited.split(os.pathsep)]  # each entry once, as in RLinf
        assert inherited and got["PATH"] == os.pathsep.join(dict.fromkeys(entries))
        # Placed through the reserved "cluster" group, a worker gets what every group sets on its node.
        plain = EnvReporter.create_group().launch(cluster, NodePlacementStrategy([0]), name="plain")
        assert plain.env(*names).wait(timeout=120) == [
            {"RLINF_TEST_GROUP_VAR": "from-group", "RLINF_TEST_WRAPPED": "yes", "RANK": "0"}
        ]


_ATTACH_SCRIPT = """
import ray
from rlinf_scheduler import Cluster
with Cluster(num_nodes=1, num_cpus=1) as cluster:
    print("GCS", ray.get_runtime_context().gcs_address, cluster.num_nodes)
print("CONNECTED AFTER SHUTDOWN", ray.is_initialized())
"""


def _run_driver(env_updates: dict[str, str]) -> str:
    env = dict(os.environ, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0", **env_updates)
    proc = subprocess.run(
        [sys.executable, "-c", _ATTACH_SCRIPT],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    # The cluster made the connection, so its shutdown closes it.
    assert "CONNECTED AFTER SHUTDOWN False" in proc.stdout
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("GCS ")]
    return line


@pytest.mark.ray
def test_default_address_attaches_through_ray_address(ray_instance: None) -> None:
    ours = ray.get_runtime_context().gcs_address
    assert _run_driver({"RAY_ADDRESS": ours}) == f"GCS {ours} 1"


@pytest.mark.ray
def test_default_address_never_attaches_to_another_private_instance(ray_instance: None) -> None:
    # This process runs a private `ray.init(address="local")` instance; a driver with no address must not
    # pick it up (Ray's "auto" would) but use a `ray start` cluster or start its own.
    ours = ray.get_runtime_context().gcs_address
    line = _run_driver({"RAY_ADDRESS": ""})
    # Attaching to a `ray start`-style cluster is allowed (another test module may run one, e.g. a
    # ray.cluster_utils.Cluster under xdist); attaching to this private instance is not.
    assert line.startswith("GCS ") and ours not in line


@pytest.mark.ray
def test_a_cluster_that_starts_ray_probes_its_own_node_locally_with_the_same_result() -> None:
    # The node the driver starts runs workers with the driver's interpreter and environment, so the cluster
    # probes it in-process instead of waiting for a worker to boot; the answer must equal a remote probe's.
    code = (
        "import os, ray\n"
        "os.environ['RLINF_PATH_ENV_MERGE_MODE'] = 'prepend'\n"
        "from rlinf_scheduler import Cluster\n"
        "from rlinf_scheduler._cluster import _probe_node_remote, _started_local_node\n"
        "assert not _started_local_node()\n"
        "with Cluster(num_nodes=1, ray_address='local', num_cpus=1) as c:\n"
        "    assert c._started_node and _started_local_node()\n"
        "    remote = ray.get(_probe_node_remote.remote(), timeout=60)\n"
        "    node = c.node(0)\n"
        "    assert (node.ip, node.python_interpreter, node.python_version) == (\n"
        "        remote['ip'], remote['python'], remote['python_version']), (node, remote)\n"
        "    assert dict(node.inherited_path_env) == remote['path_env'], (node, remote)\n"
        "print('ok')\n"
    )
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=180, env=env)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-3000:]


# ------------------------------------------------------------------------------- worker priority (Ray's niceness)


class _RecordedInit:
    """Stands in for ``ray.init``: records each call's keywords; raises like Ray when a cluster is running."""

    def __init__(self, running: bool) -> None:
        self.running = running
        self.calls: list[dict[str, Any]] = []

    def __call__(self, **kwargs: Any) -> None:
        self.calls.append(kwargs)
        if self.running and kwargs.get("address") is None and kwargs.get("_system_config"):
            raise ValueError("When connecting to an existing cluster, _system_config must not be provided.")


def _connect_with(
    monkeypatch: pytest.MonkeyPatch, address: str | None, running: bool
) -> list[dict[str, Any]]:
    init = _RecordedInit(running)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    cluster = Cluster.__new__(Cluster)  # only _connect's inputs: no Ray needed
    cluster._config = ClusterConfig(ray_address=address)
    cluster._namespace = "rlinf-test"
    assert cluster._connect(2)
    return init.calls


@pytest.mark.parametrize("address", ["local", None])
def test_a_started_ray_runs_its_workers_at_the_drivers_priority(
    monkeypatch: pytest.MonkeyPatch, address: str | None
) -> None:
    (call,) = _connect_with(monkeypatch, address, running=False)
    # Ray adds worker_niceness to the workers' nice value (its default, 15, puts them below every other process).
    assert call["_system_config"] == {"worker_niceness": 0}
    assert call["num_cpus"] == 2 and call["include_dashboard"] is False


def test_attaching_to_a_running_ray_passes_no_start_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = _connect_with(monkeypatch, None, running=True)
    assert "_system_config" in first
    assert not {"_system_config", "num_cpus", "include_dashboard"} & set(second)
    (call,) = _connect_with(monkeypatch, "ray://head:10001", running=True)
    assert not {"_system_config", "num_cpus"} & set(call)


_PRIORITY_SCRIPT = """
import os
import threading
from rlinf_scheduler import Cluster, NodePlacementStrategy, Worker
from rlinf_scheduler._malloc import malloc_arena_count

class Priority(Worker):
    def nice(self) -> int:
        return os.getpriority(os.PRIO_PROCESS, 0)  # this thread's, the one running the worker's calls

    def arenas_around_threads(self, threads):
        def allocate():
            for _ in range(200):
                _ = [bytearray(4096) for _ in range(64)]

        before = malloc_arena_count()
        pool = [threading.Thread(target=allocate) for _ in range(threads)]
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        return before, malloc_arena_count()

with Cluster(num_nodes=1, ray_address="local", num_cpus=1) as cluster:
    group = Priority.create_group().launch(cluster, NodePlacementStrategy([0]), name="prio")
    print("NICE", os.getpriority(os.PRIO_PROCESS, 0), group.nice().wait(timeout=120)[0])
    print("ARENAS", *group.arenas_around_threads(8).wait(timeout=120)[0])
    print("DRIVER_ENV", os.environ.get("MALLOC_ARENA_MAX"))
"""


@pytest.mark.ray
def test_workers_of_a_started_ray_have_the_drivers_nice_value_and_two_malloc_arenas() -> None:
    # Meaningful when the driver's nice value is below 19 - 15 (with Ray's default the workers would be at +15).
    env = {**os.environ, "RAY_ENABLE_UV_RUN_RUNTIME_ENV": "0"}
    env.pop("MALLOC_ARENA_MAX", None)
    out = subprocess.run(
        [sys.executable, "-c", _PRIORITY_SCRIPT], capture_output=True, text=True, timeout=180, env=env
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {ln.split()[0]: ln.split()[1:] for ln in out.stdout.splitlines() if ln.split()}
    driver, worker = (int(v) for v in lines["NICE"])
    assert worker == driver
    # glibc's default (8 arenas per core) lets a worker's call threads each keep a peak heap; the started
    # instance's processes get MALLOC_ARENA_MAX=2, and the driver's environment is left as it was.
    if lines["ARENAS"][0] != "None":  # glibc
        before, after = (int(v) for v in lines["ARENAS"])
        assert before <= 2 and after <= 2, (before, after)
    assert lines["DRIVER_ENV"] == ["None"]
