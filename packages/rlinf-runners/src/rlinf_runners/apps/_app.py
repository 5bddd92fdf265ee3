"""``App``: what every application provides (root config, checks, group launch, runner), and ``run_app``.

An app composes the configs each package owns into one root config class, adds the checks that span several
sections (each invariant once: what a package's own config class or function already checks is not repeated
here), launches its worker groups and builds its runner. :func:`run_app` owns the cluster's lifecycle.
"""

from __future__ import annotations

import abc
import contextlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, Literal, Protocol, TypeVar, overload

from rlinf_core.checkpoint import CheckpointError, resolve_resume_dir
from rlinf_core.config import ConfigError, load_config, unstructure_config
from rlinf_scheduler import Cluster, ClusterConfig, Worker

from .._base import RunResult
from .._config import RunnerConfig

__all__ = ["App", "AppRunner", "OnStep", "WorkerClasses", "run_app"]

OnStep = Callable[[int, dict[str, float]], None]
"""Called by the runner after each training step with the step and its metrics record."""

WorkerClasses = Mapping[str, type[Worker]]
"""Replacement worker classes by component name (tests and benchmarks use subclasses)."""


class AppRunner(Protocol):
    """What :func:`run_app` needs of a runner."""

    def run(self) -> RunResult: ...

    def sync_weights(self) -> None: ...

    def evaluate(self) -> dict[str, float]: ...

    def evaluate_checkpoint(self, path: str | Path) -> dict[str, float]: ...


class _RootConfig(Protocol):
    @property
    def cluster(self) -> ClusterConfig: ...

    @property
    def runner(self) -> RunnerConfig: ...


C = TypeVar("C", bound=_RootConfig)


class App(abc.ABC, Generic[C]):
    """One application: its root config class, its checks, the launch of its groups and its runner.

    Args:
        app_dir: the application's directory (``apps/<name>``): ``config/`` holds its YAML files, and
            relative data paths that do not exist as given are looked up here. Default: the current directory.
    """

    name: ClassVar[str]
    """The app's name, as ``rlinf_runners.cli.main`` accepts it."""
    config_cls: type[C]
    """The root config class (one attribute per section)."""
    default_config: ClassVar[str]
    """The config of ``config/`` used when the command line names none."""
    components: ClassVar[tuple[str, ...]]
    """The components every placement must place."""
    curve_keys: ClassVar[tuple[str, ...]]
    """The metrics drawn as learning curves at the end of a training run."""
    checkpoint_keys: ClassVar[tuple[str, ...]] = ()
    """Dotted config paths that fix the shapes of what a checkpoint holds: a resume or an evaluation of a
    checkpoint saved with other values is refused before Ray starts (see :meth:`check_checkpoint`)."""
    checkpoint_ignored_keys: ClassVar[tuple[str, ...]] = ()
    """Dotted paths inside :attr:`checkpoint_keys` that do not fix shapes (e.g. where a fresh run's initial
    weights came from): left out of the comparison."""

    def __init__(self, app_dir: str | Path | None = None) -> None:
        self.app_dir = Path.cwd() if app_dir is None else Path(app_dir).resolve()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.app_dir)!r})"

    @property
    def config_dir(self) -> Path:
        """The directory of the app's YAML configs (``<app_dir>/config``)."""
        return self.app_dir / "config"

    def resolve_data_path(self, path: str) -> Path:
        """A data path as given (absolute, or relative to the working directory) when it exists there.

        Otherwise relative to the app directory, where the shipped configs' ``data/...`` paths point.
        """
        p = Path(path).expanduser()
        if p.is_absolute() or p.exists():
            return p
        in_app = self.app_dir / p
        return in_app if in_app.exists() else p

    def load_config(self, path: str | Path | None, overrides: Sequence[str] = ()) -> C:
        """Load a YAML file plus overrides into a checked root config (no Ray started).

        Raises:
            ConfigError: listing every problem with its dotted path.
        """
        cfg = load_config(self.config_cls, path, overrides)
        self.check(cfg)
        try:  # an explicit checkpoint that is not there is a config error, found before Ray starts
            resume = resolve_resume_dir(cfg.runner.resume_dir, cfg.runner.logger.log_path)
        except (ValueError, CheckpointError) as e:
            raise ConfigError([str(e)], "runner.resume_dir") from None
        if resume is not None:
            self.check_checkpoint(cfg, resume)
        return cfg

    def check_checkpoint(self, cfg: C, checkpoint: Path) -> None:
        """Refuse a checkpoint saved with other :attr:`checkpoint_keys` values than ``cfg`` has.

        Checkpoints hold their run's config in ``meta.json``; one without it (older) is not checked.

        Raises:
            ConfigError: naming each differing key with the checkpoint's value and the config's.
        """
        try:
            saved = json.loads((checkpoint / "meta.json").read_text()).get("config")
        except (OSError, ValueError):
            return
        if not isinstance(saved, Mapping):
            return
        given = unstructure_config(cfg)
        try:
            defaults: Mapping[str, Any] = unstructure_config(type(cfg)())
        except (TypeError, ValueError):
            defaults = {}
        problems = []
        for key in self.checkpoint_keys:
            old, new = (
                _lookup(saved, key, self.checkpoint_ignored_keys),
                _lookup(given, key, self.checkpoint_ignored_keys),
            )
            if old is not _MISSING:
                new = _without_later_defaults(old, new, _lookup(defaults, key))
            if old is not _MISSING and old != new:
                problems.append(
                    f"{key}: the checkpoint {checkpoint} was saved with {old!r}, this config has {new!r}; "
                    "its weights do not fit (use the checkpoint's value, or start a new run in another "
                    "runner.logger.log_path)"
                )
        if problems:
            raise ConfigError(problems, "runner.resume_dir")

    def extra_components(self, cfg: C) -> tuple[str, ...]:
        """Components ``cfg`` needs placed besides :attr:`components` (none by default).

        E.g. the agent app's ``retriever`` when its search runs as a service.
        """
        return ()

    def placed_components(self, cfg: C) -> set[str]:
        """The components ``cluster.component_placement`` names.

        Raises:
            ValueError: when one of :attr:`components` (or :meth:`extra_components`) is left out, or a name is
                not a component of the app.
        """
        required = (*self.components, *self.extra_components(cfg))
        placed = {c.strip() for key in cfg.cluster.component_placement for c in key.split(",")}
        unknown = sorted(placed - set(required))
        if unknown:
            raise ValueError(
                f"cluster.component_placement: unknown component(s) {unknown}; the {self.name} app places "
                f"{', '.join(required)}"
            )
        missing = [c for c in required if c not in placed]
        if missing:
            raise ValueError(
                f"cluster.component_placement: no placement for {missing}; it places {sorted(placed)} "
                f"(e.g. '{','.join(required)}: 0' for collocated)"
            )
        return placed

    @abc.abstractmethod
    def world_sizes(self, cfg: C, cluster: Cluster | None = None) -> dict[str, int] | None:
        """Processes per component: from ``cluster``, or on paper for simulated slots (else ``None``).

        Raises:
            ValueError: for an invalid placement, or one that leaves out a component.
        """

    @abc.abstractmethod
    def check(self, cfg: C, world_sizes: Mapping[str, int] | None = None) -> None:
        """The checks that span sections; with ``world_sizes`` also those that depend on the placement.

        Raises:
            ConfigError: listing every problem with its dotted path.
        """

    def check_evaluation(self, cfg: C) -> None:
        """What a standalone evaluation needs beyond :meth:`check` (nothing by default).

        Raises:
            ConfigError: naming what is missing.
        """

    def prepare_process_env(self, cfg: C) -> None:
        """Set what the worker processes need in their environment; runs before the cluster starts."""

    def preload(self, cfg: C) -> None:
        """Import what :meth:`launch` will need (the worker classes' modules: torch, simulators).

        :func:`run_app` calls it in a thread while the cluster starts, which is mostly waiting on Ray's own
        processes, so the imports cost the driver no time of its own. An error here is ignored: :meth:`launch`
        imports the same modules again and reports it.
        """

    @abc.abstractmethod
    def launch(
        self, cfg: C, cluster: Cluster, *, worker_classes: WorkerClasses | None = None
    ) -> dict[str, Any]:
        """Place and launch the worker groups and wait until they are ready.

        Returns:
            The groups by component name.
        """

    @abc.abstractmethod
    def build_runner(
        self, cfg: C, cluster: Cluster, groups: Mapping[str, Any], *, on_step: OnStep | None = None
    ) -> AppRunner:
        """The runner of ``cfg`` over the groups :meth:`launch` started on ``cluster``."""


_MISSING = object()


def _lookup(tree: Mapping[str, Any], dotted: str, ignored: Sequence[str] = ()) -> Any:
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    # JSON has no tuples: compare sequences as lists
    value = json.loads(json.dumps(node, default=str))
    for path in ignored:
        if path.startswith(f"{dotted}."):
            *parents, last = path.removeprefix(f"{dotted}.").split(".")
            inner = value
            for part in parents:
                inner = inner.get(part) if isinstance(inner, dict) else None
            if isinstance(inner, dict):
                inner.pop(last, None)
    return value


def _without_later_defaults(old: Any, new: Any, default: Any) -> Any:
    """``new`` without the mapping entries ``old`` lacks that hold their default value.

    A field added to a config after a checkpoint was saved is absent from the checkpoint's config; at its default
    it behaves as the code did before the field existed, so it does not make the checkpoint incompatible.
    """
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out = {}
    for name, value in new.items():
        fallback = default.get(name, _MISSING) if isinstance(default, dict) else _MISSING
        if name not in old:
            if value == fallback:
                continue
            out[name] = value
        else:
            out[name] = _without_later_defaults(old[name], value, fallback)
    return out


def _preload(app: App[C], cfg: C) -> None:
    with contextlib.suppress(Exception):  # launch() imports the same modules and raises with its context
        app.preload(cfg)


def resolve_checkpoint(checkpoint: str, log_path: str | Path) -> Path:
    """The checkpoint directory of ``checkpoint`` (a ``global_step_<N>`` directory, or ``auto``).

    Raises:
        CheckpointError: when it does not exist, is incomplete, or ``auto`` finds none.
    """
    resolved = resolve_resume_dir(checkpoint, log_path)
    if resolved is None:
        raise CheckpointError(
            f"runner.resume_dir: no complete checkpoint under {Path(log_path) / 'checkpoints'} "
            f"(asked for {checkpoint!r}); train first, or name a global_step_<N> directory"
        )
    return resolved


@overload
def run_app(
    app: App[C],
    cfg: C,
    *,
    cluster: Cluster | None = ...,
    worker_classes: WorkerClasses | None = ...,
    on_step: OnStep | None = ...,
    evaluate_only: None = ...,
) -> RunResult: ...


@overload
def run_app(
    app: App[C],
    cfg: C,
    *,
    cluster: Cluster | None = ...,
    worker_classes: WorkerClasses | None = ...,
    on_step: OnStep | None = ...,
    evaluate_only: str,
) -> dict[str, float]: ...


def run_app(
    app: App[C],
    cfg: C,
    *,
    cluster: Cluster | None = None,
    worker_classes: WorkerClasses | None = None,
    on_step: OnStep | None = None,
    evaluate_only: str | None = None,
) -> RunResult | dict[str, float]:
    """Start (or use) a cluster, launch the app's groups and train; or evaluate one checkpoint.

    Args:
        app: the application.
        cfg: its checked root config (:meth:`App.load_config`).
        cluster: a running cluster to use; by default one is started from ``cfg.cluster`` and shut down at
            the end. On a given cluster the launched groups are shut down at the end instead (unless a
            worker failed: then the cluster is being torn down).
        worker_classes: replacement worker classes by component.
        on_step: called after each training step.
        evaluate_only: evaluate this checkpoint (a ``global_step_<N>`` directory or ``auto``; ``none``: the
            model as configured, no checkpoint) instead of training.

    Returns:
        The :class:`RunResult` of the training, or the ``eval/*`` metrics of the evaluation.

    Raises:
        CheckpointError: before any cluster starts, when ``runner.resume_dir`` or ``evaluate_only`` names a
            checkpoint that is not there.
    """
    log_path = cfg.runner.logger.log_path
    checkpoint: Path | Literal["none"] | None = None
    if evaluate_only is not None:
        checkpoint = (
            "none" if evaluate_only.lower() == "none" else resolve_checkpoint(evaluate_only, log_path)
        )
        if checkpoint != "none":
            app.check_checkpoint(cfg, checkpoint)
    else:
        resolve_resume_dir(cfg.runner.resume_dir, log_path)  # a bad explicit path fails before Ray starts
    app.prepare_process_env(cfg)
    own = cluster is None
    preload = threading.Thread(target=_preload, args=(app, cfg), name="rlinf-preload", daemon=True)
    preload.start()
    try:
        cluster = Cluster(cfg.cluster) if cluster is None else cluster
    finally:
        preload.join()
    groups: dict[str, Any] = {}
    try:
        groups = app.launch(cfg, cluster, worker_classes=worker_classes)
        runner = app.build_runner(cfg, cluster, groups, on_step=on_step)
        if checkpoint == "none":
            runner.sync_weights()  # the rollout evaluates the actor's weights (e.g. actor.model.model_path)
            return runner.evaluate()
        if checkpoint is not None:
            return runner.evaluate_checkpoint(checkpoint)
        return runner.run()
    finally:
        if own:
            cluster.shutdown()
        elif cluster.failure is None:
            for group in groups.values():
                group.shutdown()
