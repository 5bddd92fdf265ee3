"""Agent learning benchmark: success rate of the tool-using agent after SFT vs after multi-turn RL.

``uv run bench/agent_learning.py [--config-name NAME] [key=value ...]`` runs ``apps/agent/train.py``'s pipeline
(default config ``smollm2_tools``: SmolLM2-135M-Instruct on CPU, SFT warm-up on tool-use demonstrations, then
``grpo_dynamic`` RL) and reports the held-out success rate before SFT (when ``sft.eval_before``), right after
SFT (the evaluation at RL step 0), and after the last RL step, with the curve and the wall time. The summary is
written to ``<log_path>/agent_learning.json``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    from rlinf_core.config import parse_command_line
    from rlinf_core.metrics import plot_run, read_metrics
    from rlinf_runners.apps import AgentApp, run_app

    app = AgentApp(ROOT / "apps" / "agent")
    cli = parse_command_line(
        argv, config_dir=app.config_dir, default_name=app.default_config, prog="agent_learning.py"
    )
    if isinstance(cli, str):
        print(cli)
        return 0
    cfg = app.load_config(cli.config_path, cli.overrides)
    start = time.perf_counter()
    result = run_app(app, cfg)
    wall = time.perf_counter() - start
    records = read_metrics(result.metrics_file)
    evals = [(int(r["step"]), r) for r in records if "eval/success_rate" in r]
    pre = [r for r in records if "eval_pre_sft/success_rate" in r]
    if not evals:
        print("error: the run logged no evaluation (runner.val_check_interval <= 0?)", file=sys.stderr)
        return 1
    after_sft, after_rl = evals[0][1], evals[-1][1]
    keys = ("success_rate", "success_rate_calc", "success_rate_search", "used_tool_frac", "tool_error_rate")
    summary = {
        "config": str(cli.config_path),
        "overrides": list(cli.overrides),
        "model": cfg.actor.model.model_path,
        "rl_steps": result.global_step,
        "sft_steps": cfg.sft.steps,
        "eval_tasks": int(after_sft["eval/num_episodes"]),
        "episodes_per_step": cfg.data.rollout_batch_size * cfg.algorithm.group_size,
        "wall_s": round(wall, 1),
        "before_sft": {k: pre[0].get(f"eval_pre_sft/{k}") for k in keys} if pre else None,
        "after_sft": {k: after_sft.get(f"eval/{k}") for k in keys},
        "after_rl": {k: after_rl.get(f"eval/{k}") for k in keys},
        "curve": [(step, r["eval/success_rate"]) for step, r in evals],
        "rollout_success": [
            (int(r["step"]), r["rollout/success_rate"]) for r in records if "rollout/success_rate" in r
        ],
    }
    summary["gain_points"] = round(100 * (after_rl["eval/success_rate"] - after_sft["eval/success_rate"]), 1)
    out = result.log_path / "agent_learning.json"
    out.write_text(json.dumps(summary, indent=2))
    plots = plot_run([result.log_path], keys=["eval/success_rate", "rollout/success_rate"])
    print(json.dumps(summary, indent=2))
    print(f"summary: {out}\nplots: {', '.join(str(p) for p in plots)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
