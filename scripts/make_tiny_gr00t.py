"""Write a tiny random GR00T N1.5 (model in the published layout, statistics, tokenizer) for CPU smoke runs; no download.

    uv run python scripts/make_tiny_gr00t.py    # runs/tiny_gr00t/{model,tokenizer}

apps/embodied/config/libero_spatial_ppo_gr00t_tiny.yaml reads runs/tiny_gr00t (see docs/vla.md).
"""

from __future__ import annotations

import argparse

from rlinf_models.gr00t.testing import make_tiny_gr00t


def main() -> None:
    """Parse the command line and write the model."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default="runs/tiny_gr00t", help="output directory (default: runs/tiny_gr00t)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights and statistics")
    args = parser.parse_args()
    for name, path in make_tiny_gr00t(args.out, seed=args.seed).items():
        print(f"actor.model.{name}={path}")


if __name__ == "__main__":
    main()
