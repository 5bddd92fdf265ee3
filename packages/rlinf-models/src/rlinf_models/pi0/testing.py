"""Tiny, fully local π0 / π0.5 model directories for tests, examples and CPU smoke runs.

:func:`make_tiny_pi0` writes what ``actor.model.model_type: pi0`` / ``pi05`` reads, in the real layouts:

- ``model/``: a randomly initialised tiny :class:`~rlinf_models.pi0.Pi0Model` saved with
  :func:`~rlinf_models.pi0.save_pi0` (LeRobot's ``config.json`` + ``model.safetensors``, plus our value head);
- ``tokenizer/``: a character-level ``tokenizers`` tokenizer (every printable ASCII character is a token, with
  ``<pad>``/``<bos>``/``<unk>``), so any instruction tokenises without a download;
- ``norm_stats.json``: openpi's statistics file (``state`` and ``actions``: mean, std, q01, q99).

Nothing is downloaded. Part of the public API (not test-only); needs the ``openpi`` extra.
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import attrs
import torch

try:
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        f'rlinf_models.pi0.testing needs transformers ({e}): pip install "rlinf-models[openpi]"'
    ) from e

from rlinf_core.protocols import EnvSpec, ObsSpec

from ._checkpoint import save_pi0
from ._config import GemmaSize, Pi0Config, SiglipSize
from ._model import Pi0Model

__all__ = ["LEROBOT_TINY_SPEC", "TINY_PI0", "lerobot_tiny_obs", "make_tiny_pi0", "write_char_tokenizer"]

_SPECIALS = ("<pad>", "<bos>", "<unk>")
_CHARS = tuple(dict.fromkeys(string.printable))  # printable ASCII, including space and newline

TINY_PI0 = Pi0Config(
    paligemma=GemmaSize(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=8),
    action_expert=GemmaSize(width=16, depth=2, mlp_dim=32, num_heads=4, num_kv_heads=1, head_dim=8),
    vision=SiglipSize(hidden_size=24, intermediate_size=40, num_layers=1, num_heads=2, patch_size=8),
    vocab_size=len(_SPECIALS) + len(_CHARS),
    image_size=32,
    chunk_size=8,
    max_state_dim=8,
    max_action_dim=8,
    num_inference_steps=4,
    tokenizer_max_length=48,
    value_head_sizes=(16,),
)
"""The architecture :func:`make_tiny_pi0` writes (π0; ``pi05=True`` for π0.5): a few thousand parameters."""


def write_char_tokenizer(path: str | Path, chars: str | None = None) -> Path:
    """Write a character-level PaliGemma-style tokenizer (adds ``<bos>``) to the directory ``path``.

    ``chars``: its characters (default: printable ASCII; others become ``<unk>``). The vocabulary is
    ``<pad>``, ``<bos>``, ``<unk>``, then the characters: ``3 + len(chars)`` ids.
    """
    alphabet = _CHARS if chars is None else tuple(dict.fromkeys(chars))
    vocab = {token: i for i, token in enumerate((*_SPECIALS, *alphabet))}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", pad_token="<pad>", unk_token="<unk>"
    )
    directory = Path(path)
    fast.save_pretrained(str(directory))
    return directory


def _stats(dim: int, generator: torch.Generator) -> dict[str, list[float]]:
    mean = 0.1 * torch.randn(dim, generator=generator)
    std = 0.5 + torch.rand(dim, generator=generator)
    return {
        "mean": mean.tolist(),
        "std": std.tolist(),
        "q01": (mean - 2 * std).tolist(),
        "q99": (mean + 2 * std).tolist(),
    }


def make_tiny_pi0(
    out: str | Path,
    *,
    pi05: bool = False,
    state_dim: int = 8,
    action_dim: int = 7,
    camera_names: tuple[str, ...] = ("rgb", "wrist_rgb"),
    seed: int = 0,
) -> dict[str, Path]:
    """Write a tiny random π0 (or π0.5) with its tokenizer and statistics under ``out``.

    The defaults fit LIBERO's ``rgb`` observations (8-D state, 7-D actions, two cameras).

    Returns:
        ``{"model_path": out/model, "tokenizer_path": out/tokenizer, "norm_stats_path": out/norm_stats.json}``.
    """
    root = Path(out)
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = Pi0Model(attrs.evolve(TINY_PI0, pi05=pi05))
    with torch.no_grad():  # Gemma's norms start at zero: give every tensor some spread
        for param in model.parameters():
            param.add_(0.05 * torch.randn(param.shape, generator=generator))
    paths = {
        "model_path": root / "model",
        "tokenizer_path": root / "tokenizer",
        "norm_stats_path": root / "norm_stats.json",
    }
    save_pi0(
        model, paths["model_path"], state_dim=state_dim, action_dim=action_dim, camera_names=camera_names
    )
    write_char_tokenizer(paths["tokenizer_path"])
    stats = {"state": _stats(state_dim, generator), "actions": _stats(action_dim, generator)}
    paths["norm_stats_path"].write_text(json.dumps({"norm_stats": stats}, indent=2) + "\n")
    return paths


LEROBOT_TINY_SPEC = EnvSpec(
    obs_shape=(),
    action_type="continuous",
    action_dim=7,
    action_low=(-1.0,) * 7,
    action_high=(1.0,) * 7,
    obs_dict={
        "base": ObsSpec((24, 24, 3), "uint8"),
        "wrist": ObsSpec((24, 24, 3), "uint8"),
        "state": ObsSpec((5,)),
        "task_index": ObsSpec((1,), "int16"),
    },
    task_descriptions=("pick up the red block", "put the bowl on the plate"),
)
"""An env that fits the tiny checkpoints LeRobot wrote for rlinf-models' tests (``tests/data/lerobot_pi0*_tiny``):
two cameras (``base``, ``wrist``), a 5-D state, 7-D actions, two instructions picked by ``task_index``."""


def lerobot_tiny_obs(n: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """``n`` random observations of :data:`LEROBOT_TINY_SPEC` (env ``i`` asks for instruction ``i % 2``)."""
    return {
        "base": torch.randint(0, 256, (n, 24, 24, 3), generator=generator, dtype=torch.uint8),
        "wrist": torch.randint(0, 256, (n, 24, 24, 3), generator=generator, dtype=torch.uint8),
        "state": torch.randn(n, 5, generator=generator),
        "task_index": torch.tensor([[i % 2] for i in range(n)], dtype=torch.int16),
    }
