"""A tiny, fully local GR00T N1.5 model directory for tests, examples and CPU smoke runs.

:func:`make_tiny_gr00t` writes what ``actor.model.model_type: gr00t`` reads, in the published layouts:

- ``model/``: a randomly initialised tiny :class:`~rlinf_models.gr00t.GR00TModel` saved with
  :func:`~rlinf_models.gr00t.save_gr00t` (``config.json``, the weights in two safetensors shards with their
  index, ``experiment_cfg/metadata.json`` with ``new_embodiment`` statistics, plus our value head);
- ``tokenizer/``: a character-level tokenizer (:func:`rlinf_models.pi0.testing.write_char_tokenizer`).

Nothing is downloaded. Part of the public API (not test-only); needs the ``openpi`` extra.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..pi0.testing import write_char_tokenizer
from ._checkpoint import save_gr00t
from ._config import EagleSize, GR00TConfig
from ._model import GR00TModel
from ._policy import EMBODIMENT_IDS

__all__ = ["TINY_GR00T", "make_tiny_gr00t", "tiny_metadata"]

TINY_GR00T = GR00TConfig(
    eagle=EagleSize(
        vision_width=16,
        vision_mlp_dim=24,
        vision_layers=1,
        vision_heads=2,
        patch_size=8,
        image_size=32,
        text_width=32,
        text_mlp_dim=48,
        text_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        vocab_size=104,  # the character tokenizer's 103 ids, then the image placeholder
        image_token_index=103,
        max_position_embeddings=512,
    ),
    eagle_path="tiny-eagle",
    select_layer=2,
    action_horizon=8,
    action_dim=8,
    max_state_dim=8,
    hidden_size=24,
    input_embedding_dim=32,
    backbone_embedding_dim=32,
    dit_heads=4,
    dit_head_dim=8,
    dit_layers=2,
    dit_output_dim=24,
    vl_heads=4,
    vl_head_dim=8,
    vl_layers=1,
    num_target_vision_tokens=4,
    max_seq_len=16,
    max_num_embodiments=32,
    num_inference_timesteps=4,
    value_head_sizes=(16,),
)
"""The architecture :func:`make_tiny_gr00t` writes: Eagle with one SigLIP layer (32×32 images, 16 tokens each)
and 2 of 3 Qwen3 layers of width 32; a 2-block DiT of width 32 (one cross-attention, one self-attention block)."""


def tiny_metadata(
    state_dim: int, action_dim: int, *, seed: int = 0, tag: str = "new_embodiment"
) -> dict[str, Any]:
    """``experiment_cfg/metadata.json`` content: random per-dimension statistics under ``tag``."""
    generator = torch.Generator().manual_seed(seed)

    def entry(dim: int) -> dict[str, list[float]]:
        low = -1.0 - torch.rand(dim, generator=generator)
        high = 1.0 + torch.rand(dim, generator=generator)
        return {
            "min": low.tolist(),
            "max": high.tolist(),
            "mean": ((low + high) / 2).tolist(),
            "std": ((high - low) / 4).tolist(),
            "q01": (low * 0.9).tolist(),
            "q99": (high * 0.9).tolist(),
        }

    return {
        tag: {
            "statistics": {"state": {"state": entry(state_dim)}, "action": {"action": entry(action_dim)}},
            "modalities": {
                "state": {"state": {"shape": [state_dim], "absolute": True}},
                "action": {"action": {"shape": [action_dim], "absolute": False}},
            },
            "embodiment_tag": tag,
        }
    }


def make_tiny_gr00t(
    out: str | Path,
    *,
    state_dim: int = 8,
    action_dim: int = 7,
    seed: int = 0,
    config: GR00TConfig = TINY_GR00T,
) -> dict[str, Path]:
    """Write a tiny random GR00T N1.5 with its tokenizer and statistics under ``out``.

    The defaults fit LIBERO's ``rgb`` observations (8-D state, 7-D actions, two cameras).

    Returns:
        ``{"model_path": out/model, "tokenizer_path": out/tokenizer}`` (the statistics are the checkpoint's
        ``experiment_cfg/metadata.json``).
    """
    root = Path(out)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = GR00TModel(config, embodiment_id=EMBODIMENT_IDS["new_embodiment"])
    with torch.no_grad():  # give every tensor some spread
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    paths = {"model_path": root / "model", "tokenizer_path": root / "tokenizer"}
    # Two shards with an index, as the published checkpoint is stored.
    total = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    save_gr00t(
        model,
        paths["model_path"],
        metadata=tiny_metadata(state_dim, action_dim, seed=seed),
        max_shard_bytes=total // 2 + 1,
    )
    write_char_tokenizer(paths["tokenizer_path"])
    return paths
