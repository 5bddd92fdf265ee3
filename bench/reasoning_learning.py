"""Held-out accuracy after the SFT warm-up vs after GRPO: the default reasoning app, end to end.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/reasoning_learning.py [--out DIR] [key=value ...]

Runs ``apps/reasoning/train.py`` with its default config (``grpo_smollm2_cpu``: SmolLM2-135M-Instruct, a short
SFT warm-up on worked chain-sum solutions, then GRPO with the math-verifier reward) in a subprocess, then reads
its ``metrics.jsonl``: the greedy accuracy on the held-out problems at step 0 (the SFT model, before any RL
update), at every evaluation, and at the end (after GRPO). ``sft.eval_before=true`` is added so the base
model's accuracy is recorded too. Extra ``key=value`` arguments are passed to train.py as overrides.
Writes ``<out>/reasoning_learning.json`` and the accuracy curve PNG; prints the summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def summarize(records: list[dict[str, float]]) -> dict[str, object]:
    """Accuracy figures of one run's metrics records."""
    evals = [r for r in records if "eval/accuracy" in r]
    pre = [r for r in records if "eval_pre_sft/accuracy" in r]
    train = [r for r in records if "rollout/accuracy" in r]
    if not evals:
        raise RuntimeError("the run logged no eval/accuracy record")
    after_sft, after_rl = evals[0], evals[-1]
    return {
        "accuracy_base": pre[0]["eval_pre_sft/accuracy"] if pre else None,
        "accuracy_after_sft": after_sft["eval/accuracy"],
        "accuracy_after_grpo": after_rl["eval/accuracy"],
        "gain_points": 100.0 * (after_rl["eval/accuracy"] - after_sft["eval/accuracy"]),
        "best_accuracy": max(r["eval/accuracy"] for r in evals),
        "eval_curve": [(int(r["step"]), r["eval/accuracy"]) for r in evals],
        "rollout_accuracy_curve": [(int(r["step"]), round(r["rollout/accuracy"], 4)) for r in train],
        "eval_samples": int(after_sft["eval/num_samples"]),
        "rl_steps": int(after_rl["step"]),
        "train_wall_s": max((r.get("time/train_wall_s", 0.0) for r in records), default=0.0),
        "mean_step_s": (sum(r["time/step_s"] for r in train) / len(train)) if train else None,
        "sft_final_loss": next((r["sft/loss"] for r in reversed(records) if "sft/loss" in r), None),
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "bench" / "reasoning_learning")
    parser.add_argument("--config-name", default="grpo_smollm2_cpu")
    parser.add_argument("--timeout", type=float, default=4 * 3600.0, help="seconds before the run is killed")
    args, overrides = parser.parse_known_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    metrics = args.out / "metrics.jsonl"
    if metrics.exists():
        metrics.unlink()  # a fresh run: the figures must come from this one
    command = [
        sys.executable,
        str(ROOT / "apps" / "reasoning" / "train.py"),
        "--config-name",
        args.config_name,
        f"runner.logger.log_path={args.out}",
        "runner.logger.logger_backends=[tensorboard]",
        "sft.eval_before=true",
        *overrides,
    ]
    start = time.perf_counter()
    proc = subprocess.run(command, timeout=args.timeout, check=False)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        print(f"error: train.py exited with {proc.returncode}", file=sys.stderr)
        return proc.returncode
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    summary = summarize(records)
    summary.update(
        {
            "command": " ".join(["uv run python bench/reasoning_learning.py", *argv]),
            "config": args.config_name,
            "overrides": overrides,
            "process_wall_s": wall,
            "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}, python {platform.python_version()}",
        }
    )
    (args.out / "reasoning_learning.json").write_text(json.dumps(summary, indent=2))
    try:
        from rlinf_core.metrics import plot_run

        plot_run([args.out], keys=["eval/accuracy", "rollout/accuracy", "rollout/response_len_mean"])
    except ImportError:
        pass
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
