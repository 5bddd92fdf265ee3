"""Write a tiny random SmolVLA (model, tokenizer, normalisation statistics) for CPU smoke runs; no download.

    uv run python scripts/make_tiny_smolvla.py    # runs/tiny_smolvla/{model,tokenizer,norm_stats.safetensors}

apps/embodied/config/libero_spatial_ppo_smolvla_tiny.yaml reads runs/tiny_smolvla (see docs/vla.md).
"""

from __future__ import annotations

import argparse

from rlinf_models.smolvla.testing import make_tiny_smolvla


def main() -> None:
    """Parse the command line and write the model."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default="runs/tiny_smolvla", help="output directory (default: runs/tiny_smolvla)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and statistics")
    args = parser.parse_args()
    for name, path in make_tiny_smolvla(args.out, seed=args.seed).items():
        print(f"actor.model.{name}={path}")


if __name__ == "__main__":
    main()
