"""LLM actor update with packed micro-batches (``actor.use_remove_padding``) vs the padded path, same batch.

Run: uv run python bench/llm_remove_padding.py [--model smollm2-135m-instruct --reps 5]

The batch has the default reasoning task's layout and length spread: ``rollout_batch_size x group_size``
(4 x 8 = 32) held-out-style prompts of ``apps/reasoning/data/chain_sum/sft.jsonl`` through the chat template,
each with a response of the length the model writes after SFT (the SFT solution plus EOS, or a random cut of it
for a quarter of the rows, as sampled responses vary), laid out by the runner's own ``pack_sequences`` (prompts
left-padded, responses right-padded). ``--spread long`` appends, for half of the rows, a longer response
(up to ``--max-new``) to show what a task with long-tailed responses gains.

Each case is one ``FSDPActorBackend.run_training`` (GRPO, ``update_epoch: 1``, the config's batch sizes: one
optimizer step over 4 micro-batches of 8), alternated, medians of ``--reps`` after one warm-up. Tokens/s counts
attended tokens only. The script also checks that both paths give the same policy loss and gradient norm.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m-instruct", help="alias or local HF checkpoint dir")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--spread", choices=["default", "long"], default="default")
    parser.add_argument("--max-new", type=int, default=40, help="responses are cut to this many tokens")
    args = parser.parse_args()
    os.environ["RLINF_ACCELERATOR_TYPE"] = "cpu"
    torch.set_num_threads(args.threads)

    from rlinf_core.config import AlgorithmConfig
    from rlinf_core.data import ChatPromptEncoder, load_prompt_dataset, pack_sequences
    from rlinf_models._config import OptimConfig
    from rlinf_models.llm import FSDPActorBackend, LLMActorConfig, LLMModelConfig, load_tokenizer

    model_cfg = LLMModelConfig(model_path=args.model)
    encoder = ChatPromptEncoder(load_tokenizer(model_cfg))
    rows = load_prompt_dataset(ROOT / "apps/reasoning/data/chain_sum/sft.jsonl", require_solution=True)
    rng = random.Random(0)
    prompts, responses = [], []
    eos = [encoder.eos_token_id] if encoder.eos_token_id is not None else []
    for i in range(32):
        example = rows[i // 8]
        prompts.append(encoder.encode_prompt(example))
        response = encoder.encode_completion(example.solution or "") + eos
        if rng.random() < 0.25:
            response = response[: rng.randint(4, len(response))]
        if args.spread == "long" and i % 2:
            response = (response * 8)[: args.max_new]
        responses.append(response[: args.max_new])
    packed = pack_sequences(prompts, responses, pad_token_id=encoder.pad_token_id)
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.as_tensor(packed["input_ids"]),
        "attention_mask": torch.as_tensor(packed["attention_mask"]),
        "loss_mask": torch.as_tensor(packed["loss_mask"]).long(),
        "advantages": torch.randn(32, 1, generator=g).expand(32, packed["input_ids"].shape[1]).contiguous(),
    }
    live = int(batch["attention_mask"].sum())
    total = batch["attention_mask"].numel()
    algorithm = AlgorithmConfig(loss_type="actor", adv_type="grpo", kl_beta=0.0, update_epoch=1)
    backends = {}
    for remove_padding in (False, True):
        cfg = LLMActorConfig(
            model=model_cfg,
            optim=OptimConfig(lr=5e-6, clip_grad=1.0),
            global_batch_size=32,
            micro_batch_size=8,
            seed=0,
            temperature=0.7,
            use_remove_padding=remove_padding,
        )
        backends[remove_padding] = FSDPActorBackend(cfg, algorithm)
    times: dict[bool, list[float]] = {False: [], True: []}
    metrics: dict[bool, dict[str, float]] = {}
    for rep in range(args.reps + 1):
        for remove_padding, backend in backends.items():
            start = time.perf_counter()
            out = backend.run_training(batch)
            if rep == 0:
                metrics[remove_padding] = out
            else:
                times[remove_padding].append(time.perf_counter() - start)
            print(
                f"rep {rep} remove_padding={remove_padding}: {time.perf_counter() - start:.2f} s", flush=True
            )
    pad_s, pack_s = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"batch 32 x {batch['input_ids'].shape[1]} columns, {live} attended tokens of {total} "
        f"({1 - live / total:.0%} padding); micro-batches of 8 trimmed to their live columns; "
        f"{args.threads} torch threads; medians of {args.reps}"
    )
    print(f"{'case':28s} {'s/update':>9s} {'tokens/s':>9s} {'x padded':>9s}")
    print(f"{'padded (baseline)':28s} {pad_s:9.3f} {live / pad_s:9.0f} {1.0:9.2f}")
    print(f"{'use_remove_padding':28s} {pack_s:9.3f} {live / pack_s:9.0f} {pad_s / pack_s:9.2f}")
    same = {k: (metrics[False][k], metrics[True][k]) for k in ("actor/policy_loss", "actor/grad_norm")}
    print("first update, padded vs packed:", json.dumps(same))


if __name__ == "__main__":
    main()
