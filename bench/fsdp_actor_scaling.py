"""One LLM actor update on one FSDP2 rank against two: what dynamic scaling can gain on this machine.

    uv run python bench/fsdp_actor_scaling.py [--micro-batch 8] [--kl-beta 0.02] [--repeats 2]

Builds ``FSDPActorBackend`` on SmolLM2-135M-Instruct (float32, one thread per process) in one process, then in two
processes joined by gloo, and times ``run_training`` (one GRPO update of 32 sequences of 72 tokens, 32 trained
tokens each, one optimizer step; with ``--kl-beta > 0`` the reference model's forward too) and the weight export
(``export_hf_state_dict``, what the weight sync gathers). One warm-up update first. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import torch
import torch.multiprocessing as mp


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n, t = 32, 72
    ids = torch.randint(100, 2000, (n, t), generator=g)
    loss_mask = torch.zeros(n, t)
    loss_mask[:, 40:] = 1
    advantages = torch.randn(n, 1, generator=g).expand(n, t).clone() * loss_mask
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(n, t, dtype=torch.long),
        "loss_mask": loss_mask,
        "advantages": advantages,
    }


def _rank(rank: int, world: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(args.port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    from rlinf_core.config import AlgorithmConfig, structure_config
    from rlinf_models.llm import LLMActorConfig
    from rlinf_models.llm._fsdp_backend import FSDPActorBackend

    cfg = structure_config(
        LLMActorConfig,
        {
            "model": {"model_path": "smollm2-135m-instruct", "dtype": "float32"},
            "global_batch_size": 32,
            "micro_batch_size": args.micro_batch,
            "torch_num_threads": 1,
        },
    )
    algorithm = AlgorithmConfig(
        adv_type="grpo", loss_type="actor", group_size=8, update_epoch=1, kl_beta=args.kl_beta
    )
    backend = FSDPActorBackend(cfg, algorithm, rank=rank, world_size=world, total_steps=100)
    batch = _batch()
    backend.run_training(batch)
    updates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        backend.run_training(batch)
        updates.append(time.perf_counter() - start)
    start = time.perf_counter()
    backend.export_hf_state_dict()
    export = time.perf_counter() - start
    if rank == 0:
        queue.put({"ranks": world, "update_s": updates, "export_s": export})


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--kl-beta", type=float, default=0.02)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--port", type=int, default=29544)
    args = parser.parse_args(argv)
    ctx = mp.get_context("spawn")
    results = []
    for world in (1, 2):
        queue = ctx.Queue()
        procs = [ctx.Process(target=_rank, args=(r, world, args, queue)) for r in range(world)]
        for proc in procs:
            proc.start()
        results.append(queue.get(timeout=1800))
        for proc in procs:
            proc.join(timeout=60)
        args.port += 1
    one, two = (min(r["update_s"]) for r in results)
    print(json.dumps({"args": vars(args), "results": results, "two_vs_one": two / one}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
