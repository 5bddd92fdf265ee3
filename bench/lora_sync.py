"""Bytes and time of one actor → rollout weight sync of a LoRA VLA: ``lora_sync: merged`` vs ``adapters``.

Run: RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 flock /tmp/bench.lock uv run python bench/lora_sync.py
     [--part all|run|count] [--run-size tiny|published] [--models ...] [--reps 10]

One JSON line per case:

- ``run`` (an actual sync): random checkpoints of π0, π0.5, SmolVLA and OpenVLA (``--run-size tiny``: the
  LIBERO-shaped tiny test checkpoints of ``rlinf_models.*.testing``, LoRA rank 4 as in the e2e tests;
  ``published``: SmolVLA at ``lerobot/smolvla_base``'s size, rank 32). In one local Ray instance an actor
  worker and a rollout worker build the policies as the embodied workers do (``build_policy`` /
  ``build_inference_policy``, the rollout one per mode), then ``--reps`` rounds each run a ``merged`` and an
  ``adapters`` sync on the workers' path: the actor takes ``full_model_state_dict`` (the trainable entries
  only for ``adapters``) and ``rollout_state_dict``, then ``send_weights`` (the scheduler's broadcast); the
  rollout ``receive_weights`` and ``load_rollout_weights``, then acks. ``sync_ms``: from before the actor's
  state dict to the end of the rollout's load (one machine: ``perf_counter`` is one clock for both processes);
  ``prepare_ms`` / ``load_ms``: the actor's and the rollout's parts; medians over the rounds after the first.
- ``count`` (counted, not run): the four models at their published sizes built on the ``meta`` device
  (π0/π0.5: ``Pi0Config()``, PaliGemma 2B + the Gemma 300M expert; SmolVLA: ``lerobot/smolvla_base``'s fields;
  OpenVLA: ``OpenVLAConfig()`` = openvla-7b with RLinf's value head), LoRA rank 32 on the default target
  modules (``libero_spatial_ppo_openvla.yaml``'s rank, ``actor.model.lora_rank``'s default), and the tensors
  ``rollout_state_dict`` sends per mode, in the models' float32 (bfloat16 halves both).
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

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

import attrs
import torch
from rlinf_core.protocols import receive_weights, send_weights
from rlinf_models._fsdp import full_model_state_dict
from rlinf_models.policies import (
    PolicyConfig,
    build_inference_policy,
    build_policy,
    load_rollout_weights,
    rollout_state_dict,
    trainable_names,
)
from rlinf_models.vla.testing import libero_spec
from rlinf_scheduler import Cluster, NodePlacementStrategy, Worker

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "rlinf-models" / "tests"))

KINDS = ("pi0", "pi05", "smolvla", "openvla")
MODES = ("merged", "adapters")
SPEC = libero_spec(32)


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def run_config(kind: str, root: Path, size: str) -> PolicyConfig:
    """``actor.model`` of a random checkpoint of ``kind`` written under ``root``.

    ``tiny``: the tiny test checkpoints, LoRA rank 4. ``published`` (SmolVLA only): ``lerobot/smolvla_base``'s
    architecture with random weights (written by the same helper), LoRA rank 32.
    """
    rank = 4 if size == "tiny" else 32
    lora = {"is_lora": True, "lora_rank": rank, "lora_alpha": 2.0 * rank, "lora_sync": "adapters"}
    if kind == "openvla" and size == "tiny":
        from rlinf_models.openvla.testing import make_tiny_openvla

        path = make_tiny_openvla(root / kind, value_head_sizes=(16,))
        return PolicyConfig(model_type="openvla", model_path=str(path), **lora)  # type: ignore[arg-type]
    if kind == "smolvla":
        from rlinf_models.smolvla import SmolVLAConfig
        from rlinf_models.smolvla.testing import TINY_SMOLVLA, make_tiny_smolvla
        from test_models_smolvla import SMOLVLA_BASE

        arch = TINY_SMOLVLA if size == "tiny" else SmolVLAConfig.from_lerobot_dict(SMOLVLA_BASE)
        paths = make_tiny_smolvla(root / kind, config=arch)
    elif kind in ("pi0", "pi05") and size == "tiny":
        from rlinf_models.pi0.testing import make_tiny_pi0

        paths = make_tiny_pi0(root / kind, pi05=kind == "pi05")
    else:
        raise ValueError(
            f"--run-size {size} has no {kind} checkpoint: tiny runs {KINDS}, published runs smolvla"
        )
    return PolicyConfig(model_type=kind, **{k: str(v) for k, v in paths.items()}, **lora)  # type: ignore[arg-type]


class SyncActor(Worker):
    """The actor side of :meth:`EmbodiedActorWorker.sync_model_to_rollout`, on one adapted policy."""

    def __init__(self, config: PolicyConfig) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.config = config
        self.policy = build_policy(SPEC, config)
        self.keys = trainable_names(self.policy)

    def sync(self, rollout: str, reps: int) -> dict[str, Any]:
        """``reps`` rounds of a ``merged`` then an ``adapters`` sync, each waiting for the rollout's ack.

        Returns per mode the start times, the actor's preparation times (state dict + ``rollout_state_dict``)
        and the bytes and tensors sent; and the model's bytes.
        """
        out: dict[str, Any] = {"model_bytes": nbytes(self.policy.state_dict())}
        for mode in MODES:
            out[mode] = {"starts": [], "prepare_ms": []}
        for version in range(reps):
            for mode in MODES:
                config = attrs.evolve(self.config, lora_sync=mode)
                keys = self.keys if mode == "adapters" else None
                start = time.perf_counter()
                state = rollout_state_dict(
                    config, full_model_state_dict(self.policy, keys=keys), trainable=keys
                )
                prepared = time.perf_counter()
                send_weights(self, rollout, state, version, rollout_world_size=1, timeout=600)
                self.recv(rollout, 0, timeout=600)  # the rollout loaded them
                out[mode]["starts"].append(start)
                out[mode]["prepare_ms"].append((prepared - start) * 1e3)
                out[mode]["bytes"], out[mode]["tensors"] = nbytes(state), len(state)
        return out


class SyncRollout(Worker):
    """The rollout side of :meth:`EmbodiedRolloutWorker.sync_model_from_actor`: a policy per mode."""

    def __init__(self, config: PolicyConfig) -> None:
        torch.set_num_threads(1)
        torch.manual_seed(1)
        self.configs = {mode: attrs.evolve(config, lora_sync=mode) for mode in MODES}
        self.policies = {mode: build_inference_policy(SPEC, c) for mode, c in self.configs.items()}

    def receive(self, actor: str, reps: int) -> dict[str, dict[str, list[float]]]:
        out: dict[str, dict[str, list[float]]] = {mode: {"ends": [], "load_ms": []} for mode in MODES}
        for _ in range(reps):
            for mode in MODES:
                msg = receive_weights(self, actor, timeout=600)
                received = time.perf_counter()
                load_rollout_weights(self.policies[mode], self.configs[mode], msg["state_dict"])
                end = time.perf_counter()
                self.send("loaded", actor, 0)
                out[mode]["ends"].append(end)
                out[mode]["load_ms"].append((end - received) * 1e3)
        return out


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs[1:] if len(xs) > 1 else xs), 2)


def run(size: str, kinds: tuple[str, ...], reps: int) -> list[dict[str, Any]]:
    rows = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        Cluster(num_nodes=1, ray_address="local", num_cpus=2) as cluster,
    ):
        root = Path(tmp)
        for kind in kinds:
            config = run_config(kind, root, size)
            names = (f"actor_{kind}", f"rollout_{kind}")
            actor = SyncActor.create_group(config).launch(cluster, NodePlacementStrategy([0]), name=names[0])
            rollout = SyncRollout.create_group(config).launch(
                cluster, NodePlacementStrategy([0]), name=names[1]
            )
            handle = rollout.receive(names[0], reps)
            sent = actor.sync(names[1], reps).wait()[0]
            got = handle.wait()[0]
            for mode in MODES:
                ms = [(e - s) * 1e3 for s, e in zip(sent[mode]["starts"], got[mode]["ends"], strict=True)]
                rows.append(
                    {
                        "part": size,
                        "model": kind,
                        "lora_sync": mode,
                        "lora_rank": config.lora_rank,
                        "tensors": sent[mode]["tensors"],
                        "bytes": sent[mode]["bytes"],
                        "model_bytes": sent["model_bytes"],
                        "sync_ms_median": _median(ms),
                        "prepare_ms_median": _median(sent[mode]["prepare_ms"]),
                        "load_ms_median": _median(got[mode]["load_ms"]),
                        "reps": max(1, reps - 1),
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
            actor.shutdown()
            rollout.shutdown()
    return rows


def _published_model(kind: str, lora: PolicyConfig) -> torch.nn.Module:
    if kind == "openvla":
        from rlinf_models.openvla import OPENVLA_VALUE_HEAD_SIZES, OpenVLAConfig, OpenVLAModel, apply_lora

        model: torch.nn.Module = OpenVLAModel(OpenVLAConfig(), value_head_sizes=OPENVLA_VALUE_HEAD_SIZES)
        apply_lora(model, rank=lora.lora_rank, alpha=lora.lora_alpha, target_modules=lora.lora_target_modules)  # type: ignore[arg-type]
        return model
    if kind == "smolvla":
        from rlinf_models.smolvla import SmolVLAConfig, SmolVLAModel
        from rlinf_models.smolvla import apply_lora as smolvla_lora
        from test_models_smolvla import SMOLVLA_BASE

        model = SmolVLAModel(SmolVLAConfig.from_lerobot_dict(SMOLVLA_BASE))
        smolvla_lora(model, lora)  # type: ignore[arg-type]
        return model
    from rlinf_models.pi0 import Pi0Config, Pi0Model
    from rlinf_models.pi0._policy import apply_lora as pi0_lora

    model = Pi0Model(Pi0Config(pi05=kind == "pi05"))
    pi0_lora(model, lora)  # type: ignore[arg-type]
    return model


def published() -> list[dict[str, Any]]:
    rows = []
    for kind in KINDS:
        # Only the LoRA shape and lora_sync matter here; the paths are never read.
        config = PolicyConfig(
            model_type=kind,  # type: ignore[arg-type]
            model_path="(meta)",
            tokenizer_path=None if kind == "openvla" else "(meta)",
            norm_stats_path=None if kind == "openvla" else "(meta)",
            is_lora=True,
            lora_rank=32,
        )
        with torch.device("meta"):
            model = _published_model(kind, config)
        state = model.state_dict()
        keys = trainable_names(model)
        for mode in ("merged", "adapters"):
            cfg = attrs.evolve(config, lora_sync=mode)
            sent = rollout_state_dict(cfg, state, trainable=keys)
            rows.append(
                {
                    "part": "count",
                    "model": kind,
                    "lora_sync": mode,
                    "lora_rank": 32,
                    "tensors": len(sent),
                    "params": sum(t.numel() for t in sent.values()),
                    "bytes": nbytes(sent),
                }
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--part", choices=("all", "run", "count"), default="all")
    parser.add_argument("--run-size", choices=("tiny", "published"), default="tiny")
    parser.add_argument("--models", nargs="+", choices=KINDS, default=None)
    args = parser.parse_args()
    if args.part in ("all", "count"):
        published()
    if args.part in ("all", "run"):
        default = KINDS if args.run_size == "tiny" else ("smolvla",)
        run(args.run_size, tuple(args.models or default), args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
