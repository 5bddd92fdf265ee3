"""The ``Worker`` base class: identity, distributed environment, logging and timers of one process.

User code subclasses :class:`Worker`; ``MyWorker.create_group(...).launch(cluster, ...)`` runs one instance per
placement rank, each in its own threaded Ray actor. Point-to-point communication comes from
:class:`~rlinf_scheduler._comm.CommMixin`.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast, overload

import attrs
import ray

from ._comm import CommMixin
from ._deaths import FAULT_DIR_ENV, fault_file, record_fatal_signals
from ._errors import SchedulerTimeoutError, WorkerFailure
from ._trace import COMPUTE, WAIT, ProcessTrace, enable_tracing, record_span, take_trace, tracing_enabled

if TYPE_CHECKING:
    from ._group import GroupLauncher
    from ._placement import Placement

__all__ = ["Worker", "WorkerContext", "timed"]

_P = ParamSpec("_P")
_R = TypeVar("_R")


@attrs.frozen(kw_only=True)
class WorkerContext:
    """Everything a worker knows about its place in the run (built by ``launch``).

    Attributes:
        group_name: Name of the worker group.
        rank: Rank in the group.
        world_size: Number of workers in the group.
        namespace: Ray namespace of the run (peers are named actors ``f"{group}:{rank}"`` in it).
        placement: The worker's placement (node, local rank, accelerators).
        node_ip: IP of the worker's node.
        master_addr: IP of rank 0's node (``MASTER_ADDR``).
        env_vars: Variables set in the worker process before its ``__init__`` runs (without ``MASTER_PORT``,
            which is resolved on the worker).
    """

    group_name: str
    rank: int
    world_size: int
    namespace: str
    placement: Placement
    node_ip: str
    master_addr: str
    env_vars: Mapping[str, str]


class Worker(CommMixin):
    """Base class of user workers.

    Subclass it and give it public methods; ``MyWorker.create_group(*args, **kwargs)`` captures the constructor
    arguments and ``.launch(cluster, placement_strategy, name=...)`` starts the group. Inside a worker, before
    your ``__init__`` runs, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT`` and the visible devices (``CUDA_VISIBLE_DEVICES`` for GPUs, ``RLINF_VISIBLE_ACCELERATORS``
    always) are set, so ``torch.distributed.init_process_group()`` works without more setup.

    Methods whose name starts with ``_`` are not callable through the group. A worker runs in a threaded actor:
    several calls may run at once (e.g. a communication call while a method blocks in ``recv``), so guard
    shared state of your own accordingly. An ``async def`` method called through the group runs to completion
    in its own event loop on the calling thread; inside it, ``await self.other_async_method()`` works as in
    plain asyncio (the nested call runs on that same loop).

    Example:
        >>> class Doubler(Worker):
        ...     def double(self, x: int) -> int:
        ...         return 2 * x + self.rank
        >>> # group = Doubler.create_group().launch(cluster, NodePlacementStrategy([0, 0]), name="doubler")
        >>> # group.double(10).wait(timeout=30) == [20, 21]
    """

    _rlinf_context: WorkerContext | None = None

    @classmethod
    def create_group(cls, *args: Any, **kwargs: Any) -> GroupLauncher:
        """Capture constructor arguments for a group of this worker class; call ``.launch(...)`` on the result."""
        from ._group import GroupLauncher  # _group imports this module for the actor class

        return GroupLauncher(cls, args, kwargs)

    # ------------------------------------------------------------------------------------------ identity
    @property
    def _rlinf_ctx(self) -> WorkerContext:
        ctx = self._rlinf_context
        if ctx is None:
            raise RuntimeError(
                f"{type(self).__name__} is not running in a worker group; "
                "start it with .create_group(...).launch(cluster, ...)"
            )
        return ctx

    @property
    def rank(self) -> int:
        """Rank of this worker in its group."""
        return self._rlinf_ctx.rank

    @property
    def world_size(self) -> int:
        """Number of workers in the group."""
        return self._rlinf_ctx.world_size

    @property
    def group_name(self) -> str:
        """Name of the worker group."""
        return self._rlinf_ctx.group_name

    @property
    def namespace(self) -> str:
        """Ray namespace of the run."""
        return self._rlinf_ctx.namespace

    def group_world_size(self, group_name: str, timeout: float = 60.0) -> int:
        """Number of workers of another group of the same run (e.g. the rollout group, for a weight sync).

        The answer comes from that group's rank 0 and is cached per name.

        Args:
            group_name: the other group's name (as given to ``launch``).
            timeout: seconds to wait for rank 0's answer.

        Raises:
            ValueError: no group of that name runs in this run's namespace.
            SchedulerTimeoutError: rank 0 did not answer within ``timeout``.
        """
        sizes: dict[str, int] = self.__dict__.setdefault("_rlinf_group_sizes", {})
        if group_name not in sizes:
            if group_name == self.group_name:
                sizes[group_name] = self.world_size
            else:
                sizes[group_name] = _remote_world_size(group_name, self.namespace, timeout)
        return sizes[group_name]

    @property
    def placement(self) -> Placement:
        """Placement of this worker (node, local rank, accelerators)."""
        return self._rlinf_ctx.placement

    @property
    def node_rank(self) -> int:
        """Cluster node rank the worker runs on."""
        return self._rlinf_ctx.placement.node_rank

    @property
    def local_rank(self) -> int:
        """Rank among the group's workers on the same node."""
        return self._rlinf_ctx.placement.local_rank

    @property
    def local_world_size(self) -> int:
        """Number of the group's workers on the same node."""
        return self._rlinf_ctx.placement.local_world_size

    @property
    def node_ip(self) -> str:
        """IP address of the worker's node."""
        return self._rlinf_ctx.node_ip

    # ------------------------------------------------------------------------------------------- logging
    @property
    def _rlinf_log(self) -> logging.LoggerAdapter[logging.Logger]:
        adapter = self.__dict__.get("_rlinf_logger")
        if adapter is None:
            ctx = self._rlinf_context
            name = f"{ctx.group_name}:{ctx.rank}" if ctx is not None else type(self).__name__
            adapter = _PrefixAdapter(logging.getLogger("rlinf_scheduler.worker"), {"prefix": name})
            self.__dict__["_rlinf_logger"] = adapter
        return adapter

    def log_info(self, msg: str, *args: object) -> None:
        """Log at INFO, prefixed with ``[group:rank]``; ``%``-style ``args`` as in :mod:`logging`."""
        self._rlinf_log.info(msg, *args)

    def log_warning(self, msg: str, *args: object) -> None:
        """Log at WARNING, prefixed with ``[group:rank]``."""
        self._rlinf_log.warning(msg, *args)

    def log_error(self, msg: str, *args: object) -> None:
        """Log at ERROR, prefixed with ``[group:rank]``."""
        self._rlinf_log.error(msg, *args)

    # -------------------------------------------------------------------------------------------- timing
    def _rlinf_timing_state(self) -> tuple[threading.Lock, dict[str, float]]:
        state: tuple[threading.Lock, dict[str, float]] | None = self.__dict__.get("_rlinf_timings")
        if state is None:
            # dict.setdefault is atomic: two threads timing at once end up with the same state.
            state = self.__dict__.setdefault("_rlinf_timings", (threading.Lock(), {}))
        return state

    @contextlib.contextmanager
    def timer(self, name: str, *, wait: bool = False) -> Iterator[None]:
        """Context manager adding the wall time of its block to the timing ``name``.

        With tracing on (:meth:`set_tracing`) the block is also a span of the run's timeline, in the category
        ``wait`` when ``wait`` is true (blocked on another component) and ``compute`` otherwise.

        Example:
            >>> # with self.timer("generate"):
            >>> #     out = self.model.generate(batch)
        """
        tracing = tracing_enabled()
        start, cpu = time.perf_counter_ns(), time.process_time_ns() if tracing else 0
        try:
            yield
        finally:
            end = time.perf_counter_ns()
            if tracing:
                record_span(name, WAIT if wait else COMPUTE, start, end, time.process_time_ns() - cpu)
            lock, timings = self._rlinf_timing_state()
            with lock:
                timings[name] = timings.get(name, 0.0) + (end - start) / 1e9

    def pop_timings(self) -> dict[str, float]:
        """Return the accumulated durations in seconds by name and reset them.

        The runner collects them with ``group.pop_timings().wait()`` (one dict per rank) for ``time/*`` metrics.
        """
        lock, timings = self._rlinf_timing_state()
        with lock:
            out = dict(timings)
            timings.clear()
        return out

    def set_tracing(self, enabled: bool) -> None:
        """Turn this worker process's timeline spans on or off (see :mod:`rlinf_scheduler._trace`).

        While on, :meth:`timer` sections, blocking channel ``put``/``get`` and ``send``/``recv`` are recorded;
        the runner collects them with :meth:`pop_trace` (``runner.profile``).
        """
        enable_tracing(enabled)

    def pop_trace(self) -> ProcessTrace:
        """The spans recorded since the last call (then dropped here), labelled ``group:rank``."""
        ctx = self._rlinf_context
        return take_trace(f"{ctx.group_name}:{ctx.rank}" if ctx is not None else type(self).__name__)

    # ------------------------------------------------------------------ runtime hooks (called by the group)
    def _rlinf_setup(self, ctx: WorkerContext, master_port: int) -> None:
        """Install identity and environment; runs before the user's ``__init__``."""
        env = dict(ctx.env_vars)
        env["MASTER_PORT"] = str(master_port)
        os.environ.update(env)
        self._rlinf_context = ctx
        self.__dict__["_rlinf_failed"] = threading.Event()
        self.__dict__["_rlinf_failure"] = None
        _configure_worker_logging()
        if env.get(FAULT_DIR_ENV):
            record_fatal_signals(fault_file(env[FAULT_DIR_ENV], ctx.group_name, ctx.rank))

    def _rlinf_record_failure(self, method: str, exc: BaseException) -> None:
        ctx = self._rlinf_context
        if ctx is None:
            return
        failure = WorkerFailure(
            group_name=ctx.group_name,
            rank=ctx.rank,
            kind="raised",
            method=method,
            details="".join(traceback.format_exception(exc)),
            where=ctx.placement.hardware,
        )
        if self.__dict__.get("_rlinf_failure") is None:
            self.__dict__["_rlinf_failure"] = failure
        self.__dict__["_rlinf_failed"].set()

    def _rlinf_teardown(self) -> None:
        """Release communication resources (shared memory, pair groups) before the actor is killed."""
        self._comm_close()

    def _rlinf_world_size(self) -> int:
        """This worker's group size (answered to :meth:`group_world_size` of other groups)."""
        return self.world_size

    def _rlinf_watch(self) -> WorkerFailure:
        """Block until this worker records a failure, then return it (the driver's monitor keeps one pending)."""
        self.__dict__["_rlinf_failed"].wait()
        failure: WorkerFailure = self.__dict__["_rlinf_failure"]
        return failure


def _remote_world_size(group_name: str, namespace: str, timeout: float) -> int:
    try:
        handle = ray.get_actor(f"{group_name}:0", namespace=namespace)
    except ValueError:
        raise ValueError(
            f"no worker group {group_name!r} in this run (no Ray actor '{group_name}:0' in namespace "
            f"{namespace!r})"
        ) from None
    try:
        # Ray's typed ActorHandle resolves actor methods to Never (every call would look unreachable).
        size: int = ray.get(cast(Any, handle)._rlinf_world_size.remote(), timeout=timeout)
    except ray.exceptions.GetTimeoutError:
        raise SchedulerTimeoutError(
            f"group_world_size({group_name!r}): rank 0 of {group_name!r} did not answer within {timeout} s"
        ) from None
    return size


class _PrefixAdapter(logging.LoggerAdapter[logging.Logger]):
    def process(self, msg: Any, kwargs: Any) -> tuple[Any, Any]:
        return f"[{self.extra['prefix']}] {msg}", kwargs  # type: ignore[index]  # typeshed: extra may be None; ours always has a prefix


_logging_configured = threading.Lock()


def _configure_worker_logging() -> None:
    """Give the worker logger a stderr handler (Ray forwards worker stderr to the driver).

    Runs inside a worker process only (never at import), and only touches the ``rlinf_scheduler.worker``
    logger, not the root logger.
    """
    logger = logging.getLogger("rlinf_scheduler.worker")
    with _logging_configured:
        if logger.handlers:
            return
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False


@overload
def timed(fn: Callable[_P, _R], /) -> Callable[_P, _R]: ...
@overload
def timed(*, name: str) -> Callable[[Callable[_P, _R]], Callable[_P, _R]]: ...
def timed(
    fn: Callable[_P, _R] | None = None, /, *, name: str | None = None
) -> Callable[_P, _R] | Callable[[Callable[_P, _R]], Callable[_P, _R]]:
    """Decorate a :class:`Worker` method so each call adds its duration to the timing ``name``.

    ``name`` defaults to the method name. Use as ``@timed`` or ``@timed(name="update")``; read the totals with
    :meth:`Worker.pop_timings`.
    """

    def decorate(func: Callable[_P, _R]) -> Callable[_P, _R]:
        label = name or func.__name__

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def timed_coroutine(*args: Any, **kwargs: Any) -> Any:
                self = args[0]
                if not isinstance(self, Worker):
                    raise TypeError(
                        f"@timed decorates Worker methods; {func.__qualname__} got {type(self).__name__}"
                    )
                with self.timer(label):
                    return await func(*args, **kwargs)

            return timed_coroutine  # type: ignore[return-value]  # the wrapper keeps the wrapped coroutine signature

        @functools.wraps(func)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            self = args[0]
            if not isinstance(self, Worker):
                raise TypeError(
                    f"@timed decorates Worker methods; {func.__qualname__} got {type(self).__name__}"
                )
            with self.timer(label):
                return func(*args, **kwargs)

        return wrapper

    if fn is not None:
        return decorate(fn)
    return decorate
