"""Write a tiny random OpenVLA checkpoint (published layout, with its tokenizer) for CPU smoke runs; no download.

    uv run python scripts/make_tiny_openvla.py    # runs/tiny_openvla/{config.json, model-*.safetensors, tokenizer...}

apps/embodied/config/libero_spatial_ppo_openvla_tiny.yaml reads runs/tiny_openvla (see docs/vla.md, "OpenVLA").
"""

from __future__ import annotations

import argparse

from rlinf_models.openvla import OPENVLA_VALUE_HEAD_SIZES
from rlinf_models.openvla.testing import make_tiny_openvla


def main() -> None:
    """Parse the command line and write the model."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", default="runs/tiny_openvla", help="output directory (default: runs/tiny_openvla)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args()
    path = make_tiny_openvla(args.out, seed=args.seed, value_head_sizes=OPENVLA_VALUE_HEAD_SIZES)
    print(f"actor.model.model_path={path}")


if __name__ == "__main__":
    main()
