"""The command line of every app: ``main(app, argv, mode=...)`` behind ``apps/<name>/{train,eval}.py``.

``[--config-name NAME | --config PATH] [--print-config] key.sub=value ...``; the config is loaded and checked
before Ray starts. Exit codes: 0 done; 1 the run failed (a worker died, a step timed out, a checkpoint is
missing or broken); 2 bad config, arguments or data (nothing started); 130 interrupted. Training prints where
its results are (metrics, checkpoint, curves, TensorBoard); evaluation prints its metrics as JSON.

This module imports neither Ray nor the apps at import time: :func:`main` first sets
``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`` (under ``uv run``, Ray would otherwise make every worker re-run
``uv run``), which Ray reads when it is imported.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from .apps import App

__all__ = ["main"]

Mode = Literal["train", "eval"]


def _resolve(app: App[Any] | str, app_dir: str | Path | None) -> App[Any]:
    from .apps import APPS

    if not isinstance(app, str):
        return app
    if app not in APPS:
        raise ValueError(f"unknown app {app!r}; known: {', '.join(APPS)}")
    return APPS[app](app_dir)


def _error(message: object) -> None:
    print(f"error: {message}", file=sys.stderr)


def main(
    app: App[Any] | str,
    argv: Sequence[str] | None = None,
    *,
    mode: Mode = "train",
    app_dir: str | Path | None = None,
) -> int:
    """Run an app from the command line: parse, check, train or evaluate, report.

    Args:
        app: an :class:`~rlinf_runners.apps.App`, or its name (``embodied``, ``reasoning``, ``agent``).
        argv: the arguments (default: ``sys.argv[1:]``).
        mode: ``train``, or ``eval`` (one evaluation of the checkpoint ``runner.resume_dir``, default
            ``auto``: the latest under ``runner.logger.log_path``; ``none``: the configured model as it is).
        app_dir: the app's directory (its ``config/`` and data), when ``app`` is a name.

    Returns:
        The exit code: 0 done, 1 the run failed, 2 bad config / arguments / data, 130 interrupted.
    """
    if mode not in ("train", "eval"):
        raise ValueError(f"mode must be 'train' or 'eval', got {mode!r}")
    # Before Ray is imported (Ray reads it then): under `uv run`, Ray would make every worker re-run `uv run`.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import yaml
    from rlinf_core.config import ConfigError, parse_command_line, unstructure_config

    resolved = _resolve(app, app_dir)
    argv = sys.argv[1:] if argv is None else argv
    try:
        cli = parse_command_line(
            argv, config_dir=resolved.config_dir, default_name=resolved.default_config, prog=f"{mode}.py"
        )
        if isinstance(cli, str):
            print(cli)
            return 0
        overrides = list(cli.overrides)
        # eval.py runner.resume_dir=none: the policy as the config builds it (fresh, or actor.model.model_path).
        fresh = mode == "eval" and any(
            o.replace(" ", "").lower() == "runner.resume_dir=none" for o in overrides
        )
        if fresh:
            overrides = [o for o in overrides if o.replace(" ", "").lower() != "runner.resume_dir=none"]
        cfg = resolved.load_config(cli.config_path, overrides)
        if mode == "eval":
            resolved.check_evaluation(cfg)
    except (ConfigError, ImportError) as e:  # ImportError: a selected backend (e.g. megatron) is missing
        _error(e)
        return 2
    if cli.print_config:
        print(yaml.safe_dump(unstructure_config(cfg), sort_keys=False))
        return 0
    return _run(resolved, cfg, mode, fresh=fresh)


def _run(app: App[Any], cfg: Any, mode: Mode, *, fresh: bool = False) -> int:
    from rlinf_core.checkpoint import CheckpointError
    from rlinf_core.config import ConfigError
    from rlinf_core.data import DatasetError
    from rlinf_scheduler import SchedulerTimeoutError, WorkerFailedError

    from .apps import run_app

    try:
        if mode == "eval":
            metrics = run_app(app, cfg, evaluate_only="none" if fresh else cfg.runner.resume_dir or "auto")
            print(json.dumps(metrics, indent=2))
            return 0
        result = run_app(app, cfg)
    except (ConfigError, DatasetError) as e:  # checked against the launched groups, or a bad data row
        _error(e)
        return 2
    except (WorkerFailedError, SchedulerTimeoutError, CheckpointError) as e:
        _error(f"the run failed: {e}")
        return 1
    except KeyboardInterrupt:
        _error("interrupted (a worker failed, or Ctrl-C); see the messages above")
        return 130
    _report(app, result)
    return 0


def _report(app: App[Any], result: Any) -> None:
    from rlinf_core.metrics import plot_run

    try:
        curves = [str(p) for p in plot_run([result.log_path], keys=list(app.curve_keys))]
    except ImportError as e:  # matplotlib is an extra
        curves = [f"(none: {e})"]
    print(f"\nfinished {result.global_step} training steps; last evaluation: {result.last_eval}")
    print(f"metrics:     {result.metrics_file}")
    print(f"checkpoint:  {result.last_checkpoint}")
    print(f"curves:      {', '.join(curves)}")
    print(f"tensorboard: tensorboard --logdir {result.log_path}")
    trace = result.trace_file
    if trace is not None:
        busy = ", ".join(f"{g} {100 * f:.0f}%" for g, f in result.busy.items())
        print(f"trace:       {trace} (open in https://ui.perfetto.dev); busy per step: {busy}")
