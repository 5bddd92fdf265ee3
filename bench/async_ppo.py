"""Asynchronous vs synchronous embodied PPO on CartPole, when an env step costs as much as inference.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/async_ppo.py [--ms 0.4] [--steps 30] [--cost sleep|busy]

Both runners use the real worker groups, collocated on one simulated slot (``actor,env,rollout: 0``, the default
CartPole config), with the synthetic costs of ``bench/embodied_pipeline.py``: ``--ms`` per env per step for the
simulator and the same per sample for inference.

1. Throughput: ``--steps`` training steps of ``cartpole_ppo`` (``EmbodiedRunner``) and of ``cartpole_async_ppo``
   (``AsyncEmbodiedRunner``, ``algorithm.staleness_threshold=1``), no evaluation, no checkpoints, with
   ``algorithm.update_epoch=--update-epoch``, ``actor.model.hidden_sizes=--hidden`` and
   ``actor.global_batch_size=--batch`` (256 samples a step: ``256 / batch x update_epoch`` optimizer steps),
   so that the update takes about as long as the rollout: the overlap can at best hide the shorter of the two,
   ``(rollout + update) / max(rollout, update)``, 2x when they are equal (the output reports both phases of
   the synchronous run). The figure is env steps per second of
   training wall time from the end of the first step to the end of the last (``time/train_wall_s``: rollout,
   update and weight sync, everything but evaluations).
2. Learning: ``cartpole_async_ppo`` as shipped (evaluation every 2 steps, stop at eval return 475) with the same
   costs, and ``cartpole_ppo`` likewise: training steps and training seconds to reach the target.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

from embodied_pipeline import ROOT, CostlyEnvWorker, CostlyRolloutWorker
from rlinf_runners.apps import EmbodiedApp, run_app


def _workers(ms: float, mode: str) -> dict[str, Any]:
    class _Env(CostlyEnvWorker):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, ms=ms, mode=mode, **k)

    class _Rollout(CostlyRolloutWorker):
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, ms=ms, mode=mode, **k)

    return {"env": _Env, "rollout": _Rollout}


def run(
    app: EmbodiedApp, cluster: Any, config: str, overrides: list[str], ms: float, mode: str
) -> dict[str, Any]:
    """One run of ``config``; returns its train records, last evaluation and steps."""
    records: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = app.load_config(
            app.config_dir / f"{config}.yaml",
            [
                "runner.progress_bar=false",
                "runner.logger.logger_backends=[]",
                "runner.save_interval=-1",
                f"runner.logger.log_path={tmp}",
                *overrides,
            ],
        )
        result = run_app(
            app,
            cfg,
            cluster=cluster,
            worker_classes=_workers(ms, mode),
            on_step=lambda step, rec: records.append({"step": step, **rec}),
        )
    train = [r for r in records if "train/actor/total_loss" in r]
    wall = records[-1]["time/train_wall_s"] if records else 0.0
    return {"train": train, "last_eval": result.last_eval, "steps": result.global_step, "wall_s": wall}


def throughput(train: list[dict[str, float]]) -> float:
    """Env steps per second of training wall time, from the end of the first step to the end of the last."""
    steps = sum(r["env/steps"] for r in train[1:])
    return steps / (train[-1]["time/train_wall_s"] - train[0]["time/train_wall_s"])


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cost", choices=["sleep", "busy"], default="sleep")
    parser.add_argument(
        "--ms", type=float, default=0.4, help="extra ms per env step (env) and per sample (policy)"
    )
    parser.add_argument("--steps", type=int, default=30, help="training steps of each throughput run")
    parser.add_argument(
        "--staleness", type=int, default=1, help="algorithm.staleness_threshold of the async runs"
    )
    parser.add_argument(
        "--update-epoch", type=int, default=20, help="throughput runs: algorithm.update_epoch"
    )
    parser.add_argument("--hidden", default="256,256", help="throughput runs: actor.model.hidden_sizes")
    parser.add_argument("--batch", type=int, default=32, help="throughput runs: actor.global_batch_size")
    args = parser.parse_args()
    from rlinf_scheduler import Cluster

    app = EmbodiedApp(ROOT / "apps" / "embodied")
    fixed = [
        f"runner.max_epochs={args.steps}",
        "runner.val_check_interval=-1",
        "runner.stop_eval_return=null",
        f"algorithm.update_epoch={args.update_epoch}",
        f"actor.model.hidden_sizes=[{args.hidden}]",
        f"actor.global_batch_size={args.batch}",
        f"actor.micro_batch_size={args.batch}",
    ]
    stale = [f"algorithm.staleness_threshold={args.staleness}"]
    out: dict[str, Any] = {
        "cost": args.cost,
        "ms_per_env_step_and_per_sample": args.ms,
        "staleness": args.staleness,
        "update_epoch": args.update_epoch,
        "hidden_sizes": args.hidden,
        "global_batch_size": args.batch,
    }
    with Cluster(num_nodes=1, simulated_accelerators_per_node=1, ray_address="local") as cluster:
        sync = run(app, cluster, "cartpole_ppo", fixed, args.ms, args.cost)
        asyn = run(app, cluster, "cartpole_async_ppo", [*fixed, *stale], args.ms, args.cost)
        out["sync_env_steps_per_s"] = throughput(sync["train"])
        out["async_env_steps_per_s"] = throughput(asyn["train"])
        out["ratio"] = out["async_env_steps_per_s"] / out["sync_env_steps_per_s"]
        out["async_staleness_mean"] = sum(r["staleness/mean"] for r in asyn["train"]) / len(asyn["train"])
        out["async_staleness_max"] = max(r["staleness/max"] for r in asyn["train"])
        out["async_step_s"] = sum(r["time/step_s"] for r in asyn["train"][1:]) / (len(asyn["train"]) - 1)
        out["sync_train_s_per_step"] = sum(r["time/train_s"] for r in sync["train"]) / len(sync["train"])
        out["sync_rollout_s_per_step"] = sum(r["time/rollout_s"] for r in sync["train"]) / len(sync["train"])
        for name, config, extra in (
            ("async", "cartpole_async_ppo", stale),
            ("sync", "cartpole_ppo", []),
        ):
            solve = run(app, cluster, config, extra, args.ms, args.cost)
            out[f"{name}_solve"] = {
                "eval_return": solve["last_eval"].get("eval/return_mean"),
                "training_steps": solve["steps"],
                "train_wall_s": solve["wall_s"],
            }
            sys.stderr.write(f"{name}: {out[f'{name}_solve']}\n")
    sys.stdout.write(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
