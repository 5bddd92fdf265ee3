"""Evaluate a checkpoint: ``uv run apps/agent/eval.py [--config-name NAME] runner.resume_dir=PATH|auto``.

Launches the same worker groups as training, loads the checkpoint (``runner.resume_dir``: a
``global_step_<N>`` directory, or ``auto`` for the latest one under ``runner.logger.log_path``) and runs the
held-out tasks greedily with the tools; prints the ``eval/*`` metrics (success rate, tool use) as JSON.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # before Ray is imported (see train.py)
    from config import CONFIG_DIR, load_agent_config, run_agent
    from rlinf_core.config import ConfigError, parse_command_line
    from rlinf_scheduler import SchedulerTimeoutError, WorkerFailedError

    try:
        cli = parse_command_line(argv, config_dir=CONFIG_DIR, default_name="smollm2_tools", prog="eval.py")
        if isinstance(cli, str):
            print(cli)
            return 0
        cfg = load_agent_config(cli.config_path, cli.overrides)
    except (ConfigError, ImportError) as e:  # ImportError: a selected backend (e.g. megatron) is missing
        print(f"error: {e}", file=sys.stderr)
        return 2
    checkpoint = cfg.runner.resume_dir or "auto"
    try:
        metrics = run_agent(cfg, evaluate_only=checkpoint)
    except (WorkerFailedError, SchedulerTimeoutError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(json.dumps(metrics, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
