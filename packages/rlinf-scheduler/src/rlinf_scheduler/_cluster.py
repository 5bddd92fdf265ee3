"""The runtime cluster: attach to (or start) Ray, wait for the nodes, probe and rank them.

A :class:`Cluster` is built once in the driver and passed to every ``launch``; nothing reaches it through a
singleton. It implements the placement package's :class:`~rlinf_scheduler.ClusterView`.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._config import (
    PATH_ENV_MERGE_MODE_ENV,
    PATH_LIKE_ENV_VARS,
    RESERVED_NODE_GROUP_LABELS,
    ClusterConfig,
    NodeGroupConfig,
    merge_path_env,
)
from ._deaths import explain_death, fault_file, oom_kill_count
from ._errors import SchedulerTimeoutError, WorkerFailure
from ._group import SHUTDOWN_GRACE_S, teardown_workers
from ._malloc import arena_env
from ._monitor import FailureMonitor

if TYPE_CHECKING:
    from ._group import WorkerGroup

__all__ = ["COMM_NET_DEVICES_ENV", "NODE_RANK_ENV", "Cluster", "NodeInfo"]

NODE_RANK_ENV = "RLINF_NODE_RANK"
"""Set on a node before ``ray start`` to fix its rank (every node or none)."""

COMM_NET_DEVICES_ENV = "RLINF_COMM_NET_DEVICES"
"""Set on a node before ``ray start``: network interface(s) its workers use for gloo/NCCL traffic."""

_HEAD_RESOURCE = "node:__internal_head__"
_LOCAL_SYSTEM_CONFIG: dict[str, Any] = {"worker_niceness": 0}
"""Ray settings of a local instance a cluster starts. ``worker_niceness`` is what Ray adds to the nice value of
its worker processes: Ray's default, 15, lets every other process of the machine (the driver, Ray's own daemons,
another program) preempt the workers, which do all of a run's work; 0 runs them at the driver's priority."""
_ACCELERATOR_TYPE_PREFIX = "accelerator_type:"
_logger = logging.getLogger("rlinf_scheduler.cluster")


@attrs.frozen(kw_only=True)
class NodeInfo:
    """What the cluster found out about one node (probed once, when the cluster starts).

    Attributes:
        rank: Node rank, ``0..num_nodes-1``.
        node_id: Ray node id (hex).
        ip: Node IP address.
        num_cpus: CPUs Ray schedules on the node.
        accelerator_type: ``"cuda"`` for NVIDIA GPUs, ``"cpu"`` for simulated slots, ``""`` if none.
        accelerator_model: e.g. ``"A100"``; ``"simulated"`` for simulated slots, ``""`` if none/unknown.
        num_accelerators: Accelerators (or simulated slots) on the node.
        python_interpreter: Default Python interpreter of Ray workers on the node.
        python_version: Its version, e.g. ``"3.11.7"``.
        is_head: Whether this is the Ray head node.
        env_vars: Variables every worker on the node gets (e.g. ``GLOO_SOCKET_IFNAME`` from
            ``RLINF_COMM_NET_DEVICES``).
        inherited_path_env: Path-like variables (``PATH``, ``LD_LIBRARY_PATH``, ...) a Ray worker process on
            the node inherits; node-group values are put in front of them.
    """

    rank: int
    node_id: str
    ip: str
    num_cpus: int
    accelerator_type: str
    accelerator_model: str
    num_accelerators: int
    python_interpreter: str
    python_version: str
    is_head: bool
    env_vars: Mapping[str, str] = attrs.field(factory=dict)
    inherited_path_env: Mapping[str, str] = attrs.field(factory=dict)


def _probe_node() -> dict[str, Any]:
    """Runs on a node: report what only the node itself knows."""
    return {
        "ip": ray.util.get_node_ip_address(),  # type: ignore[no-untyped-call]  # ray leaves it unannotated
        "python": sys.executable,
        "python_version": ".".join(str(v) for v in sys.version_info[:3]),
        "node_rank": os.environ.get(NODE_RANK_ENV),
        "net_devices": os.environ.get(COMM_NET_DEVICES_ENV),
        "cpu_count": os.cpu_count() or 0,
        "path_env": {
            k: v for k, v in os.environ.items() if k in PATH_LIKE_ENV_VARS or k == PATH_ENV_MERGE_MODE_ENV
        },
    }


def _started_local_node() -> bool:
    """Whether ``ray.init`` in this process started the local node (rather than attaching to a running one).

    A node this process started has its raylet as a child process. Where ``/proc`` cannot say (not Linux), the
    answer is ``False``, which only costs a probe task.
    """
    me = str(os.getpid())
    try:
        entries = os.listdir("/proc")
    except OSError:
        return False
    for pid in entries:
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as f:
                stat = f.read()
        except OSError:
            continue
        comm_end = stat.rfind(")")
        fields = stat[comm_end + 2 :].split()
        if stat[stat.find("(") + 1 : comm_end] == "raylet" and fields[1:2] == [me]:
            return True
    return False


def _reserve_free_port() -> int:
    """Runs on a node: a TCP port that was free on it a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
    return port


_probe_node_remote = ray.remote(num_cpus=0, max_retries=0)(_probe_node)
_reserve_port_remote = ray.remote(num_cpus=0, max_retries=0)(_reserve_free_port)


class Cluster:
    """A Ray cluster of ``num_nodes`` ranked nodes that worker groups are launched on.

    On construction it attaches to Ray (an already initialised connection in this process, the address in the
    config, ``RAY_ADDRESS``, or the cluster started on this machine with ``ray start``), or starts a local Ray
    instance when none runs. It
    then waits until ``num_nodes`` nodes are alive, probes each node once and ranks them: by
    ``RLINF_NODE_RANK`` if every node set it before ``ray start``, else head node first, then by IP.

    Worker actors of the run live in their own Ray namespace (:attr:`namespace`). Use the cluster as a context
    manager, or call :meth:`shutdown`, to tear every worker down (and stop Ray if this cluster started it).

    Example:
        >>> cluster = Cluster(num_nodes=1, simulated_accelerators_per_node=4)  # doctest: +SKIP
        >>> cluster.num_nodes, cluster.num_accelerators, cluster.accelerator_type  # doctest: +SKIP
        (1, 4, 'cpu')

    Args:
        config: Cluster settings; ``None`` uses the defaults (one node, no simulated accelerators).
        num_nodes: Overrides ``config.num_nodes``.
        simulated_accelerators_per_node: Overrides ``config.simulated_accelerators_per_node``.
        ray_address: Overrides ``config.ray_address`` (``"local"`` always starts a new local instance;
            ``"auto"`` attaches to any running instance found on this machine, or fails).
        namespace: Overrides ``config.namespace``.
        node_wait_timeout_s: Overrides ``config.node_wait_timeout_s``.
        num_cpus: CPUs of a local Ray instance this cluster starts (default: Ray's choice); ignored, with a
            warning, when it attaches to a running cluster.
        interrupt_main_on_failure: When a worker fails and no ``wait()`` in this process has raised the
            failure within ``failure_grace_s``, interrupt the main thread (``KeyboardInterrupt``) so the
            driver cannot hang on something else.
        failure_grace_s: See ``interrupt_main_on_failure``.

    Raises:
        SchedulerTimeoutError: If fewer than ``num_nodes`` nodes are alive after ``node_wait_timeout_s``.
        ValueError: If node ranks set through ``RLINF_NODE_RANK`` are incomplete, duplicated or out of range.
    """

    def __init__(
        self,
        config: ClusterConfig | None = None,
        *,
        num_nodes: int | None = None,
        simulated_accelerators_per_node: int | None = None,
        ray_address: str | None = None,
        namespace: str | None = None,
        node_wait_timeout_s: float | None = None,
        num_cpus: int | None = None,
        interrupt_main_on_failure: bool = True,
        failure_grace_s: float = 3.0,
    ) -> None:
        if config is not None and not isinstance(config, ClusterConfig):
            raise TypeError(f"config: expected a ClusterConfig or None, got {type(config).__name__}")
        overrides: dict[str, Any] = {
            key: value
            for key, value in {
                "num_nodes": num_nodes,
                "simulated_accelerators_per_node": simulated_accelerators_per_node,
                "ray_address": ray_address,
                "namespace": namespace,
                "node_wait_timeout_s": node_wait_timeout_s,
            }.items()
            if value is not None
        }
        base = config if config is not None else ClusterConfig()
        self._config: ClusterConfig = attrs.evolve(base, **overrides) if overrides else base
        self._namespace = self._config.namespace or f"rlinf-{uuid.uuid4().hex[:12]}"
        self._lock = threading.RLock()
        self._groups: dict[str, WorkerGroup] = {}
        self._issued_ports: set[tuple[str, int]] = set()
        self._closed = False
        self._monitor: FailureMonitor | None = None
        self._reaper: subprocess.Popen[bytes] | None = None
        self._fault_dir = tempfile.mkdtemp(prefix="rlinf-faults-")
        self._oom_kills_at_start = oom_kill_count()
        self._owns_ray = self._connect(num_cpus)
        self._started_node = _started_local_node() if self._owns_ray else False
        if self._owns_ray:
            self._reaper = _start_reaper()
        try:
            self._nodes = self._discover_nodes()
        except BaseException:
            self._disconnect()
            shutil.rmtree(self._fault_dir, ignore_errors=True)
            raise
        self._monitor = FailureMonitor(
            self, interrupt_main=interrupt_main_on_failure, grace_s=failure_grace_s
        )

    # ----------------------------------------------------------------------------------------- Ray plumbing
    def _connect(self, num_cpus: int | None) -> bool:
        """Attach to Ray or start it; returns whether this cluster started (and so owns) the connection."""
        if ray.is_initialized():
            return False
        address = self._config.ray_address
        common: dict[str, Any] = {"namespace": self._namespace, "log_to_driver": True}
        start: dict[str, Any] = {
            "num_cpus": num_cpus,
            "include_dashboard": False,
            "_system_config": dict(_LOCAL_SYSTEM_CONFIG),
        }
        if address is not None:
            if address == "local":
                with arena_env():  # the instance's processes inherit it (see _malloc)
                    ray.init(address="local", **start, **common)
            else:
                ray.init(address=address, **common)
            return True
        # No address: Ray's own resolution, i.e. RAY_ADDRESS, else the cluster started on this machine with
        # `ray start`, else a new local instance. (Unlike address="auto", it never attaches to another
        # program's private local instance that happens to run on the same machine.)
        try:
            with arena_env():
                ray.init(**start, **common)
        except ValueError as err:
            if "existing cluster" not in str(err):
                raise
            # Attaching: the running cluster's settings apply (Ray refuses num_cpus and _system_config here).
            if num_cpus is not None:
                _logger.warning(
                    "Cluster: attached to a running Ray cluster; num_cpus=%s is ignored", num_cpus
                )
            ray.init(**common)
        return True

    def _disconnect(self) -> None:
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        reaper, self._reaper = self._reaper, None
        if reaper is not None and reaper.stdin is not None:
            try:  # a planned shutdown: tell the reaper to leave everything alone
                reaper.stdin.write(b"exit\n")
                reaper.stdin.close()
                reaper.wait(timeout=5.0)
            except (OSError, subprocess.TimeoutExpired):
                reaper.kill()

    def _discover_nodes(self) -> tuple[NodeInfo, ...]:
        wanted = self._config.num_nodes
        timeout = self._config.node_wait_timeout_s
        deadline = time.monotonic() + timeout
        while True:
            alive = [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]  # ray leaves it unannotated
            if len(alive) >= wanted:
                break
            if time.monotonic() > deadline:
                raise SchedulerTimeoutError(
                    f"Cluster: waited {timeout:g} s (node_wait_timeout_s) for {wanted} Ray node(s) "
                    f"(num_nodes={wanted}) but found {len(alive)} alive"
                    + (f": {sorted(n['NodeManagerAddress'] for n in alive)}" if alive else "")
                    + ". Start the missing nodes with `ray start --address=<head>` or lower num_nodes."
                )
            time.sleep(0.2)
        # The node this driver started runs its workers with the driver's interpreter and environment: probe it
        # here rather than through a task, which would wait for a worker process to boot.
        here = ray.get_runtime_context().get_node_id() if self._started_node else None
        refs = [
            None
            if n["NodeID"] == here
            else _probe_node_remote.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False)
            ).remote()
            for n in alive
        ]
        remaining = max(deadline - time.monotonic(), 30.0)
        try:
            remote = iter(ray.get([r for r in refs if r is not None], timeout=remaining))
            probes = [_probe_node() if r is None else next(remote) for r in refs]
        except ray.exceptions.GetTimeoutError as err:
            raise SchedulerTimeoutError(
                f"Cluster: probing {len(alive)} node(s) did not finish within {remaining:.0f} s"
            ) from err
        order = _order_nodes(alive, probes)
        if len(order) > wanted:
            _logger.warning(
                "Cluster: %d nodes are alive but num_nodes=%d; using the first %d in rank order",
                len(order),
                wanted,
                wanted,
            )
        return tuple(self._node_info(rank, alive[i], probes[i]) for rank, i in enumerate(order[:wanted]))

    def _node_info(self, rank: int, node: Mapping[str, Any], probe: Mapping[str, Any]) -> NodeInfo:
        resources: Mapping[str, float] = node.get("Resources", {})
        k = self._config.simulated_accelerators_per_node
        if k > 0:
            acc_type, acc_model, acc_count = "cpu", "simulated", k
        elif resources.get("GPU", 0) > 0:
            models = [
                key[len(_ACCELERATOR_TYPE_PREFIX) :]
                for key in resources
                if key.startswith(_ACCELERATOR_TYPE_PREFIX)
            ]
            acc_type, acc_model, acc_count = "cuda", (models[0] if models else ""), int(resources["GPU"])
        else:
            acc_type, acc_model, acc_count = "", "", 0
        env: dict[str, str] = {}
        if probe.get("net_devices"):
            env["GLOO_SOCKET_IFNAME"] = probe["net_devices"]
            env["NCCL_SOCKET_IFNAME"] = probe["net_devices"]
        return NodeInfo(
            rank=rank,
            node_id=node["NodeID"],
            ip=probe["ip"],
            num_cpus=int(resources.get("CPU", 0)),
            accelerator_type=acc_type,
            accelerator_model=acc_model,
            num_accelerators=acc_count,
            python_interpreter=probe["python"],
            python_version=probe["python_version"],
            is_head=_HEAD_RESOURCE in resources,
            env_vars=env,
            inherited_path_env=dict(probe.get("path_env", {})),
        )

    # ------------------------------------------------------------------------------------ ClusterView API
    @property
    def config(self) -> ClusterConfig:
        """The effective configuration (with constructor overrides applied)."""
        return self._config

    @property
    def fault_dir(self) -> str:
        """Directory (on the driver's node) where each worker records fatal signals (see ``_deaths``)."""
        return self._fault_dir

    def explain_death(self, group_name: str, rank: int, ray_message: str) -> str:
        """How worker ``group_name:rank`` most likely died, from the records this node has."""
        return explain_death(
            ray_message,
            fault_file(self._fault_dir, group_name, rank),
            oom_kills_before=self._oom_kills_at_start,
            oom_kills_now=oom_kill_count(),
        )

    @property
    def namespace(self) -> str:
        """Ray namespace of this run's named actors."""
        return self._namespace

    @property
    def num_nodes(self) -> int:
        """Number of nodes of the run."""
        return len(self._nodes)

    @property
    def nodes(self) -> tuple[NodeInfo, ...]:
        """Probed node information, in node-rank order."""
        return self._nodes

    def node(self, rank: int) -> NodeInfo:
        """Node information of node ``rank``.

        Raises:
            IndexError: If ``rank`` is not in ``0..num_nodes-1``.
        """
        if not 0 <= rank < len(self._nodes):
            raise IndexError(
                f"node rank {rank} out of range: the cluster has nodes 0..{len(self._nodes) - 1}"
            )
        return self._nodes[rank]

    @property
    def num_accelerators(self) -> int:
        """Accelerators (or simulated slots) over all nodes."""
        return sum(n.num_accelerators for n in self._nodes)

    @property
    def accelerator_type(self) -> str:
        """``"cuda"``, ``"cpu"`` (simulated) or ``""`` (none); the type of the first node that has any."""
        return next((n.accelerator_type for n in self._nodes if n.num_accelerators > 0), "")

    def accelerators_per_node(self, node_rank: int) -> int:
        """Accelerators (or simulated slots) on node ``node_rank``."""
        return self.node(node_rank).num_accelerators

    @property
    def node_groups(self) -> Sequence[NodeGroupConfig]:
        """The configured node groups."""
        return self._config.node_groups

    # ------------------------------------------------------------------------------------- worker support
    def worker_env(self, node_group: str, node_rank: int) -> tuple[dict[str, str], str | None]:
        """Environment variables and Python interpreter of a worker placed on ``node_rank`` via ``node_group``.

        A worker placed through a configured node group gets that group's variables and interpreter on the
        node; one placed through the reserved ``cluster``/``node`` labels gets those of every configured group
        that contains the node. Node-level variables (:attr:`NodeInfo.env_vars`) are not included.
        Path-like variables (``PATH``, ``LD_LIBRARY_PATH``, ``PYTHONPATH``, ...) are put in front of what a
        worker on the node inherits (each entry once), unless the node groups or the node set
        ``RLINF_PATH_ENV_MERGE_MODE=override``.

        Raises:
            ValueError: If two node groups set conflicting values on that node.
        """
        inherited = self.node(node_rank).inherited_path_env
        if node_group in RESERVED_NODE_GROUP_LABELS:
            env, interpreter = (
                self._config.env_vars_on(node_rank),
                self._config.python_interpreter_on(node_rank),
            )
        else:
            group = self._config.node_group(node_group)
            env, interpreter = group.env_vars_on(node_rank), group.python_interpreter_on(node_rank)
        return merge_path_env(inherited, env), interpreter

    def reserve_port(self, node_rank: int) -> int | ray.ObjectRef[int]:
        """A TCP port that was free on node ``node_rank`` a moment ago (for ``MASTER_PORT``).

        On the driver's node the port is picked here and never handed out twice by this cluster. On another
        node a task picks it there; the result is an ``ObjectRef`` so that launching stays non-blocking (Ray
        resolves it when it is passed to an actor).
        """
        node = self.node(node_rank)
        if node.node_id == ray.get_runtime_context().get_node_id():
            with self._lock:
                for _ in range(64):
                    port = _reserve_free_port()
                    if (node.ip, port) not in self._issued_ports:
                        self._issued_ports.add((node.ip, port))
                        return port
            raise RuntimeError(f"Cluster: could not find a fresh free port on node {node_rank} ({node.ip})")
        return _reserve_port_remote.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False)
        ).remote()

    def _register_group(self, group: WorkerGroup) -> None:
        with self._lock:
            if self._closed:
                raise RuntimeError("Cluster: cannot launch a worker group on a cluster that was shut down")
            if group.name in self._groups:
                raise ValueError(
                    f"name: a worker group called {group.name!r} already runs on this cluster; "
                    f"running groups: {sorted(self._groups)}"
                )
            self._groups[group.name] = group

    def _monitor_actor(self, group: WorkerGroup, rank: int, handle: Any) -> None:
        assert self._monitor is not None
        self._monitor.watch(group, rank, handle)

    def _report_failure(self, failure: WorkerFailure) -> None:
        assert self._monitor is not None
        self._monitor.report(failure)

    def _failure_delivered(self) -> None:
        assert self._monitor is not None
        self._monitor.delivered()

    def _unregister_group(self, group: WorkerGroup) -> None:
        with self._lock:
            self._groups.pop(group.name, None)
        if self._monitor is not None:
            self._monitor.unwatch(group)

    @property
    def groups(self) -> Mapping[str, WorkerGroup]:
        """Running worker groups by name."""
        with self._lock:
            return dict(self._groups)

    @property
    def failure(self) -> WorkerFailure | None:
        """The first worker failure of the run, or ``None``."""
        return None if self._monitor is None else self._monitor.failure

    # ------------------------------------------------------------------------------------------ lifecycle
    def shutdown(self) -> None:
        """Kill every worker group of the run, stop failure monitoring, and stop Ray if this cluster started it.

        Idempotent.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            groups = list(self._groups.values())
        if self._monitor is not None:
            self._monitor.stop()
        teardown_workers([h for g in groups for h in g._mark_shut_down()], grace_s=SHUTDOWN_GRACE_S)
        self._disconnect()
        shutil.rmtree(self._fault_dir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def __repr__(self) -> str:
        return (
            f"Cluster(num_nodes={self.num_nodes}, num_accelerators={self.num_accelerators}, "
            f"accelerator_type={self.accelerator_type!r}, namespace={self._namespace!r})"
        )


def _start_reaper() -> subprocess.Popen[bytes] | None:
    """Start the process that kills this driver's local Ray processes if the driver dies (see ``_reaper``).

    Ray's agents outlive a driver killed by ``SIGKILL`` by a minute or more; the reaper notices the death
    (its stdin pipe closes) and kills every Ray process that ran below the driver. Linux only.
    """
    if not sys.platform.startswith("linux"):
        return None
    script = Path(__file__).with_name("_reaper.py")
    try:
        return subprocess.Popen(
            [sys.executable, "-I", str(script), str(os.getpid())],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            start_new_session=True,  # not killed with the driver's process group
        )
    except OSError as err:
        _logger.warning("Cluster: could not start the Ray process reaper (%s)", err)
        return None


def _order_nodes(alive: Sequence[Mapping[str, Any]], probes: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of ``alive`` in node-rank order (see :class:`Cluster`)."""
    raw = [p.get("node_rank") for p in probes]
    set_count = sum(r is not None for r in raw)
    if set_count == 0:
        return sorted(
            range(len(alive)),
            key=lambda i: (
                _HEAD_RESOURCE not in alive[i].get("Resources", {}),
                _ip_key(probes[i]["ip"]),
                alive[i].get("NodeManagerPort", 0),
            ),
        )
    described = [f"{probes[i]['ip']}: {raw[i]!r}" for i in range(len(alive))]
    if set_count != len(alive):
        raise ValueError(
            f"{NODE_RANK_ENV} is set on {set_count} of {len(alive)} nodes; set it on every node before "
            f"`ray start`, or on none (then the head node is rank 0 and the others follow by IP). Nodes: {described}"
        )
    ranks: list[int] = []
    for value in raw:
        try:
            ranks.append(int(str(value).strip()))
        except ValueError:
            raise ValueError(
                f"{NODE_RANK_ENV} must be an integer, got {value!r}. Nodes: {described}"
            ) from None
    if sorted(ranks) != list(range(len(alive))):
        raise ValueError(
            f"{NODE_RANK_ENV} values must be unique and cover 0..{len(alive) - 1} "
            f"({len(alive)} alive nodes), got {sorted(ranks)}. Nodes: {described}"
        )
    return sorted(range(len(alive)), key=lambda i: ranks[i])


def _ip_key(ip: str) -> tuple[int, int]:
    try:
        addr = ipaddress.ip_address(ip)
    except ValueError:
        return (99, 0)
    return (addr.version, int(addr))
