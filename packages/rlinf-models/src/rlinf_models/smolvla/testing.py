"""A tiny, fully local SmolVLA model directory for tests, examples and CPU smoke runs.

:func:`make_tiny_smolvla` writes what ``actor.model.model_type: smolvla`` reads, in the real layouts:

- ``model/``: a randomly initialised tiny :class:`~rlinf_models.smolvla.SmolVLAModel` saved with
  :func:`~rlinf_models.smolvla.save_smolvla` (LeRobot's ``config.json`` + ``model.safetensors``, plus our value
  head);
- ``tokenizer/``: a character-level tokenizer (:func:`rlinf_models.pi0.testing.write_char_tokenizer`);
- ``norm_stats.safetensors``: LeRobot's normalizer file layout (``observation.state.mean`` / ``.std``,
  ``action.mean`` / ``.std``).

Nothing is downloaded. Part of the public API (not test-only); needs the ``openpi`` extra.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import save_file

from ..pi0.testing import write_char_tokenizer
from ._checkpoint import save_smolvla
from ._config import SmolVLAConfig, SmolVLMSize
from ._model import SmolVLAModel

__all__ = ["TINY_SMOLVLA", "make_tiny_smolvla"]

TINY_SMOLVLA = SmolVLAConfig(
    vlm=SmolVLMSize(
        text_width=32,
        text_mlp_dim=48,
        text_layers=4,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        vocab_size=103,  # the character tokenizer's: 3 specials + printable ASCII
        rms_norm_eps=1e-5,
        vision_width=16,
        vision_mlp_dim=24,
        vision_layers=1,
        vision_heads=2,
        patch_size=8,
        vision_image_size=32,
        scale_factor=2,
    ),
    vlm_model_name="tiny-smolvlm",
    num_vlm_layers=4,
    image_size=32,
    chunk_size=8,
    max_state_dim=8,
    max_action_dim=8,
    num_steps=4,
    tokenizer_max_length=48,
    value_head_sizes=(16,),
)
"""The architecture :func:`make_tiny_smolvla` writes: 4 VLM layers of width 32 (two of them cross-attention
layers of the expert), an expert of width 24, 32×32 images of 4 tokens each."""


def make_tiny_smolvla(
    out: str | Path,
    *,
    state_dim: int = 8,
    action_dim: int = 7,
    camera_names: tuple[str, ...] = ("rgb", "wrist_rgb"),
    seed: int = 0,
    config: SmolVLAConfig = TINY_SMOLVLA,
) -> dict[str, Path]:
    """Write a tiny random SmolVLA with its tokenizer and statistics under ``out``.

    The defaults fit LIBERO's ``rgb`` observations (8-D state, 7-D actions, two cameras).

    Returns:
        ``{"model_path": out/model, "tokenizer_path": out/tokenizer, "norm_stats_path":
        out/norm_stats.safetensors}``.
    """
    root = Path(out)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = SmolVLAModel(config)
    with torch.no_grad():  # give every tensor some spread
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    paths = {
        "model_path": root / "model",
        "tokenizer_path": root / "tokenizer",
        "norm_stats_path": root / "norm_stats.safetensors",
    }
    save_smolvla(
        model, paths["model_path"], state_dim=state_dim, action_dim=action_dim, camera_names=camera_names
    )
    write_char_tokenizer(paths["tokenizer_path"])
    stats = {}
    for feature, dim in (("observation.state", state_dim), ("action", action_dim)):
        stats[f"{feature}.mean"] = 0.1 * torch.randn(dim, generator=generator)
        stats[f"{feature}.std"] = 0.5 + torch.rand(dim, generator=generator)
    save_file(stats, str(paths["norm_stats_path"]))
    return paths
