"""Agent RL training: ``uv run apps/agent/train.py [--config-name NAME | --config PATH] key=value ...``.

With no argument it runs the default CPU config (``config/smollm2_tools.yaml``): SmolLM2-135M-Instruct, a
short SFT warm-up on tool-use demonstrations, then multi-turn GRPO (``grpo_dynamic``) with a calculator and
a search over the local corpus; then it prints where the checkpoint, ``metrics.jsonl`` and the curves are.
Generate the tasks first (they are committed; regenerate with ``uv run apps/agent/prepare_data.py``).
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    # Before Ray is imported: under `uv run`, Ray would otherwise make every worker re-run `uv run`.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import yaml
    from config import CONFIG_DIR, load_agent_config, run_agent
    from rlinf_core.config import ConfigError, parse_command_line, unstructure_config
    from rlinf_core.metrics import plot_run
    from rlinf_scheduler import SchedulerTimeoutError, WorkerFailedError

    try:
        cli = parse_command_line(argv, config_dir=CONFIG_DIR, default_name="smollm2_tools")
        if isinstance(cli, str):
            print(cli)
            return 0
        cfg = load_agent_config(cli.config_path, cli.overrides)
    except (ConfigError, ImportError) as e:  # ImportError: a selected backend (e.g. megatron) is missing
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cli.print_config:
        print(yaml.safe_dump(unstructure_config(cfg), sort_keys=False))
        return 0
    try:
        result = run_agent(cfg)
    except (WorkerFailedError, SchedulerTimeoutError) as e:
        print(f"error: the run failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted (a worker failed, or Ctrl-C); see the messages above", file=sys.stderr)
        return 130
    assert not isinstance(result, dict)
    curves = plot_run([result.log_path], keys=["eval/success_rate", "rollout/success_rate"])
    print(f"\nfinished {result.global_step} training steps; last evaluation: {result.last_eval}")
    print(f"metrics:     {result.metrics_file}")
    print(f"checkpoint:  {result.last_checkpoint}")
    print(f"curves:      {', '.join(str(p) for p in curves)}")
    print(f"tensorboard: tensorboard --logdir {result.log_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
