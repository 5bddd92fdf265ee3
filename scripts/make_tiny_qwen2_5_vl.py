"""Write a tiny random Qwen2.5-VL checkpoint (weights, tokenizer, image processor) for CPU runs; no download.

    uv run python scripts/make_tiny_qwen2_5_vl.py    # runs/tiny_qwen2_5_vl/{config.json, model.safetensors, ...}

apps/reasoning/config/grpo_qwen2_5_vl_tiny.yaml reads runs/tiny_qwen2_5_vl (see docs/reasoning.md, "VLM GRPO").
"""

from __future__ import annotations

import argparse

from rlinf_models.llm.testing import make_tiny_vlm_dir


def main() -> None:
    """Parse the command line and write the model."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default="runs/tiny_qwen2_5_vl", help="output directory (default: runs/tiny_qwen2_5_vl)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args()
    print(f"actor.model.model_path={make_tiny_vlm_dir(args.out, seed=args.seed)}")


if __name__ == "__main__":
    main()
