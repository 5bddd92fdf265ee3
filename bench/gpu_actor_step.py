"""LLM actor training step on one CUDA GPU: our FSDPActorBackend vs a plain PyTorch loop on the same model.

Run (on a machine with a CUDA GPU): python bench/gpu_actor_step.py [--hidden 1024 --layers 12 --batch 16 --seq 512]

Both sides build the same randomly initialised qwen2 checkpoint (``make_tiny_model_dir`` at the given size),
bf16 weights, AdamW, grad-norm clipping at 1.0, and train on the same batch of random token ids:

- ``backend.run_sft``: one SFT optimizer step through :class:`rlinf_models.llm.FSDPActorBackend` (micro-batches,
  masked token-mean NLL, clip, step, the bookkeeping it does for the runner);
- ``backend.run_training``: one GRPO-style step (``loss_type: actor``, ``update_epoch: 1`` as the reasoning
  configs, so the update is one optimizer step and the old log-probs are the detached current ones);
- baseline: the plain loop a user would write: forward, ``log_softmax`` + gather, masked token-mean NLL,
  backward, ``clip_grad_norm_``, ``AdamW.step``.

Timed with ``torch.cuda.synchronize`` around each step, the cases alternated, medians over ``--reps`` after
``--warmup`` steps. One process and one GPU: the backend does not shard with a single rank (FSDP2 shards from
two ranks on, and NCCL does not put two ranks on one GPU), so this measures our training path's overhead over
plain PyTorch, not FSDP2 communication.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the timing, profile one more step of each case (torch.profiler) and print where the time went",
    )
    parser.add_argument(
        "--cpu", action="store_true", help="smoke-test the script on the CPU (figures meaningless)"
    )
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        raise SystemExit("gpu_actor_step.py needs a CUDA GPU (--cpu only smoke-tests it)")
    dev = "cpu" if args.cpu else "cuda"
    os.environ["RLINF_ACCELERATOR_TYPE"] = dev

    def sync() -> None:
        if dev == "cuda":
            torch.cuda.synchronize()

    from rlinf_core.config import AlgorithmConfig
    from rlinf_models._config import OptimConfig
    from rlinf_models.llm import FSDPActorBackend, LLMActorConfig, LLMModelConfig, load_causal_lm
    from rlinf_models.llm.testing import make_tiny_model_dir

    path = make_tiny_model_dir(
        tempfile.mkdtemp(prefix="gpu_bench_"), arch="qwen2", hidden_size=args.hidden, num_layers=args.layers
    )
    model_cfg = LLMModelConfig(model_path=str(path), dtype="bfloat16")
    b, t = args.batch, args.seq
    cfg = LLMActorConfig(
        model=model_cfg,
        optim=OptimConfig(lr=1e-6, clip_grad=1.0),
        global_batch_size=b,
        micro_batch_size=b,
        seed=0,
    )
    # One pass over the batch, as the reasoning app's GRPO configs (AlgorithmConfig's default is 4 epochs).
    algorithm = AlgorithmConfig(loss_type="actor", adv_type="grpo", kl_beta=0.0, update_epoch=1)
    backend = FSDPActorBackend(cfg, algorithm)
    g = torch.Generator().manual_seed(0)
    vocab = backend.policy.model.config.vocab_size
    batch = {
        "input_ids": torch.randint(0, vocab, (b, t), generator=g),
        "attention_mask": torch.ones(b, t, dtype=torch.long),
        "loss_mask": torch.cat([torch.zeros(b, t // 4), torch.ones(b, t - t // 4)], dim=1),
        "advantages": torch.randn(b, 1, generator=g).expand(b, t).contiguous(),
    }

    model = load_causal_lm(model_cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids, attn = batch["input_ids"].to(dev), batch["attention_mask"].to(dev)
    mask = batch["loss_mask"].to(dev)[:, 1:]

    def plain_step() -> None:
        opt.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        lp = torch.log_softmax(logits, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        loss = -(lp * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    cases = {
        "plain PyTorch step (baseline)": plain_step,
        "backend.run_sft": lambda: backend.run_sft(batch),
        "backend.run_training (GRPO)": lambda: backend.run_training(batch),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for rep in range(args.warmup + args.reps):
        for name, fn in cases.items():
            sync()
            start = time.perf_counter()
            fn()
            sync()
            if rep >= args.warmup:
                times[name].append((time.perf_counter() - start) * 1e3)
    base = statistics.median(times["plain PyTorch step (baseline)"])
    params = sum(p.numel() for p in model.parameters())
    device_name = torch.cuda.get_device_name(0) if dev == "cuda" else "CPU"
    print(
        f"device: {device_name}, torch {torch.__version__}; qwen2 {params / 1e6:.1f}M params, "
        f"bf16, batch {b} x {t} tokens, medians of {args.reps}"
    )
    print(f"{'case':34s} {'ms':>9s} {'x baseline':>11s} {'tokens/s':>11s}")
    result = {}
    for name, ts in times.items():
        ms = statistics.median(ts)
        result[name] = {"ms": ms, "ratio": ms / base, "tokens_per_s": b * t / ms * 1e3}
        print(f"{name:34s} {ms:9.2f} {ms / base:11.3f} {b * t / ms * 1e3:11.0f}")
    if args.profile:
        profile_cases(cases, dev)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": device_name, "params": params, "cases": result}, f, indent=1)


def profile_cases(cases: dict[str, Any], dev: str) -> None:
    """One profiled step per case: the top operators by device time, and how busy the device was."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
    for name, fn in cases.items():
        fn()  # the profiler's first step carries its own start-up cost
        with profile(activities=activities) as prof:
            start = time.perf_counter()
            fn()
            if dev == "cuda":
                torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - start) * 1e3
        events = prof.key_averages()
        device_us = sum(getattr(e, "self_device_time_total", 0.0) for e in events)
        print(
            f"\n== profile: {name}: wall {wall_ms:.1f} ms, device busy {device_us / 1e3:.1f} ms (sum of kernels)"
        )
        sort = "self_device_time_total" if dev == "cuda" else "self_cpu_time_total"
        print(events.table(sort_by=sort, row_limit=20, max_name_column_width=60))
        print(events.table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=60))


if __name__ == "__main__":
    main()
