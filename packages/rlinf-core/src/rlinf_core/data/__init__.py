"""Prompt datasets (JSONL / Parquet), prompt encoding and padded batches for reasoning RL and SFT."""

from ._config import DataConfig
from ._dataset import DatasetError, PromptDataset, PromptExample, PromptSampler, load_prompt_dataset
from ._encoding import (
    ChatPromptEncoder,
    ImagePromptEncoder,
    PromptEncoder,
    pack_images,
    pack_sequences,
    unpack_images,
)

__all__ = [
    "ChatPromptEncoder",
    "DataConfig",
    "DatasetError",
    "ImagePromptEncoder",
    "PromptDataset",
    "PromptEncoder",
    "PromptExample",
    "PromptSampler",
    "load_prompt_dataset",
    "pack_images",
    "pack_sequences",
    "unpack_images",
]
