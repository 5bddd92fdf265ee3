"""Evaluate a checkpoint: ``uv run apps/reasoning/eval.py [--config-name NAME] runner.resume_dir=PATH|auto``.

Launches the same worker groups as training, loads the checkpoint (``runner.resume_dir``: a
``global_step_<N>`` directory, or ``auto`` for the latest one under ``runner.logger.log_path``), syncs it to the
rollout and answers the held-out prompts (``data.eval_path``) greedily; prints the ``eval/*`` metrics (accuracy)
as JSON. ``runner.resume_dir=none`` evaluates the model of ``actor.model.model_path`` as it is.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before Ray is imported (see train.py)
    from config import CONFIG_DIR, build_runner, launch_groups, load_reasoning_config
    from rlinf_core.config import ConfigError, parse_command_line
    from rlinf_core.data import DatasetError
    from rlinf_scheduler import Cluster, SchedulerTimeoutError, WorkerFailedError

    try:
        cli = parse_command_line(argv, config_dir=CONFIG_DIR, default_name="grpo_smollm2_cpu", prog="eval.py")
        if isinstance(cli, str):
            print(cli)
            return 0
        cfg = load_reasoning_config(cli.config_path, cli.overrides)
    except (ConfigError, ImportError) as e:  # ImportError: a selected backend (e.g. megatron) is missing
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not cfg.data.eval_path:
        print("error: data.eval_path is not set: nothing to evaluate on", file=sys.stderr)
        return 2
    checkpoint = cfg.runner.resume_dir or "auto"
    cluster = Cluster(cfg.cluster)
    try:
        runner = build_runner(cfg, launch_groups(cfg, cluster))
        if checkpoint.lower() == "none":
            metrics = runner.evaluate()
        else:
            metrics = runner.evaluate_checkpoint(checkpoint)
    except (WorkerFailedError, SchedulerTimeoutError, DatasetError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        cluster.shutdown()
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
