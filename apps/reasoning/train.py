"""Reasoning RL training: ``uv run apps/reasoning/train.py [--config-name NAME | --config PATH] key=value ...``.

With no argument it runs the default CPU config (``config/grpo_smollm2_cpu.yaml``): SmolLM2-135M-Instruct,
a short SFT warm-up on worked chain-sum solutions, then GRPO with the math verifier as reward, evaluating the
greedy accuracy on held-out problems; prints where the checkpoint, ``metrics.jsonl`` and the curves are.
"""

from __future__ import annotations

import os
import sys

CURVE_KEYS = [
    "eval/accuracy",
    "rollout/accuracy",
    "rollout/reward_mean",
    "rollout/response_len_mean",
    "sft/loss",
]


def main(argv: list[str]) -> int:
    # Before Ray is imported: under `uv run`, Ray would otherwise make every worker re-run `uv run`.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import yaml
    from config import CONFIG_DIR, load_reasoning_config, run_reasoning
    from rlinf_core.config import ConfigError, parse_command_line, unstructure_config
    from rlinf_core.data import DatasetError
    from rlinf_core.metrics import plot_run
    from rlinf_scheduler import SchedulerTimeoutError, WorkerFailedError

    try:
        cli = parse_command_line(argv, config_dir=CONFIG_DIR, default_name="grpo_smollm2_cpu")
        if isinstance(cli, str):
            print(cli)
            return 0
        cfg = load_reasoning_config(cli.config_path, cli.overrides)
    except (ConfigError, ImportError) as e:  # ImportError: a selected backend (e.g. megatron) is missing
        print(f"error: {e}", file=sys.stderr)
        return 2
    if cli.print_config:
        print(yaml.safe_dump(unstructure_config(cfg), sort_keys=False))
        return 0
    try:
        result = run_reasoning(cfg)
    except (DatasetError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (WorkerFailedError, SchedulerTimeoutError) as e:
        print(f"error: the run failed: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted (a worker failed, or Ctrl-C); see the messages above", file=sys.stderr)
        return 130
    assert not isinstance(result, dict)
    try:
        curves = plot_run([result.log_path], keys=CURVE_KEYS)
    except ImportError as e:  # matplotlib is an extra
        curves = []
        print(f"(no curves: {e})", file=sys.stderr)
    print(f"\nfinished {result.global_step} training steps; last evaluation: {result.last_eval}")
    print(f"metrics:     {result.metrics_file}")
    print(f"checkpoint:  {result.last_checkpoint}")
    print(f"curves:      {', '.join(str(p) for p in curves)}")
    print(f"tensorboard: tensorboard --logdir {result.log_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
