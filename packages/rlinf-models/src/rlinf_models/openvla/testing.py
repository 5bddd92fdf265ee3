"""A tiny, fully local OpenVLA checkpoint directory in the published layout, for tests and CPU smoke runs.

:func:`make_tiny_openvla` writes what :func:`~rlinf_models.openvla.load_openvla` reads: ``config.json`` with the
fields of ``openvla/openvla-7b``'s (``vision_backbone_id: dinosiglip-vit-so-224px``, ``llm_backbone_id:
llama2-7b-pure``, a small ``text_config``, ``norm_stats`` of one dataset) plus the tiny ViT sizes in
``rlinf_architecture``, sharded safetensors with ``model.safetensors.index.json`` under the published key
names, and (as the published directory holds Llama's tokenizer) a character-level tokenizer with BOS
(:func:`rlinf_models.pi0.testing.write_char_tokenizer`: 98 ids, below the action tokens 256..511). Nothing is
downloaded. Part of the public API (not test-only); needs the ``openpi`` extra (transformers, safetensors, peft).
"""

from __future__ import annotations

from pathlib import Path

import attrs
import torch

from ..pi0.testing import write_char_tokenizer
from ._checkpoint import save_openvla
from ._config import OpenVLAConfig, ViTSpec
from ._model import OpenVLAModel
from ._oft import OFT_PLATFORMS, OpenVLAOFTModel, save_openvla_oft

__all__ = [
    "TINY_NORM_STATS",
    "TINY_OFT_NORM_STATS",
    "TINY_OPENVLA",
    "make_tiny_openvla",
    "make_tiny_openvla_oft",
]

TINY_NORM_STATS = {
    "libero_spatial_no_noops": {
        "action": {
            "mean": [0.15, 0.13, -0.15, -0.01, -0.01, 0.0, -0.04],
            "std": [0.41, 0.35, 0.5, 0.04, 0.06, 0.08, 0.99],
            "max": [0.94, 0.94, 0.94, 0.2, 0.28, 0.36, 1.0],
            "min": [-0.94, -0.94, -0.94, -0.11, -0.19, -0.33, -1.0],
            "q01": [-0.75, -0.72, -0.94, -0.1, -0.15, -0.21, -1.0],
            "q99": [0.94, 0.87, 0.94, 0.11, 0.13, 0.21, 1.0],
            "mask": [True, True, True, True, True, True, False],
        },
        "num_transitions": 52970,
        "num_trajectories": 432,
    }
}
"""Statistics in the layout of ``norm_stats`` / ``dataset_statistics.json`` (values made up, LIBERO-like)."""

TINY_OFT_NORM_STATS = {
    name: {
        **entry,
        "proprio": {
            "q01": [-0.45, -0.3, 0.0, 1.5, -2.4, -0.6, 0.0, -0.04],
            "q99": [0.2, 0.35, 1.3, 3.3, 2.1, 0.5, 0.04, 0.0],
        },
    }
    for name, entry in TINY_NORM_STATS.items()
}
""":data:`TINY_NORM_STATS` plus the ``proprio`` quantiles OFT's LIBERO checkpoints carry (8 dims, made up)."""

TINY_OPENVLA = OpenVLAConfig(
    pad_token_id=512,
    norm_stats=TINY_NORM_STATS,
    text_config={
        "model_type": "llama",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 576,  # a 512-token tokenizer padded by pad_to_multiple_of (64)
        "pad_token_id": 512,
        "torch_dtype": "bfloat16",
    },
    towers=(
        ViTSpec(
            embed_dim=16,
            depth=3,
            num_heads=2,
            mlp_hidden=32,
            patch_size=32,
            reg_tokens=4,
            no_embed_class=True,
            layer_scale=True,
        ),
        ViTSpec(
            embed_dim=24,
            depth=3,
            num_heads=2,
            mlp_hidden=40,
            patch_size=32,
            class_token=False,
            attn_pool=True,
        ),
    ),
)
"""DINOv2-like and SigLIP-like towers of 3 blocks on 224 px images (49 patches), a 2-layer Llama of width 32."""


def make_tiny_openvla(
    out: str | Path,
    *,
    seed: int = 0,
    config: OpenVLAConfig = TINY_OPENVLA,
    value_head_sizes: tuple[int, ...] | None = None,
    max_shard_bytes: int = 256 * 1024,
    tokenizer: bool = True,
) -> Path:
    """Write a tiny random OpenVLA (several shards, like the published three) to ``out``; returns ``out``.

    ``tokenizer``: write the character tokenizer into ``out`` too (what ``actor.model.model_type: openvla``
    reads when ``tokenizer_path`` is null).
    """
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = OpenVLAModel(config, value_head_sizes=value_head_sizes)
    with torch.no_grad():  # give every tensor some spread (LayerScale starts at 1e-5)
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    save_openvla(model, out, max_shard_bytes=max_shard_bytes)
    if tokenizer:
        write_char_tokenizer(out)
    return Path(out)


def make_tiny_openvla_oft(
    out: str | Path,
    *,
    seed: int = 0,
    num_action_chunks: int = OFT_PLATFORMS["libero"].num_actions_chunk,
    l1_head: bool = True,
    proprio_dim: int | None = OFT_PLATFORMS["libero"].proprio_dim,
    value_head_sizes: tuple[int, ...] | None = None,
    max_shard_bytes: int = 256 * 1024,
    tokenizer: bool = True,
) -> Path:
    """Write a tiny random OpenVLA-OFT in OFT's layout to ``out``; returns ``out``.

    :data:`TINY_OPENVLA`'s network and tokenizer (with :data:`TINY_OFT_NORM_STATS`) plus, as OFT's LIBERO
    checkpoints ship them, ``action_head--latest_checkpoint.pt`` (``l1_head``) and
    ``proprio_projector--latest_checkpoint.pt`` (``proprio_dim``; ``None``: none), DDP's ``module.`` prefix included.
    """
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    config = attrs.evolve(TINY_OPENVLA, norm_stats=TINY_OFT_NORM_STATS)
    model = OpenVLAOFTModel(
        config,
        action_dim=OFT_PLATFORMS["libero"].action_dim,  # the 7 dims of TINY_NORM_STATS
        num_action_chunks=num_action_chunks,
        value_head_sizes=value_head_sizes,
        l1_head=l1_head,
        proprio_dim=proprio_dim,
    )
    with torch.no_grad():
        for param in model.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    save_openvla_oft(model, out, max_shard_bytes=max_shard_bytes)
    if tokenizer:
        write_char_tokenizer(out)
    return Path(out)
