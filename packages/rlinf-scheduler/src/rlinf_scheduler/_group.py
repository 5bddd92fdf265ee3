"""Worker groups: launching one actor per placement rank, and calling methods on all (or some) ranks."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import pickle
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ._deaths import FAULT_DIR_ENV
from ._errors import SchedulerTimeoutError, WorkerFailedError, WorkerFailure
from ._placement import NodePlacementStrategy
from ._trace import WAIT, trace_span, tracing_enabled
from ._worker import Worker, WorkerContext

if TYPE_CHECKING:
    from ._cluster import Cluster
    from ._placement import Placement, PlacementStrategy

__all__ = ["GroupCall", "GroupLauncher", "RoleCall", "RoleGroup", "WorkerGroup"]

P = ParamSpec("P")
R = TypeVar("R")
W_co = TypeVar("W_co", covariant=True)

DEFAULT_MAX_CONCURRENCY = 32
"""Threads per worker actor: calls that may run at once (e.g. incoming communication while a method blocks)."""

SHUTDOWN_GRACE_S = 5.0
"""Seconds workers get to release shared memory and pair groups on a planned shutdown."""
FAILURE_GRACE_S = 1.0
"""The same after a failure, when the run must end quickly."""

# Names of Worker members that make no sense as remote group calls.
_NOT_GROUP_METHODS = frozenset({"create_group", "timer"})


class GroupLauncher:
    """A worker class with its constructor arguments, ready to launch (returned by ``Worker.create_group``)."""

    def __init__(self, worker_cls: type[Worker], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if not (isinstance(worker_cls, type) and issubclass(worker_cls, Worker)):
            raise TypeError(f"create_group: {worker_cls!r} is not a subclass of rlinf_scheduler.Worker")
        self.worker_cls = worker_cls
        self.args = args
        self.kwargs = kwargs

    def launch(
        self,
        cluster: Cluster,
        placement_strategy: PlacementStrategy | None = None,
        name: str | None = None,
        *,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
    ) -> WorkerGroup:
        """Start one worker actor per placement rank and return the group at once (actors start meanwhile).

        Args:
            cluster: The cluster to run on.
            placement_strategy: Where each rank runs; ``None``: one worker on node 0 seeing all its accelerators.
            name: Group name, unique in the cluster (default: the class name). Worker ``r`` is the named Ray
                actor ``f"{name}:{r}"`` in the cluster's namespace.
            max_concurrency: Threads per worker actor (at least 32, so that communication calls never starve).

        Raises:
            ValueError: If the name is taken or invalid, or the placement does not fit the cluster.
        """
        group_name = self.worker_cls.__name__ if name is None else name
        if not isinstance(group_name, str) or not group_name or ":" in group_name:
            raise ValueError(f"name: expected a non-empty string without ':', got {group_name!r}")
        if max_concurrency < DEFAULT_MAX_CONCURRENCY:
            raise ValueError(f"max_concurrency: expected >= {DEFAULT_MAX_CONCURRENCY}, got {max_concurrency}")
        strategy = NodePlacementStrategy([0]) if placement_strategy is None else placement_strategy
        placements = list(strategy.get_placement(cluster))
        if not placements:
            raise ValueError(f"placement_strategy: {strategy!r} gave no placements on {cluster!r}")
        group = WorkerGroup(cluster, self.worker_cls, group_name, placements)
        cluster._register_group(group)
        try:
            group._start(self.args, self.kwargs, max_concurrency)
        except BaseException:
            group.shutdown()
            raise
        return group


_METHODS_CACHE: weakref.WeakKeyDictionary[type[Worker], frozenset[str]] = weakref.WeakKeyDictionary()
_ACTOR_CLASS_CACHE: weakref.WeakKeyDictionary[type[Worker], Any] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.RLock()  # _actor_class holds it while _group_methods fills its cache


def _group_methods(worker_cls: type[Worker]) -> frozenset[str]:
    """Names callable on a group: public plain functions of the class (not static/class methods)."""
    methods = _METHODS_CACHE.get(worker_cls)
    if methods is None:
        methods = frozenset(
            name
            for name in dir(worker_cls)
            if not name.startswith("_")
            and name not in _NOT_GROUP_METHODS
            and inspect.isfunction(inspect.getattr_static(worker_cls, name, None))
        )
        with _CACHE_LOCK:
            _METHODS_CACHE[worker_cls] = methods
    return methods


def _actor_class(worker_cls: type[Worker]) -> Any:
    """The cached Ray actor class of ``worker_cls`` (see :func:`_make_actor_class`)."""
    with _CACHE_LOCK:
        actor_cls = _ACTOR_CLASS_CACHE.get(worker_cls)
        if actor_cls is None:
            actor_cls = _ACTOR_CLASS_CACHE[worker_cls] = _make_actor_class(worker_cls)
    return actor_cls


def _make_actor_class(worker_cls: type[Worker]) -> Any:
    """The Ray actor class for ``worker_cls``: a subclass whose ``__init__`` installs the context first.

    Each group method is overridden by a wrapper that records a raise as the worker's failure (so the driver's
    monitor learns of it even if nobody waits on the call). ``async def`` methods become sync ones that run
    their own event loop, because one coroutine method would turn the whole actor into a single-threaded
    asyncio actor. The user's class itself is left untouched.
    """

    def __init__(
        self: Worker, _rlinf_ctx: WorkerContext, _rlinf_port: int, *args: Any, **kwargs: Any
    ) -> None:
        self._rlinf_setup(_rlinf_ctx, _rlinf_port)
        try:
            worker_cls.__init__(self, *args, **kwargs)
        except BaseException as exc:
            self._rlinf_record_failure("__init__", exc)
            raise

    members: dict[str, Any] = {"__init__": __init__}
    for name in dir(worker_cls):
        attr = inspect.getattr_static(worker_cls, name, None)
        if name in _group_methods(worker_cls) or inspect.iscoroutinefunction(attr):
            members[name] = _recording_wrapper(attr, name)
    members["__module__"] = __name__
    members["__qualname__"] = f"_actor_class.<locals>.{worker_cls.__name__}"
    return ray.remote(type(worker_cls.__name__, (worker_cls,), members))


_CALL_DEPTH = threading.local()
"""Per-thread nesting depth of wrapped worker methods (see ``_recording_wrapper``)."""


def _enter_call() -> int:
    """Increment this thread's call depth; return the depth before the call."""
    depth: int = getattr(_CALL_DEPTH, "n", 0)
    _CALL_DEPTH.n = depth + 1
    return depth


def _leave_call(depth: int) -> None:
    _CALL_DEPTH.n = depth


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _recording_wrapper(fn: Any, name: str) -> Any:
    is_coroutine = inspect.iscoroutinefunction(fn)

    @functools.wraps(fn)
    def method(self: Worker, *args: Any, **kwargs: Any) -> Any:
        # Only the outermost call on this thread is a group call: an exception raised by a nested
        # ``self.recv(...)`` that the user's method catches must not end the run.
        # (module-level helpers: the wrapper is pickled by value, a threading.local cannot be)
        if is_coroutine and _in_running_loop():
            # ``await self.other_async_method()`` inside another coroutine method: hand back the coroutine
            # for the caller's loop (the outer group call records a failure if it escapes).
            return fn(self, *args, **kwargs)
        depth = _enter_call()
        try:
            if is_coroutine:
                return asyncio.run(fn(self, *args, **kwargs))
            return fn(self, *args, **kwargs)
        except BaseException as exc:
            if depth == 0:
                self._rlinf_record_failure(name, exc)
                portable = _portable(exc)
                if portable is not None:
                    raise portable from None
            raise
        finally:
            _leave_call(depth)
            if depth == 0:
                # The connections this thread's receives claimed go back to their reader threads.
                comm = self.__dict__.get("_rlinf_comm_state")
                if comm is not None:
                    comm.release_claims()

    # functools.wraps copies a coroutine marker set by inspect.markcoroutinefunction; Ray must see a plain function.
    method.__dict__.pop("_is_coroutine_marker", None)
    return method


def _portable(exc: BaseException) -> RuntimeError | None:
    """``None`` if ``exc`` survives pickling (Ray hands it to the caller as is), else a stand-in that does.

    The stand-in is a ``RuntimeError`` with the type, message and traceback, so that the caller sees the worker's
    failure instead of Ray's "failed to deserialize exception" (an exception class whose ``__init__`` takes other
    arguments than ``args`` cannot be rebuilt).
    """
    try:
        pickle.loads(pickle.dumps(exc))
        return None
    except Exception:
        text = "".join(traceback.format_exception(exc)).rstrip()
        return RuntimeError(f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}\n{text}")


def _method_name(method: str | Callable[..., Any]) -> str:
    """The worker method a group call names: a string, or a function whose ``__name__`` is the method's."""
    if isinstance(method, str):
        return method
    name = getattr(method, "__name__", None)
    if not callable(method) or not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"call: expected a method name or a method (e.g. MyRole.step), got {method!r}")
    return name


class RoleCall(Protocol[R]):
    """What a typed group call returns (``GroupCall`` fits): one result per rank."""

    def wait(self, timeout: float | None = None) -> list[R]: ...

    def done(self) -> bool: ...


class RoleSubset(Protocol[W_co]):
    """Some ranks of a role group (``group.execute_on(...)``): calls run on those ranks only."""

    def call(
        self, method: Callable[Concatenate[W_co, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> RoleCall[R]:
        """Run ``method(*args, **kwargs)`` on the selected ranks (results in the order given)."""
        ...


class RoleGroup(Protocol[W_co]):
    """A group whose workers play role ``W_co`` (a Protocol of worker methods); ``WorkerGroup`` fits.

    ``group.call(Role.method, *args)`` type-checks the arguments against ``Role.method`` and returns a call whose
    ``wait()`` is a list of its return type, one per rank::

        actor: RoleGroup[EmbodiedActor] = launcher.launch(cluster, name="actor")
        metrics: list[dict[str, float]] = actor.call(EmbodiedActor.run_training).wait()
    """

    @property
    def name(self) -> str:
        """Group name."""
        ...

    @property
    def world_size(self) -> int:
        """Number of workers."""
        ...

    def call(
        self, method: Callable[Concatenate[W_co, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> RoleCall[R]:
        """Run ``method(*args, **kwargs)`` on every rank."""
        ...

    def execute_on(self, *ranks: int) -> RoleSubset[W_co]:
        """Restrict the next call to ``ranks``."""
        ...


class WorkerGroup:
    """A launched group of workers: one Ray actor per rank.

    Calling a public method of the worker class on the group (``group.step(x)``) runs it on every rank and
    returns a :class:`GroupCall` at once; ``.wait(timeout=...)`` gives the per-rank results in rank order, and
    ``await call`` does the same in asyncio code. ``group.execute_on(0, 2).step(x)`` runs on some ranks only.
    Names defined by the group itself (``name``, ``world_size``, ``shutdown``, ...) take precedence over
    worker methods of the same name; reach those with :meth:`call`.
    """

    def __init__(
        self, cluster: Cluster, worker_cls: type[Worker], name: str, placements: Sequence[Placement]
    ) -> None:
        self._cluster = cluster
        self._worker_cls = worker_cls
        self._name = name
        self._placements = tuple(placements)
        self._handles: list[Any] = []
        self._lock = threading.Lock()
        self._shut_down = False
        ranks = [p.rank for p in self._placements]
        if ranks != list(range(len(ranks))):
            raise ValueError(f"placement_strategy: expected ranks 0..{len(ranks) - 1} in order, got {ranks}")

    # -------------------------------------------------------------------------------------------- launch
    def _start(self, args: tuple[Any, ...], kwargs: dict[str, Any], max_concurrency: int) -> None:
        cluster = self._cluster
        actor_cls = _actor_class(self._worker_cls)
        rank0 = self._placements[0]
        master_addr = cluster.node(rank0.node_rank).ip
        master_port = cluster.reserve_port(rank0.node_rank)
        world_size = len(self._placements)
        for placement in self._placements:
            node = cluster.node(placement.node_rank)
            group_env, interpreter = cluster.worker_env(placement.node_group, placement.node_rank)
            env: dict[str, str] = {
                **node.env_vars,
                **group_env,
                "RANK": str(placement.rank),
                "WORLD_SIZE": str(world_size),
                "LOCAL_RANK": str(placement.local_rank),
                "LOCAL_WORLD_SIZE": str(placement.local_world_size),
                "MASTER_ADDR": master_addr,
                "RLINF_ACCELERATOR_TYPE": placement.accelerator_type,
                "RLINF_VISIBLE_ACCELERATORS": placement.visible_accelerators,
            }
            fault_dir = getattr(cluster, "fault_dir", None)
            if fault_dir is not None and node.node_id == ray.get_runtime_context().get_node_id():
                # only where the driver can read it (see _deaths)
                env[FAULT_DIR_ENV] = fault_dir
            # Variables that must exist when the process starts go through Ray's runtime env (which costs a
            # fresh process); everything else is set in-process before the user's __init__.
            start_env = dict(group_env)
            if node.accelerator_type == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = placement.visible_accelerators
                start_env["CUDA_VISIBLE_DEVICES"] = placement.visible_accelerators
                # GPUs are bound by env var, not Ray GPU resources: stop Ray from overwriting the variable.
                start_env["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"] = "1"
            runtime_env: dict[str, Any] = {}
            if start_env:
                runtime_env["env_vars"] = start_env
            if interpreter is not None:
                runtime_env["py_executable"] = interpreter
            ctx = WorkerContext(
                group_name=self._name,
                rank=placement.rank,
                world_size=world_size,
                namespace=cluster.namespace,
                placement=placement,
                node_ip=node.ip,
                master_addr=master_addr,
                env_vars=env,
            )
            options: dict[str, Any] = {
                "name": f"{self._name}:{placement.rank}",
                "namespace": cluster.namespace,
                "max_concurrency": max_concurrency,
                "num_cpus": 0,
                "max_restarts": 0,
                "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=node.node_id, soft=False),
            }
            if runtime_env:
                options["runtime_env"] = runtime_env
            handle = actor_cls.options(**options).remote(ctx, master_port, *args, **kwargs)
            with self._lock:
                self._handles.append(handle)
            cluster._monitor_actor(self, placement.rank, handle)

    # ------------------------------------------------------------------------------------------- members
    @property
    def name(self) -> str:
        """Group name."""
        return self._name

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self._placements)

    @property
    def placements(self) -> tuple[Placement, ...]:
        """Placement of each rank."""
        return self._placements

    @property
    def worker_class(self) -> type[Worker]:
        """The user's worker class."""
        return self._worker_cls

    @property
    def actor_handles(self) -> tuple[Any, ...]:
        """Ray actor handles by rank (for advanced use; prefer group calls)."""
        with self._lock:
            return tuple(self._handles)

    def execute_on(self, *ranks: int) -> _RankSubset:
        """Restrict the next method call to ``ranks`` (results come back in the order given)."""
        if not ranks:
            raise ValueError("execute_on: give at least one rank")
        for r in ranks:
            if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < self.world_size:
                raise ValueError(
                    f"execute_on: rank {r!r} is not in 0..{self.world_size - 1} of group {self._name!r}"
                )
        return _RankSubset(self, tuple(ranks))

    @overload
    def call(
        self, method: Callable[Concatenate[Any, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> GroupCall[R]: ...

    @overload
    def call(self, method: str, *args: Any, **kwargs: Any) -> GroupCall[Any]: ...

    def call(self, method: str | Callable[..., Any], *args: Any, **kwargs: Any) -> GroupCall[Any]:
        """Call a worker method on every rank.

        Args:
            method: The method: a function whose name is the worker method's (``MyRole.step`` or
                ``MyWorker.step``: the arguments are then type-checked against it and ``wait()`` returns its
                return type per rank), or its name (also reaches methods shadowed by a group member).
            *args: Positional arguments of the method.
            **kwargs: Keyword arguments of the method.

        Raises:
            AttributeError: If the worker class has no such public method.
            TypeError: If ``method`` is neither a name nor a named function.
        """
        return self._call(_method_name(method), tuple(range(self.world_size)), args, kwargs)

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until every worker's constructor finished.

        Raises:
            WorkerFailedError: If a worker failed (e.g. its ``__init__`` raised).
            SchedulerTimeoutError: After ``timeout`` seconds.
        """
        refs = [h.__ray_ready__.remote() for h in self._live_handles()]
        GroupCall(self, "__init__", tuple(range(self.world_size)), refs).wait(timeout=timeout)

    def shutdown(self) -> None:
        """Kill the group's actors (idempotent); later calls on the group raise ``RuntimeError``."""
        teardown_workers(self._mark_shut_down(), grace_s=SHUTDOWN_GRACE_S)

    def _mark_shut_down(self) -> list[Any]:
        """Stop watching the group and return the handles still to kill (none if it was already shut down)."""
        with self._lock:
            if self._shut_down:
                return []
            self._shut_down = True
            handles = list(self._handles)
        self._cluster._unregister_group(self)
        return handles

    def __getattr__(self, method: str) -> _GroupMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _GroupMethod(self, method, tuple(range(self.world_size)))

    def __repr__(self) -> str:
        return f"WorkerGroup(name={self._name!r}, worker_class={self._worker_cls.__name__}, world_size={self.world_size})"

    # ------------------------------------------------------------------------------------------ internal
    def _live_handles(self) -> list[Any]:
        failure = self._cluster.failure
        if failure is not None:
            raise WorkerFailedError(failure)
        with self._lock:
            if self._shut_down:
                raise RuntimeError(f"worker group {self._name!r} was shut down")
            return list(self._handles)

    def _check_method(self, method: str) -> None:
        methods = _group_methods(self._worker_cls)
        if method not in methods:
            raise AttributeError(
                f"{self._worker_cls.__name__} has no public method {method!r} to call on group {self._name!r}; "
                f"callable: {sorted(methods)}"
            )

    def _call(
        self, method: str, ranks: tuple[int, ...], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> GroupCall[Any]:
        self._check_method(method)
        handles = self._live_handles()
        refs = [getattr(handles[r], method).remote(*args, **kwargs) for r in ranks]
        return GroupCall(self, method, ranks, refs)


class _GroupMethod:
    """``group.method``: calling it dispatches to the ranks."""

    __slots__ = ("_group", "_method", "_ranks")

    def __init__(self, group: WorkerGroup, method: str, ranks: tuple[int, ...]) -> None:
        group._check_method(method)
        self._group = group
        self._method = method
        self._ranks = ranks

    def __call__(self, *args: Any, **kwargs: Any) -> GroupCall[Any]:
        return self._group._call(self._method, self._ranks, args, kwargs)

    def __repr__(self) -> str:
        return f"<group method {self._group.name}.{self._method} on ranks {list(self._ranks)}>"


class _RankSubset:
    """``group.execute_on(...)``: method calls on a subset of ranks."""

    def __init__(self, group: WorkerGroup, ranks: tuple[int, ...]) -> None:
        self._group = group
        self._ranks = ranks

    @overload
    def call(
        self, method: Callable[Concatenate[Any, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> GroupCall[R]: ...

    @overload
    def call(self, method: str, *args: Any, **kwargs: Any) -> GroupCall[Any]: ...

    def call(self, method: str | Callable[..., Any], *args: Any, **kwargs: Any) -> GroupCall[Any]:
        """Call a worker method (a name or a function, as in :meth:`WorkerGroup.call`) on the selected ranks."""
        return self._group._call(_method_name(method), self._ranks, args, kwargs)

    def __getattr__(self, method: str) -> _GroupMethod:
        if method.startswith("_"):
            raise AttributeError(method)
        return _GroupMethod(self._group, method, self._ranks)


class GroupCall(Generic[R]):
    """Handle of a method call running on some ranks of a group (``R``: the method's return type).

    ``wait(timeout=...)`` returns the results in rank order (the order given to ``execute_on``); ``await`` it
    in asyncio code. If any worker of the cluster fails meanwhile, waiting raises :class:`WorkerFailedError`
    with that worker's traceback (every worker of the run has then been torn down).
    """

    def __init__(self, group: WorkerGroup, method: str, ranks: tuple[int, ...], refs: list[Any]) -> None:
        self._group = group
        self._method = method
        self._ranks = ranks
        self._refs = refs

    @property
    def ranks(self) -> tuple[int, ...]:
        """Ranks the call runs on, in result order."""
        return self._ranks

    @property
    def object_refs(self) -> list[Any]:
        """The underlying Ray object refs, one per rank."""
        return list(self._refs)

    def done(self) -> bool:
        """Whether every rank has finished (successfully or not); never blocks."""
        ready, _ = ray.wait(self._refs, num_returns=len(self._refs), timeout=0, fetch_local=False)
        return len(ready) == len(self._refs)

    def _what(self) -> str:
        return f"{self._group.name}.{self._method}() on rank(s) {list(self._ranks)}"

    def wait(self, timeout: float | None = None) -> list[R]:
        """Block until every rank finished; return the results in rank order.

        Args:
            timeout: Seconds to wait at most; ``None`` waits as long as it takes (a failing worker still ends
                the wait at once).

        Raises:
            WorkerFailedError: If a worker of the run raised or died (this call's or any other group's).
            SchedulerTimeoutError: After ``timeout`` seconds, naming the call and the ranks still running.
        """
        if not tracing_enabled():
            return self._wait(timeout)
        with trace_span(f"wait {self._group.name}.{self._method}", WAIT):
            return self._wait(timeout)

    def _wait(self, timeout: float | None) -> list[R]:
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            if len(self._refs) == 1:
                return [ray.get(self._refs[0], timeout=timeout)]
            pending = list(self._refs)
            while pending:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                ready, pending = ray.wait(pending, num_returns=1, timeout=remaining, fetch_local=False)
                if not ready:
                    break
                # Surface an error of a finished rank at once instead of waiting for the others.
                ray.get(ready)
            if pending:
                waiting = [self._ranks[self._refs.index(r)] for r in pending]
                raise ray.exceptions.GetTimeoutError(f"ranks {waiting} still running")
            return list(ray.get(self._refs))
        except ray.exceptions.GetTimeoutError as err:
            raise SchedulerTimeoutError(f"waited {timeout:g} s for {self._what()} to finish: {err}") from None
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as err:
            raise self._failure_error(err) from None

    async def wait_async(self, timeout: float | None = None) -> list[R]:
        """Asyncio form of :meth:`wait`."""
        try:
            return list(await asyncio.wait_for(asyncio.gather(*self._refs), timeout=timeout))
        except TimeoutError:
            raise SchedulerTimeoutError(f"waited {timeout:g} s for {self._what()} to finish") from None
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as err:
            raise self._failure_error(err) from None

    def __await__(self) -> Generator[Any, None, list[R]]:
        return self.wait_async().__await__()

    def _failure_error(self, err: BaseException) -> WorkerFailedError:
        """Turn a Ray error into the run's failure (reporting it first if the monitor has not seen it yet)."""
        cluster = self._group._cluster
        failure = cluster.failure
        if failure is None:
            if self._group._shut_down:
                raise RuntimeError(
                    f"worker group {self._group.name!r} was shut down while running {self._what()}"
                )
            failure = _failure_from_ray_error(self._group, self._method, self._ranks, self._refs, err)
            cluster._report_failure(failure)
            failure = cluster.failure or failure
        cluster._failure_delivered()
        return WorkerFailedError(failure)


def _failure_from_ray_error(
    group: WorkerGroup, method: str, ranks: tuple[int, ...], refs: list[Any], err: BaseException
) -> WorkerFailure:
    rank = _failed_rank(group, ranks, refs, err)
    where = group.placements[rank].hardware if 0 <= rank < len(group.placements) else ""
    if isinstance(err, ray.exceptions.RayTaskError):
        return WorkerFailure(
            group_name=group.name, rank=rank, kind="raised", method=method, details=str(err), where=where
        )
    return WorkerFailure(
        group_name=group.name, rank=rank, kind="died", method=None, details=str(err), where=where
    )


def _failed_rank(group: WorkerGroup, ranks: tuple[int, ...], refs: list[Any], err: BaseException) -> int:
    actor_id = getattr(err, "actor_id", None)
    if actor_id is not None:
        for rank, handle in enumerate(group.actor_handles):
            if handle._actor_id.hex() == actor_id:
                return rank
    for rank, ref in zip(ranks, refs, strict=True):
        ready, _ = ray.wait([ref], timeout=0, fetch_local=False)
        if ready:
            try:
                ray.get(ref, timeout=0)
            except Exception:
                return rank
    return -1


def teardown_workers(handles: list[Any], *, grace_s: float) -> None:
    """Let each worker release its communication resources (at most ``grace_s``), then kill it."""
    refs = []
    for handle in handles:
        with contextlib.suppress(Exception):
            refs.append(handle._rlinf_teardown.remote())
    if refs:
        with contextlib.suppress(Exception):
            ray.wait(refs, num_returns=len(refs), timeout=grace_s, fetch_local=False)
    for handle in handles:
        _kill(handle)


def _kill(handle: Any) -> None:
    # An actor that is already dead, or Ray going down, leaves nothing to kill.
    with contextlib.suppress(Exception):
        ray.kill(handle, no_restart=True)
