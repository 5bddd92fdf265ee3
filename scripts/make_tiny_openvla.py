"""Write a tiny random OpenVLA checkpoint (published layout, with its tokenizer) for CPU smoke runs; no download.

    uv run python scripts/make_tiny_openvla.py    # runs/tiny_openvla/{config.json, model-*.safetensors, tokenizer...}
    uv run python scripts/make_tiny_openvla.py --oft    # runs/tiny_openvla_oft: OpenVLA-OFT's layout

apps/embodied/config/libero_spatial_ppo_openvla_tiny.yaml reads runs/tiny_openvla (see docs/vla.md, "OpenVLA");
libero_spatial_ppo_openvlaoft_tiny.yaml reads runs/tiny_openvla_oft, which adds OFT's
action_head--latest_checkpoint.pt (L1 regression head) and proprio_projector--latest_checkpoint.pt (LIBERO's
8-D state) and the proprio statistics (see docs/vla.md, "OpenVLA-OFT").
"""

from __future__ import annotations

import argparse

from rlinf_models.openvla import OPENVLA_VALUE_HEAD_SIZES
from rlinf_models.openvla.testing import make_tiny_openvla, make_tiny_openvla_oft


def main() -> None:
    """Parse the command line and write the model."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        default=None,
        help="output directory (default: runs/tiny_openvla, with --oft runs/tiny_openvla_oft)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    parser.add_argument(
        "--oft",
        action="store_true",
        help="OpenVLA-OFT's layout: add the L1 action head and the proprio projector files (LIBERO's sizes)",
    )
    args = parser.parse_args()
    if args.oft:
        out = args.out or "runs/tiny_openvla_oft"
        path = make_tiny_openvla_oft(out, seed=args.seed, value_head_sizes=OPENVLA_VALUE_HEAD_SIZES)
    else:
        out = args.out or "runs/tiny_openvla"
        path = make_tiny_openvla(out, seed=args.seed, value_head_sizes=OPENVLA_VALUE_HEAD_SIZES)
    print(f"actor.model.model_path={path}")


if __name__ == "__main__":
    main()
