"""RLinf's HF generation engine vs raw ``model.generate``: generated tokens per second, same prompts and model.

Both sides share one loaded model object. The prompts (chat-templated arithmetic questions of varied length)
are sorted longest-first, so the engine's own length sort keeps the order and both sides decode exactly the
same micro-batches; the engine additionally computes the logprob of every sampled token (temperature-scaled)
and assembles per-prompt outputs, which is the overhead measured. Each micro-batch is timed on both sides
back to back, alternating which goes first, with the same torch seed, so background load hits both alike;
the script reports, over the runs, the median tokens/s of each side and the median ratio. Generated tokens
are counted up to and including eos on both sides. Target: engine / raw >= 0.8.

    uv run python bench/llm_rollout_hf.py [--model smollm2-135m-instruct | --tiny] [--num-prompts 32]
        [--batch-size 16] [--max-new-tokens 64] [--temperature 1.0] [--top-p 1.0] [--repeats 3] [--threads 1]

``--tiny`` benchmarks a tiny random Qwen2 checkpoint written on the spot (no model files needed).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
from rlinf_models.llm import LLMModelConfig, load_causal_lm, load_tokenizer
from rlinf_rollout.llm import HFGenerateEngine, SamplingConfig


def make_prompts(tokenizer: Any, n: int) -> list[list[int]]:
    prompts = []
    for i in range(n):
        a, b = 7 * i + 3, 13 * i + 5
        extra = " Explain each step briefly." * (i % 4)
        messages = [{"role": "user", "content": f"What is {a} + {b}?{extra}"}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if not isinstance(ids, list):  # transformers 5 returns a BatchEncoding
            ids = ids["input_ids"]
        prompts.append([int(t) for t in ids])
    return sorted(prompts, key=len, reverse=True)


def count_generated(rows: torch.Tensor, eos_ids: set[int]) -> int:
    total = 0
    for row in rows.tolist():
        n = len(row)
        for j, tok in enumerate(row):
            if tok in eos_ids:
                n = j + 1
                break
        total += n
    return total


def raw_generate(
    model: Any, prompts: list[list[int]], pad: int, batch: int, args: argparse.Namespace
) -> tuple[int, list[list[int]]]:
    """The baseline: left-padded micro-batches through ``model.generate``; returns tokens and outputs."""
    eos = set(model.generation_config.eos_token_id)
    total, outputs = 0, []
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        width = max(len(p) for p in chunk)
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        sampling: dict[str, Any] = (
            {"do_sample": False}
            if args.temperature == 0
            else {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p, "top_k": 0}
        )
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=pad,
                **sampling,
            )
        gen = out[:, width:]
        total += count_generated(gen, eos)
        outputs.extend(gen.tolist())
    return total, outputs


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m-instruct", help="HF checkpoint dir or alias")
    parser.add_argument("--tiny", action="store_true", help="use a tiny random model instead of --model")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    path = args.model
    if args.tiny:
        from rlinf_models.llm.testing import make_tiny_model_dir

        path = str(make_tiny_model_dir(tempfile.mkdtemp(prefix="rlinf_tiny_"), hidden_size=256, num_layers=4))
    cfg = LLMModelConfig(model_path=path)
    t0 = time.perf_counter()
    tokenizer = load_tokenizer(cfg)
    model = load_causal_lm(cfg)
    engine = HFGenerateEngine.from_model(model, tokenizer, max_batch_size=args.batch_size, device="cpu")
    load_s = time.perf_counter() - t0
    prompts = make_prompts(tokenizer, args.num_prompts)
    pad = engine.pad_token_id
    sampling = SamplingConfig(
        temperature=args.temperature, top_p=args.top_p, max_new_tokens=args.max_new_tokens
    )
    n_params = sum(p.numel() for p in model.parameters()) / 1e6
    print(
        f"model {path} ({n_params:.1f}M params, loaded in {load_s:.1f} s), {len(prompts)} prompts of "
        f"{min(map(len, prompts))}-{max(map(len, prompts))} tokens, batch {args.batch_size}, max_new_tokens "
        f"{args.max_new_tokens}, temperature {args.temperature}, top_p {args.top_p}, threads {args.threads}, "
        f"torch {torch.__version__}, {platform.machine()}"
    )

    # Warm-up (allocator, kernels) on a slice, then the check: greedy outputs must be identical.
    greedy = SamplingConfig(temperature=0, max_new_tokens=8)
    warm = prompts[: args.batch_size]
    _, raw_out = raw_generate(
        model,
        warm,
        pad,
        args.batch_size,
        argparse.Namespace(**{**vars(args), "temperature": 0, "max_new_tokens": 8}),
    )
    ours = engine.generate(warm, greedy)
    for o, r in zip(ours, raw_out, strict=True):
        if o.token_ids != r[: len(o.token_ids)]:
            print("greedy outputs differ between the engine and raw generate", file=sys.stderr)
            return 1

    # Each micro-batch is timed on both sides back to back (the order alternating), so a burst of background
    # load hits both alike; a run sums the times over all micro-batches. Wall time is the figure of record;
    # process CPU time (one torch thread: the compute actually spent) is shown as a load-independent check.
    sides = ("raw", "engine")
    walls: dict[str, list[float]] = {side: [] for side in sides}
    cpus: dict[str, list[float]] = {side: [] for side in sides}
    tokens: dict[str, int] = {}
    for rep in range(args.repeats):
        wall = dict.fromkeys(sides, 0.0)
        cpu = dict.fromkeys(sides, 0.0)
        tokens = dict.fromkeys(sides, 0)
        same = 0  # prompts whose sampled continuation is identical on both sides (same seed, same batch)
        for k, start in enumerate(range(0, len(prompts), args.batch_size)):
            chunk = prompts[start : start + args.batch_size]
            for side in sides if (rep + k) % 2 == 0 else sides[::-1]:
                torch.manual_seed(args.seed + k)
                t, c = time.perf_counter(), time.process_time()
                if side == "raw":
                    n, raw_rows = raw_generate(model, chunk, pad, args.batch_size, args)
                else:
                    ours = engine.generate(chunk, sampling)
                    n = sum(len(o.token_ids) for o in ours)
                wall[side] += time.perf_counter() - t
                cpu[side] += time.process_time() - c
                tokens[side] += n
            same += sum(o.token_ids == r[: len(o.token_ids)] for o, r in zip(ours, raw_rows, strict=True))
        for side in sides:
            walls[side].append(tokens[side] / wall[side])
            cpus[side].append(tokens[side] / cpu[side])
        print(
            f"run {rep}: raw {tokens['raw']} tok, {wall['raw']:.2f} s wall ({walls['raw'][-1]:.1f} tok/s), "
            f"{cpu['raw']:.2f} s CPU | engine {tokens['engine']} tok, {wall['engine']:.2f} s wall "
            f"({walls['engine'][-1]:.1f} tok/s), {cpu['engine']:.2f} s CPU | ratio wall "
            f"{walls['engine'][-1] / walls['raw'][-1]:.3f}, CPU {cpus['engine'][-1] / cpus['raw'][-1]:.3f} | "
            f"identical outputs {same}/{len(prompts)}"
        )
    med = {
        f"{kind}_{side}": statistics.median(d[side])
        for kind, d in (("wall", walls), ("cpu", cpus))
        for side in sides
    }
    ratio = med["wall_engine"] / med["wall_raw"]
    run_ratio = statistics.median(e / r for e, r in zip(walls["engine"], walls["raw"], strict=True))
    print(
        f"median over {args.repeats} runs: raw generate {med['wall_raw']:.1f} tok/s, HFGenerateEngine "
        f"{med['wall_engine']:.1f} tok/s (wall), ratio engine/raw {ratio:.3f} (median of the per-run ratios "
        f"{run_ratio:.3f}); per CPU second: raw {med['cpu_raw']:.1f}, engine {med['cpu_engine']:.1f}, ratio "
        f"{med['cpu_engine'] / med['cpu_raw']:.3f}"
    )
    engine.shutdown()
    return 0 if ratio >= 0.8 else 2


if __name__ == "__main__":
    sys.exit(main())
