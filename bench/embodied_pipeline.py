"""Pipelined rollout: hybrid placement with 2 pipeline stages vs collocated sequential execution, env-steps/s.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python bench/embodied_pipeline.py [--cost sleep|busy] [--ms 0.5]

The env and the policy get the same synthetic cost per env step (``--ms`` per env per step for the simulator,
the same per sample for inference), on top of CartPole and the real MLP policy, so that env step cost ≈
inference cost. Both runs use the real worker groups and the default app:

- collocated sequential: ``actor,env,rollout: 0``, ``rollout.pipeline_stage_num=1`` (env and rollout take turns);
- hybrid, 2 stages: ``actor: 0-1, env: 0, rollout: 1``, ``rollout.pipeline_stage_num=2`` (simulating one stage
  overlaps inference of the other).

The figure is ``rollout/env_steps_per_s`` (env steps of a rollout / its wall time), median over the training
steps after the first. ``--cost sleep`` models a simulator/accelerator that does not compete for these CPUs;
``--cost busy`` spins the CPU (needs two idle cores to overlap).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

from rlinf_envs import EnvWorker  # noqa: E402
from rlinf_rollout import EmbodiedRolloutWorker  # noqa: E402
from rlinf_runners.apps import EmbodiedApp, run_app  # noqa: E402


def _spend(seconds: float, mode: str) -> None:
    if mode == "sleep":
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class CostlyEnvWorker(EnvWorker):
    """EnvWorker whose simulators cost ``ms`` per env step more."""

    def __init__(self, *args: Any, ms: float = 0.5, mode: str = "sleep", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for stage in self._train:
            env = stage.env
            step = env.chunk_step

            def chunk_step(actions: Any, _step: Any = step, _n: int = env.num_envs) -> Any:
                _spend(_n * actions.shape[1] * ms / 1000, mode)
                return _step(actions)

            env.chunk_step = chunk_step  # type: ignore[method-assign]


class CostlyRolloutWorker(EmbodiedRolloutWorker):
    """EmbodiedRolloutWorker whose inference costs ``ms`` per sample more."""

    def __init__(self, *args: Any, ms: float = 0.5, mode: str = "sleep", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._ms, self._mode = ms, mode

    def _infer(self, msgs: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
        _spend(sum(len(m["obs"]) for m in msgs) * self._ms / 1000, self._mode)
        return super()._infer(msgs, mode)


def measure(
    app: Any, cluster: Any, name: str, overrides: list[str], ms: float, mode: str, steps: int
) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = app.load_config(
            app.config_dir / "cartpole_ppo.yaml",
            [
                f"runner.max_epochs={steps}",
                "runner.val_check_interval=-1",
                "runner.save_interval=-1",
                "runner.progress_bar=false",
                "runner.logger.logger_backends=[]",
                f"runner.logger.log_path={tmp}",
                "cluster.simulated_accelerators_per_node=2",
                "env.train.total_num_envs=32",
                "env.train.max_steps_per_rollout_epoch=32",
                "algorithm.update_epoch=1",
                "actor.global_batch_size=1024",
                "actor.micro_batch_size=512",
                *overrides,
            ],
        )
        rates: list[float] = []

        class _Env(CostlyEnvWorker):
            def __init__(self, *a: Any, **k: Any) -> None:
                super().__init__(*a, ms=ms, mode=mode, **k)

        class _Rollout(CostlyRolloutWorker):
            def __init__(self, *a: Any, **k: Any) -> None:
                super().__init__(*a, ms=ms, mode=mode, **k)

        run_app(
            app,
            cfg,
            cluster=cluster,
            worker_classes={"env": _Env, "rollout": _Rollout},
            on_step=lambda step, rec: rates.append(rec["rollout/env_steps_per_s"]),
        )
    rate = statistics.median(rates[1:])
    sys.stderr.write(f"{name}: {[round(r) for r in rates]} -> median {rate:.0f} env-steps/s\n")
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cost", choices=["sleep", "busy"], default="sleep")
    parser.add_argument(
        "--ms", type=float, default=0.5, help="extra ms per env step (env) and per sample (policy)"
    )
    parser.add_argument("--steps", type=int, default=6, help="training steps per configuration")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    from rlinf_scheduler import Cluster

    app = EmbodiedApp(ROOT / "apps" / "embodied")
    results: dict[str, list[float]] = {"collocated": [], "hybrid": []}
    with Cluster(num_nodes=1, simulated_accelerators_per_node=2, ray_address="local") as cluster:
        for _ in range(args.repeats):
            results["collocated"].append(
                measure(
                    app,
                    cluster,
                    "collocated, 1 stage",
                    ['cluster.component_placement={"actor,env,rollout": 0}', "rollout.pipeline_stage_num=1"],
                    args.ms,
                    args.cost,
                    args.steps,
                )
            )
            results["hybrid"].append(
                measure(
                    app,
                    cluster,
                    "hybrid, 2 stages",
                    [
                        "cluster.component_placement={actor: 0-1, env: 0, rollout: 1}",
                        "rollout.pipeline_stage_num=2",
                    ],
                    args.ms,
                    args.cost,
                    args.steps,
                )
            )
    col = statistics.median(results["collocated"])
    hyb = statistics.median(results["hybrid"])
    summary = {
        "cost": args.cost,
        "ms_per_env_step_and_per_sample": args.ms,
        "collocated_env_steps_per_s": col,
        "hybrid_2_stages_env_steps_per_s": hyb,
        "ratio": hyb / col,
        "target": 1.6,
    }
    sys.stdout.write(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
