"""SmolVLA at its published size (random weights) on one device: prefix, sampling, training step, memory.

    uv run python bench/gpu_smolvla.py [--batch 8] [--cameras 2] [--dtype float32|bfloat16] [--tiny]

Builds ``SmolVLAModel`` from the architecture fields of ``lerobot/smolvla_base`` (SmolVLM2-500M truncated to 16
layers, the 0.75-wide expert), random weights, on CUDA when there is one. Times (median of 3 after a warm-up)
the prefix encoding of ``--cameras`` 512x512 images + 48 tokens + the state, the 10-step Euler sampling of a
50 x 32 chunk, and one flow-matching training step (forward + backward + AdamW); reports the peak memory and
that sampling twice from the same noise gives the same chunk. ``--tiny`` shrinks it to a CPU smoke test.
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "packages" / "rlinf-models" / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--cameras", type=int, default=2)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    from rlinf_models.smolvla import SmolVLAConfig, SmolVLAModel
    from test_models_smolvla import SMOLVLA_BASE

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    fields = dict(SMOLVLA_BASE)
    if args.tiny:
        fields.update(num_vlm_layers=2, resize_imgs_with_padding=[64, 64])
    config = SmolVLAConfig.from_lerobot_dict(fields)
    torch.manual_seed(0)
    model = SmolVLAModel(config).to(device=device, dtype=getattr(torch, args.dtype))
    n_params = sum(p.numel() for p in model.parameters())
    b, side = args.batch, config.image_size
    images = [torch.rand(b, 3, side, side, device=device) * 2 - 1 for _ in range(args.cameras)]
    masks = [torch.ones(b, dtype=torch.bool, device=device) for _ in range(args.cameras)]
    tokens = torch.randint(0, 1000, (b, config.tokenizer_max_length), device=device)
    token_mask = torch.ones_like(tokens, dtype=torch.bool)
    state = torch.randn(b, config.max_state_dim, device=device)
    noise = torch.randn(b, config.chunk_size, config.max_action_dim, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def timed(fn: object) -> float:
        times = []
        for _ in range(4):
            sync()
            t0 = time.perf_counter()
            fn()  # type: ignore[operator]
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[1:])

    with torch.no_grad():
        prefix_s = timed(lambda: model.encode_prefix(images, masks, tokens, token_mask, state))
        prefix = model.encode_prefix(images, masks, tokens, token_mask, state)
        sample_s = timed(lambda: model.sample_actions(prefix, None, noise))
        a = model.sample_actions(prefix, None, noise)
        repeat = float((model.sample_actions(prefix, None, noise) - a).abs().max())
    optim = torch.optim.AdamW(model.parameters(), lr=1e-5)
    target = torch.randn_like(noise)

    def train_step() -> None:
        optim.zero_grad(set_to_none=True)
        p = model.encode_prefix(images, masks, tokens, token_mask, state)
        loss = model.flow_matching_loss(p, None, target, noise, model.sample_time(b)).mean()
        loss.backward()
        optim.step()

    train_s = timed(train_step)
    out = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "dtype": args.dtype,
        "params": n_params,
        "batch": b,
        "cameras": args.cameras,
        "prefix_s": round(prefix_s, 4),
        "sample_10_steps_s": round(sample_s, 4),
        "train_step_s": round(train_s, 4),
        "same_noise_same_chunk_max_diff": repeat,
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if device.type == "cuda" else None,
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
