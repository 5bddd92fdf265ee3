"""Write a tiny random π0 / π0.5 (model, tokenizer, normalisation statistics) for CPU smoke runs; no download.

    uv run python scripts/make_tiny_pi0.py                      # runs/tiny_pi0/{model,tokenizer,norm_stats.json}
    uv run python scripts/make_tiny_pi0.py --pi05 --out runs/tiny_pi05

apps/embodied/config/libero_spatial_ppo_pi0_tiny.yaml reads runs/tiny_pi0 (see docs/vla.md).
"""

from __future__ import annotations

import argparse

from rlinf_models.pi0.testing import make_tiny_pi0


def main() -> None:
    """Parse the command line and write the model."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="runs/tiny_pi0", help="output directory (default: runs/tiny_pi0)")
    parser.add_argument("--pi05", action="store_true", help="write a π0.5 model instead of π0")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and statistics")
    args = parser.parse_args()
    for name, path in make_tiny_pi0(args.out, pi05=args.pi05, seed=args.seed).items():
        print(f"actor.model.{name}={path}")


if __name__ == "__main__":
    main()
